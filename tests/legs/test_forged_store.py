"""A checkpoint store is untrusted input: forged and damaged contents, on the local and the Hub store.

Each case forges what someone with write access to the store (or a bad disk)
could leave there, then runs the reference trainer's resume and the host's load
check against it. What must hold: no code from the store runs, nothing is
written outside the checkpoint folder, no symlink is followed, a verified mark
that does not bind is not counted, and the leg resumes from the previous
verified checkpoint with a `resume_skip` event naming why.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import pytest

from runtime.reference import trainer
from runtime.store import CheckpointDamaged, Manifest, checkpoint_name, open_store
from runtime.store.base import canonical_json
from runtime.store.seal import KEY_ENV, make_seal

KEY = bytes(range(32))


class Payload:
    """Pickled, it runs a shell command when unpickled by a loader that allows code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def torch_bytes(obj) -> bytes:  # noqa: ANN001
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class Forger:
    """Writes files into a store's checkpoint folders the way an attacker with write access could."""

    def __init__(self, kind: str, tmp: Path, server=None) -> None:  # noqa: ANN001
        self.kind, self.tmp, self.server = kind, tmp, server
        self.uri = (tmp / "store").as_uri() if kind == "local" else "hf://tester/ckpts"

    def folder(self, name: str) -> Path:
        return self.tmp / "store" / "runs" / "t1" / name

    def write(self, name: str, files: dict[str, bytes]) -> None:
        if self.kind == "local":
            for rel, data in files.items():
                path = self.folder(name) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return
        from huggingface_hub import CommitOperationAdd, HfApi

        api = HfApi(endpoint=self.server.url, token="hf_good")
        ops = [CommitOperationAdd(f"runs/t1/{name}/{rel}", data) for rel, data in files.items()]
        api.create_commit("tester/ckpts", ops, commit_message=f"forge {name}")

    def read(self, name: str, rel: str) -> bytes:
        store = self.store()
        if self.kind == "local":
            return (self.folder(name) / rel).read_bytes()
        return store._get_small(store._path(name, rel), limit=1 << 30)  # noqa: SLF001 - test access

    def store(self):  # noqa: ANN201
        if self.kind == "local":
            return open_store(self.uri, "runs/t1", key=KEY)
        from tests.helpers import hub_store

        return hub_store(self.server, "runs/t1", repo="tester/ckpts", key=KEY)


def forged_checkpoint(
    step: int, files: dict[str, bytes], key: bytes | None = KEY, paths: dict[str, str] | None = None
) -> dict[str, bytes]:
    """A checkpoint folder's files: the payload, a manifest that matches it, and a
    verified mark sealed with `key` (the worst case: the forger holds the key)."""
    entries = [
        {"path": (paths or {}).get(rel, rel), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for rel, data in files.items()
    ]
    manifest_json = {"version": 1, "name": checkpoint_name(step), "step": step, "meta": {}, "files": entries}
    out = dict(files)
    out["manifest.json"] = json.dumps(manifest_json).encode()
    try:
        manifest = Manifest.from_json(manifest_json)
    except CheckpointDamaged:
        return out  # a manifest no reader accepts: no mark can bind it
    windows = [(e.path, 0, e.size, e.sha256) for e in manifest.files if e.size]
    out["verified.json"] = json.dumps(make_seal(manifest, windows, manifest.total_bytes, key)).encode()
    return out


@pytest.fixture(params=["local", "hub"])
def forger(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Forger:
    monkeypatch.setenv(KEY_ENV, KEY.hex())
    monkeypatch.setenv("LAUNCHER_RUN_ID", "t1")
    if request.param == "hub":
        server = request.getfixturevalue("hub_server")
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", "hf_good")
        return Forger("hub", tmp_path, server)
    return Forger("local", tmp_path)


def leg(forger: Forger, work: str, max_steps: int, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, list]:  # noqa: ANN001
    monkeypatch.setenv("LAUNCHER_STORE", forger.uri)
    monkeypatch.setenv("LAUNCHER_MAX_STEPS", str(max_steps))
    code = trainer.main(["--workdir", str(forger.tmp / work), "--ckpt-every", "4", "--data-tokens", "20000"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"event"')]
    return code, events


def resumed_from(events: list[dict]) -> int | None:
    resume = next((e for e in events if e["event"] == "resume"), None)
    return resume["from_step"] if resume else None


def skips(events: list[dict]) -> dict[str, str]:
    return {e["name"]: e["reason"] for e in events if e["event"] == "resume_skip"}


def test_a_pickle_payload_never_runs_in_the_leg_or_on_the_host(forger: Forger, monkeypatch, capsys) -> None:  # noqa: ANN001
    from runtime.programs.loadcheck import check

    marker = forger.tmp / "PWNED"
    assert leg(forger, "a", 8, monkeypatch, capsys)[0] == 0
    # Sealed with the project's key: the worst case, every binding holds and only the bytes are evil.
    forger.write(checkpoint_name(12), forged_checkpoint(12, {"state.pt": torch_bytes({"step": Payload(marker)})}))
    assert [c.step for c in forger.store().list() if c.verified] == [4, 8, 12]

    host = check(forger.uri, "runs/t1", checkpoint_name(12))  # what `launcher stop` runs on the host
    assert not host["ok"] and "CheckpointDamaged" in host["error"] and "not a plain tensor state" in host["error"]
    code, events = leg(forger, "b", 16, monkeypatch, capsys)
    assert not marker.exists()  # no code from the store ran, anywhere
    assert code == 0 and resumed_from(events) == 8
    assert "not a plain tensor state" in skips(events)[checkpoint_name(12)]


def test_a_manifest_path_outside_the_folder_is_never_fetched_or_written(forger: Forger, monkeypatch, capsys) -> None:  # noqa: ANN001
    leg(forger, "a", 8, monkeypatch, capsys)
    good = forger.read(checkpoint_name(8), "state.pt")
    forger.write(
        checkpoint_name(12),
        forged_checkpoint(12, {"state.pt": good, "x.txt": b"escaped"}, paths={"x.txt": "../../../ESCAPED.txt"}),
    )
    store = forger.store()
    scan = store.scan()
    assert [d.name for d in scan.damaged] == [checkpoint_name(12)] and "not a plain relative path" in scan.damaged[
        0
    ].reason
    with pytest.raises(CheckpointDamaged):
        store.fetch(checkpoint_name(12), forger.tmp / "restore")
    code, events = leg(forger, "b", 16, monkeypatch, capsys)
    assert code == 0 and resumed_from(events) == 8 and checkpoint_name(12) in skips(events)
    assert not list(forger.tmp.parent.rglob("ESCAPED.txt"))  # nothing written outside any checkpoint folder


def test_a_mark_that_does_not_bind_is_not_counted(forger: Forger, monkeypatch, capsys) -> None:  # noqa: ANN001
    leg(forger, "a", 8, monkeypatch, capsys)
    good = forger.read(checkpoint_name(8), "state.pt")
    forged = forged_checkpoint(12, {"state.pt": good}, key=bytes(32))  # sealed with some other key
    forger.write(checkpoint_name(12), forged)
    unsealed = forged_checkpoint(16, {"state.pt": good}, key=None)  # binds, but carries no MAC at all
    forger.write(checkpoint_name(16), unsealed)
    no_readback = forged_checkpoint(20, {"state.pt": good})
    no_readback["verified.json"] = json.dumps({"windows": 3, "bytes_read": 9000}).encode()  # the old format
    forger.write(checkpoint_name(20), no_readback)
    copied = forged_checkpoint(24, {"state.pt": good})
    copied["verified.json"] = forger.read(checkpoint_name(8), "verified.json")  # a real mark, of another checkpoint
    forger.write(checkpoint_name(24), copied)

    scan = forger.store().scan()
    assert [(c.step, c.verified) for c in scan.checkpoints] == [
        (4, True),
        (8, True),
        (12, False),
        (16, False),
        (20, False),
        (24, False),
    ]
    reasons = {d.step: d.reason for d in scan.damaged}
    assert "not sealed with this project's key" in reasons[12] and "not sealed" in reasons[16]
    assert "no read-back recorded" in reasons[20] and "not written for this manifest" in reasons[24]
    code, events = leg(forger, "b", 12, monkeypatch, capsys)
    assert code == 0 and resumed_from(events) == 8


def test_the_newest_checkpoint_damaged_falls_back_to_the_previous_verified(forger: Forger, monkeypatch, capsys) -> None:  # noqa: ANN001
    leg(forger, "a", 8, monkeypatch, capsys)
    name = checkpoint_name(8)
    data = bytearray(forger.read(name, "state.pt"))
    data[len(data) // 2] ^= 0x01  # one flipped byte in the newest verified checkpoint
    forger.write(name, {"state.pt": bytes(data)})
    forger.write(checkpoint_name(12), {"manifest.json": b"{not json", "state.pt": b"x"})  # newer, unparseable
    code, events = leg(forger, "b", 12, monkeypatch, capsys)
    assert code == 0 and resumed_from(events) == 4
    why = skips(events)
    assert "does not match its manifest" in why[name] and "not JSON" in why[checkpoint_name(12)]
    assert events[-1]["event"] == "done" and events[-1]["final_checkpoint_verified"]
    # The leg replaced both on its way past them: the store is whole again.
    scan = forger.store().scan()
    assert not scan.damaged and [c.step for c in scan.checkpoints if c.verified] == [8, 12]


def test_symlinks_devices_and_oversized_files_are_never_followed(tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    forger = Forger("local", tmp_path)
    monkeypatch.setenv(KEY_ENV, KEY.hex())
    monkeypatch.setenv("LAUNCHER_RUN_ID", "t1")
    leg(forger, "a", 8, monkeypatch, capsys)
    secret = tmp_path / "outside.txt"
    secret.write_bytes(b"the host's private bytes")
    store = forger.store()
    cases = {
        12: ("/dev/zero", 1 << 30),  # a disk fill: 33 GB in 60 s before
        16: (str(secret), secret.stat().st_size),  # a file outside the store, with its true size and hash
    }
    for step, (target, size) in cases.items():
        files = forged_checkpoint(step, {"state.pt": b"\0" * 8})
        manifest = json.loads(files["manifest.json"])
        manifest["files"][0].update(
            size=size,
            sha256=hashlib.sha256(Path(target).read_bytes()[:size]).hexdigest() if size < 1 << 20 else "0" * 64,
        )
        files["manifest.json"] = canonical_json(manifest)
        m = Manifest.from_json(manifest)
        files["verified.json"] = json.dumps(
            make_seal(m, [("state.pt", 0, 8, hashlib.sha256(b"\0" * 8).hexdigest())], 8, KEY)
        ).encode()
        del files["state.pt"]
        forger.write(checkpoint_name(step), files)
        os.symlink(target, forger.folder(checkpoint_name(step)) / "state.pt")
    os.symlink(forger.folder(checkpoint_name(8)), forger.folder(checkpoint_name(20)))  # a whole folder as a link
    began = time.monotonic()
    for step in (12, 16):
        with pytest.raises(CheckpointDamaged, match="symlink"):
            store.fetch(checkpoint_name(step), tmp_path / f"restore-{step}")
        assert store.remote_files(checkpoint_name(step), ["state.pt"]) == {}  # not a stored file
    assert time.monotonic() - began < 5
    assert {d.step: d.reason for d in store.scan().damaged}[20] == "the checkpoint folder is a symlink or a file"
    code, events = leg(forger, "b", 12, monkeypatch, capsys)
    assert code == 0 and resumed_from(events) == 8
    assert "symlink" in skips(events)[checkpoint_name(16)] and checkpoint_name(20) in skips(events)
    assert secret.read_bytes() == b"the host's private bytes"
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()) < 50 << 20


def test_a_fifo_in_a_checkpoint_does_not_hang_the_reader(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri(), "runs/t1", key=KEY)
    files = forged_checkpoint(4, {"state.pt": b"abc"})
    del files["state.pt"]
    folder = tmp_path / "store" / "runs" / "t1" / checkpoint_name(4)
    folder.mkdir(parents=True)
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    os.mkfifo(folder / "state.pt")
    with pytest.raises(CheckpointDamaged, match="not a regular file"):
        store.fetch(checkpoint_name(4), tmp_path / "restore")


def test_a_verified_mark_that_is_a_link_does_not_count(tmp_path: Path) -> None:
    from tests.unit.test_store import make_checkpoint, mark_verified

    store = open_store((tmp_path / "store").as_uri(), "runs/t1", key=KEY)
    folder, manifest = make_checkpoint(tmp_path / "local", 4)
    store.push(folder, manifest)
    mark_verified(store, manifest, folder)
    mark = store.dir / manifest.name / "verified.json"
    mark.rename(tmp_path / "elsewhere.json")
    mark.symlink_to(tmp_path / "elsewhere.json")  # the real mark, reached through a link: never followed
    scan = store.scan()
    assert [(c.name, c.verified) for c in scan.checkpoints] == [(manifest.name, False)]
    assert scan.damaged[0].reason.startswith("not counted as verified: verified.json:")
    assert "symlink" in scan.damaged[0].reason

"""The Hub's limits (issue 31, item 2): files above `max_file_bytes` go in parts, no commit holds
more than `files_per_commit` files, no more than `commits_per_hour` commits -- against a loopback
Hub that is no more lenient than the real one (tests/fakes/hub_server.py enforces each limit), and
launcher.yaml `hub:` values past the Hub's own refused with exit 2 and one line."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from runtime import contract
from runtime.checkpoint.cycle import Pusher, run_cycle
from runtime.checkpoint.verify import verify_checkpoint
from runtime.store import CheckpointDamaged, StoreError, TransientStoreError, open_store
from runtime.store.base import FileEntry, Manifest, checkpoint_name, newest_verified
from runtime.store.hub_limits import CommitBudget, CommitBudgetExceeded, HubLimits, limits_from_env
from runtime.store.hub_parts import PARTS_INDEX, batches
from tests.helpers import assert_one_line_error, edit_config, hub_store, run_cli, run_rows

PART = 64 << 10
BIG = 200_000  # four parts of 64 KiB: 65536 * 3 + 3392


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def small_hub(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A loopback Hub that refuses files above 64 KiB and counts commits on a clock the test moves."""
    from huggingface_hub import constants

    from tests.fakes.hub_server import HubServer

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with HubServer(token="hf_good", max_file_bytes=PART, clock=Clock()) as server:
        yield server


def limited(server, *, max_file_bytes: int = PART, per_hour: int = 128, clock: Clock | None = None):  # noqa: ANN001, ANN201
    store = hub_store(server)
    store.max_file_bytes = max_file_bytes
    store.budget = CommitBudget(per_hour, clock or Clock())
    return store


def big_checkpoint(root: Path, step: int) -> tuple[Path, Manifest]:
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(os.urandom(BIG))
    (folder / "meta.json").write_bytes(b'{"small": true}')
    files = tuple(
        FileEntry(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    )
    return folder, Manifest(checkpoint_name(step), step, files)


def head(server, repo: str = "tester/ckpts") -> dict:  # noqa: ANN001
    r = server.repos[repo]
    return r.commits[r.branches["main"]].files


def test_a_file_above_the_limit_is_refused_whole_and_stored_in_parts(small_hub, tmp_path: Path) -> None:  # noqa: ANN001
    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    data = (folder / "state.pt").read_bytes()
    with pytest.raises(StoreError, match="413"):  # the server is no more lenient than the Hub
        limited(small_hub, max_file_bytes=10**9).push(folder, manifest)

    store = limited(small_hub)
    store.push(folder, manifest)
    files = head(small_hub)
    prefix = "runs/r1/step-00000010/"
    parts = sorted(p for p in files if p.startswith(prefix + "state.pt"))
    assert parts == [f"{prefix}state.pt.part{i:05d}" for i in range(4)]
    assert [files[p].size for p in parts] == [PART, PART, PART, BIG - 3 * PART]
    assert json.loads(files[prefix + PARTS_INDEX].data) == {"part_bytes": PART, "files": {"state.pt": 4}}
    assert small_hub.commit_sizes[-1] == ("checkpoint step-00000010", 7)  # parts, meta, index, manifest: one commit

    assert store.remote_files(manifest.name, ["state.pt"])["state.pt"].size == BIG
    for start, length in [(PART - 100, 300), (60_000, 80_000), (0, BIG), (BIG - 5, 5)]:  # across part boundaries
        assert store.read_range(manifest.name, "state.pt", start, length) == data[start : start + length]
    result = verify_checkpoint(store, manifest, folder)
    assert result.ok, result.failures

    fresh = hub_store(small_hub)  # another process: reads the index from the store
    fetched = fresh.fetch(manifest.name, tmp_path / "fetched")
    assert (fetched / "state.pt").read_bytes() == data
    assert sorted(p.name for p in fetched.iterdir()) == ["manifest.json", "meta.json", "state.pt"]


def test_the_cycle_and_the_launchers_readback_across_parts(small_hub, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import launcher.checks.readback as readback

    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    assert run_cycle(store, folder, manifest, keep=2).verified
    launcher_store = hub_store(small_hub)
    ok, detail, nbytes = readback.read_checkpoint(launcher_store, 10)
    assert ok and "fetched whole" in detail, detail
    monkeypatch.setattr(readback, "FULL_READ_BYTES", 0)  # as for a checkpoint above 256 MiB: the recorded windows
    ok, detail, nbytes = readback.read_checkpoint(launcher_store, 10)
    assert ok and "recorded windows re-read" in detail and nbytes >= BIG, detail


def test_a_nodes_part_is_split_too_and_the_index_comes_with_the_manifest(small_hub, tmp_path: Path) -> None:  # noqa: ANN001
    """Several nodes (runtime.checkpoint.node_cycle): each pushes its own files, then one commits the manifest."""
    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    store.push_part(folder, manifest.name, ["state.pt"])
    store.push_part(folder, manifest.name, ["meta.json"])
    assert store.list() == []  # no manifest yet
    store.commit(manifest)
    assert small_hub.commit_sizes[-1] == ("checkpoint step-00000010", 2)  # the index and the manifest
    assert verify_checkpoint(store, manifest, folder).ok
    fetched = hub_store(small_hub).fetch(manifest.name, tmp_path / "fetched")
    assert (fetched / "state.pt").read_bytes() == (folder / "state.pt").read_bytes()


def test_a_checkpoint_the_parts_layout_cannot_hold_is_refused_before_any_commit(small_hub, tmp_path: Path) -> None:  # noqa: ANN001
    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    (folder / PARTS_INDEX).write_bytes(b"{}")  # the trainer's own file of that name
    own = FileEntry(PARTS_INDEX, 2, hashlib.sha256(b"{}").hexdigest())
    reserved = Manifest(manifest.name, 10, manifest.files + (own,))
    with pytest.raises(StoreError, match="reserved name"):
        limited(small_hub, max_file_bytes=10**9).push(folder, reserved)
    with pytest.raises(StoreError, match=r"would take 200000 parts of 1 bytes \(at most 10000\)"):
        limited(small_hub, max_file_bytes=1).push(folder, manifest)
    assert small_hub.commit_sizes == []


def test_a_flipped_byte_in_one_part_fails_verify_and_fetch(small_hub, tmp_path: Path) -> None:  # noqa: ANN001
    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    store.push(folder, manifest)
    entry = head(small_hub)["runs/r1/step-00000010/state.pt.part00002"]
    stored = bytearray(small_hub.objects[entry.sha256])
    stored[123] ^= 0xFF
    small_hub.objects[entry.sha256] = bytes(stored)
    result = verify_checkpoint(store, manifest, folder)
    assert not result.ok and any(f.startswith("state.pt[") and "bytes differ" in f for f in result.failures)
    with pytest.raises(CheckpointDamaged, match="state.pt does not match its manifest's sha256"):
        hub_store(small_hub).fetch(manifest.name, tmp_path / "fetched")


def test_a_missing_or_short_part_reports_a_size_no_manifest_matches(small_hub, tmp_path: Path) -> None:  # noqa: ANN001
    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    store.push(folder, manifest)
    prefix = "runs/r1/step-00000010/state.pt"
    store.api.create_commit("tester/ckpts", [_add(f"{prefix}.part00001", b"short")], commit_message="forge")
    assert store.remote_files(manifest.name, ["state.pt"])["state.pt"].size == -1
    assert not verify_checkpoint(store, manifest, folder).ok
    from huggingface_hub import CommitOperationDelete

    store.api.create_commit("tester/ckpts", [CommitOperationDelete(f"{prefix}.part00003")], commit_message="forge")
    assert "state.pt" not in store.remote_files(manifest.name, ["state.pt"])


def _add(path: str, data: bytes):  # noqa: ANN202
    from huggingface_hub import CommitOperationAdd

    return CommitOperationAdd(path, data)


FORGED = [
    ("wrong count", {"part_bytes": PART, "files": {"state.pt": 3}}, "in 3 parts of 65536 bytes"),
    ("count not an int", {"part_bytes": PART, "files": {"state.pt": "4"}}, "parts (a whole number"),
    ("part size not an int", {"part_bytes": 65536.0, "files": {"state.pt": 4}}, "part_bytes"),
    ("huge count", {"part_bytes": 1, "files": {"state.pt": 10**12}}, "parts (a whole number"),
    ("a file not in the manifest", {"part_bytes": PART, "files": {"other.pt": 2}}, "does not list"),
    ("a path out of the folder", {"part_bytes": PART, "files": {"../x": 2}}, "not a plain relative path"),
    ("extra keys", {"part_bytes": PART, "files": {"state.pt": 4}, "parts": ["/etc/passwd"]}, "not an object"),
    ("huge", " " * (2 << 20), "larger than"),
]


@pytest.mark.parametrize("label, forged, needle", FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_parts_index_is_refused(small_hub, tmp_path: Path, label: str, forged, needle: str) -> None:  # noqa: ANN001
    import launcher.checks.readback as readback

    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    assert run_cycle(store, folder, manifest, keep=2).verified
    raw = forged.encode() if isinstance(forged, str) else json.dumps(forged).encode()
    small_hub.max_file_bytes = 50 * 10**9  # a forger writes what it likes
    store.api.create_commit("tester/ckpts", [_add(f"runs/r1/step-00000010/{PARTS_INDEX}", raw)], commit_message="forge")
    reader = hub_store(small_hub)
    with pytest.raises(CheckpointDamaged, match=needle.replace("(", r"\(")):
        reader.fetch(manifest.name, tmp_path / "fetched")
    ok, detail, _ = readback.read_checkpoint(hub_store(small_hub), 10)
    assert not ok and "CheckpointDamaged" in detail, detail


def test_no_commit_holds_more_files_than_the_hub_takes(hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    folder = tmp_path / checkpoint_name(3)
    folder.mkdir()
    for i in range(150):
        (folder / f"shard_{i:03d}.bin").write_bytes(bytes([i]) * 100)
    files = tuple(FileEntry(p.name, 100, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.iterdir()))
    manifest = Manifest(checkpoint_name(3), 3, files)
    unbatched = hub_store(hub_server)
    unbatched.files_per_commit = 200
    with pytest.raises(StoreError, match="422"):
        unbatched.push(folder, manifest)
    store = hub_store(hub_server)  # files_per_commit: the Hub's 100
    store.push(folder, manifest)
    assert [n for t, n in hub_server.commit_sizes if t.startswith("checkpoint")] == [100, 51]
    assert verify_checkpoint(store, manifest, folder).ok


def test_the_parts_count_toward_files_per_commit_and_the_index_comes_with_the_manifest(
    small_hub, tmp_path: Path
) -> None:  # noqa: ANN001
    items = [f"f{i}" for i in range(5)]
    assert batches(items, ["index", "manifest"], 3) == [["f0", "f1", "f2"], ["f3", "f4"], ["index", "manifest"]]
    assert batches(items[:1], ["index", "manifest"], 2) == [["f0"], ["index", "manifest"]]
    assert batches(items[:4], ["manifest"], 2) == [["f0", "f1"], ["f2", "f3"], ["manifest"]]

    folder, manifest = big_checkpoint(tmp_path / "a", 10)
    store = limited(small_hub)
    store.files_per_commit = 3
    store.push(folder, manifest)  # 4 parts + meta.json + index + manifest
    assert [n for _, n in small_hub.commit_sizes] == [3, 2, 2]
    last = small_hub.repos["tester/ckpts"]
    order = list(last.commits.values())
    added_last = set(order[-1].files) - set(order[-2].files)
    assert added_last == {f"runs/r1/step-00000010/{n}" for n in (PARTS_INDEX, "manifest.json")}
    assert verify_checkpoint(store, manifest, folder).ok


def test_a_push_past_the_commit_budget_is_refused_up_front(small_hub, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """5 commits an hour: step 1 takes 2 (push, mark), step 2 takes 3 (push, mark, prune's delete of
    step 1); step 3 needs 3 and none are left: refused before its first commit, step 2 stays the
    newest verified, and the server (which would answer a 6th commit with 429) saw 5."""
    small_hub.max_commits_per_hour, small_hub.max_file_bytes = 5, 50 * 10**9
    clock = Clock()
    store = limited(small_hub, per_hour=5, clock=clock)
    for step in (1, 2):
        folder, manifest = big_checkpoint(tmp_path / str(step), step)
        assert run_cycle(store, folder, manifest, keep=1).verified
    assert len(small_hub.commit_sizes) == 5
    folder, manifest = big_checkpoint(tmp_path / "3", 3)
    with pytest.raises(CommitBudgetExceeded, match=r"needs 3 commit\(s\), but only 0 of hub.commits_per_hour=5"):
        store.push(folder, manifest)
    pusher = Pusher(store, keep=1)
    pusher.submit(folder, manifest)
    pusher.drain()
    failed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"push_failed"' in line]
    assert len(failed) == 1 and failed[0]["step"] == 3 and "CommitBudgetExceeded" in failed[0]["error"]
    assert len(small_hub.commit_sizes) == 5 and folder.exists()
    assert newest_verified(store).step == 2

    clock.now += 3600  # an hour on, for both the store and the server
    small_hub.clock.now += 3600
    assert run_cycle(store, folder, manifest, keep=1).verified
    assert newest_verified(store).step == 3


def test_the_server_answers_commits_past_its_hourly_limit_with_429(hub_server) -> None:  # noqa: ANN001
    hub_server.max_commits_per_hour = 3
    store = hub_store(hub_server)
    store.api.create_repo("tester/ckpts")
    for i in range(3):
        store.api.create_commit("tester/ckpts", [_add(f"f{i}", b"x")], commit_message=f"c{i}")
    with pytest.raises(TransientStoreError, match="429"):
        store.mark_verified(checkpoint_name(1), {"x": 1})  # retried, then given up
    assert len(hub_server.commit_sizes) == 3


def test_limits_reach_the_store_from_the_leg_env(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    env = {
        contract.HUB_MAX_FILE_BYTES: "65536",
        contract.HUB_FILES_PER_COMMIT: "7",
        contract.HUB_COMMITS_PER_HOUR: "20",
    }
    assert limits_from_env(env) == HubLimits(65536, 7, 20)
    assert limits_from_env({}) == HubLimits()
    bad = {
        contract.HUB_MAX_FILE_BYTES: "19e9",
        contract.HUB_FILES_PER_COMMIT: "500",
        contract.HUB_COMMITS_PER_HOUR: "9" * 5000,
    }
    assert limits_from_env(bad) == HubLimits()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all("is not a whole number from" in line and "using" in line for line in lines)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = open_store("hf://tester/ckpts", "runs/r1", key=None)
    assert (store.max_file_bytes, store.files_per_commit, store.budget.per_hour) == (65536, 7, 20)


def test_an_hf_stores_legs_get_the_hub_limits(project: Path) -> None:
    from launcher.config.load import load_config
    from launcher.leg_env import leg_env

    edit_config(project, store="hf://tester/ckpts", hub={"max_file_gb": 0.5, "commits_per_hour": 60})
    cfg = load_config(project / "launcher.yaml")
    env = leg_env(cfg, "smoke", "r", 0, "hf://tester/ckpts", 10, 1e9, {}, None)
    assert env[contract.HUB_MAX_FILE_BYTES] == "500000000" and env[contract.HUB_COMMITS_PER_HOUR] == "60"
    assert env[contract.HUB_FILES_PER_COMMIT] == "100"
    local = leg_env(cfg, "smoke", "r", 0, "file:///s", 10, 1e9, {}, None)
    assert not any(k.startswith("LAUNCHER_HUB_") for k in local)


BAD_HUB = [
    ("max_file_gb", 60, ["60", "50 GB"]),
    ("max_file_gb", 0, ["0", "50 GB"]),
    ("files_per_commit", 150, ["150", "100 files per commit"]),
    ("files_per_commit", 1, ["1", "below 2"]),
    ("commits_per_hour", 200, ["200", "128 commits per hour"]),
    ("commits_per_hour", 0, ["0", "below 3"]),
]


@pytest.mark.parametrize("key, value, needles", BAD_HUB, ids=[f"{k}={v}" for k, v, _ in BAD_HUB])
def test_bad_hub_limits_exit_2_with_one_line_naming_both_numbers(
    project: Path, key: str, value: int, needles: list[str]
) -> None:
    edit_config(project, hub={key: value})
    res = run_cli(["up", "static"], cwd=project)
    assert_one_line_error(res, 2, f"hub.{key}", *needles)
    assert run_rows(project) == 0

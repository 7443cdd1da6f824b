"""Sharded state through torch.distributed.checkpoint (runtime.checkpoint.dcp): an FSDP2 model on two
gloo ranks saves through DCP, every rank its part, through the storage cycle; a leg on a fresh
disk resumes it exactly; a forged index runs no code; a manifest that leaves out a rank's files
never verifies; another number of ranks is refused naming both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "tests" / "assets" / "fsdp" / "train.py"


def leg(
    tmp_path: Path, name: str, max_steps: int, ranks: int = 2, run_id: str = "fsdp", **extra_env: str
) -> tuple[int, list[dict]]:
    work = tmp_path / name
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "LAUNCHER_RUN_ID": run_id,
        "LAUNCHER_STORE": (tmp_path / "store").as_uri(),
        "LAUNCHER_MAX_STEPS": str(max_steps),
        **extra_env,
    }
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", f"--nproc_per_node={ranks}", str(TRAINER)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    events = [json.loads(line[line.find('{"event": ') :]) for line in proc.stdout.splitlines() if '{"event": ' in line]
    return proc.returncode, events


def of(events: list[dict], name: str, rank: int = 0) -> list[dict]:
    return [e for e in events if e["event"] == name and e.get("rank", 0) == rank]


def test_a_sharded_state_resumes_on_a_fresh_disk_exactly_as_the_straight_run(tmp_path: Path) -> None:
    code, first = leg(tmp_path, "leg0", 6)
    assert code == 0, first[-3:]
    pushes = of(first, "push")
    assert [p["step"] for p in pushes] == [3, 6] and all(v["ok"] for v in of(first, "verify"))
    stored = json.loads((tmp_path / "store" / "runs" / "fsdp" / "step-00000006" / "manifest.json").read_text())
    assert sorted(f["path"] for f in stored["files"]) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "rank-00000.pt",
        "rank-00001.pt",
    ]
    assert stored["meta"]["format"] == "dcp" and stored["meta"]["world_size"] == 2
    code, second = leg(tmp_path, "leg1", 10)
    assert code == 0, second[-3:]
    resumed = of(second, "resume")[0]
    assert resumed["from_step"] == 6 and resumed["sharded"] == "dcp" and resumed["world_size_saved"] == 2
    code, straight = leg(tmp_path, "straight", 10, run_id="fsdp-straight")
    assert code == 0, straight[-3:]
    for rank in (0, 1):  # every rank's losses and batches after the resume are the straight run's, bit for bit
        after = {e["step"]: (e["loss_local"], e["batch_hash"]) for e in of(second, "step", rank)}
        assert after == {
            e["step"]: (e["loss_local"], e["batch_hash"]) for e in of(straight, "step", rank) if e["step"] > 6
        }
    # the state as loaded is the state saved at step 6 (the model, AdamW's moments, the schedule)
    saved6 = next(e["digests"] for e in of(first, "state_digest") if e["step"] == 6)
    assert {k: resumed["digests"][k] for k in ("model", "optimizer", "scheduler")} == {
        k: saved6[k] for k in ("model", "optimizer", "scheduler")
    }
    digests = {e["step"]: e["digests"] for e in of(second, "state_digest")}
    assert digests == {e["step"]: e["digests"] for e in of(straight, "state_digest") if e["step"] > 6}
    # the launcher's read of the store, in one process, digests the whole state as the session did
    from runtime.programs.loadcheck import read
    from runtime.store import open_store

    answer, state = read(open_store((tmp_path / "store").as_uri(), "runs/fsdp"), "step-00000010")
    assert answer["ok"] and answer["step"] == 10, answer
    from runtime.session.step_evidence import state_digests

    assert state_digests(state, sorted(state)) == digests[10]
    # another number of ranks: refused, naming both (the rank exits 3; torchrun says 1 for any failure)
    code, one = leg(tmp_path, "one-rank", 12, ranks=1)
    stop = of(one, "stop")[0]
    assert (
        code != 0
        and stop["reason"] == "world_size_changed"
        and "saved by 2 ranks" in stop["error"]
        and "has 1" in stop["error"]
    ), stop


def test_a_manifest_that_leaves_out_a_ranks_shard_never_verifies(tmp_path: Path) -> None:
    """The index names every rank's shard file; a manifest without one (a rank's shard left out)
    is refused by the verify, the checkpoint never counts, and a resume never loads it."""
    from runtime.checkpoint.cycle import run_cycle
    from runtime.checkpoint.disk import write_manifest
    from runtime.store import open_store

    code, first = leg(tmp_path, "leg0", 3)
    assert code == 0, first[-3:]
    good = tmp_path / "store" / "runs" / "fsdp" / "step-00000003"
    bad = tmp_path / "local" / "step-00000004"
    shutil.copytree(good, bad)
    for extra in ("manifest.json", "verified.json", "__1_0.distcp"):
        (bad / extra).unlink()
    manifest = write_manifest(bad, 4, {"format": "dcp", "world_size": 2})
    store = open_store((tmp_path / "store").as_uri(), "runs/fsdp")
    result = run_cycle(store, bad, manifest)
    assert not result.verified
    assert not {c.name: c for c in store.list()}["step-00000004"].verified
    assert bad.is_dir()  # the only copy is kept


def test_a_flipped_byte_in_one_ranks_shard_is_refused_and_the_next_leg_resumes_the_previous(
    tmp_path: Path, hub_server, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """On the Hub store: the read-back of step 6 gets rank 1's shard with one byte flipped (the
    loopback server's fault, every time it is read). Verify refuses it, the checkpoint is never
    sealed, the leg says its final checkpoint did not verify, and the next leg, on a fresh disk,
    resumes from step 3, the previous verified one."""
    hub = {
        "LAUNCHER_STORE": "hf://tester/fsdp",
        "HF_ENDPOINT": hub_server.url,
        "HF_TOKEN": "hf_good",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    hub_server.inject("flip_byte", times=1000, path="runs/fsdp/step-00000006/__1_0.distcp")
    code, first = leg(tmp_path, "leg0", 6, **hub)
    verify = {e["step"]: e for e in of(first, "verify")}
    assert verify[3]["ok"] and not verify[6]["ok"], verify
    assert any(f.startswith("__1_0.distcp[") and "differ" in f for f in verify[6]["failures"]), verify[6]
    assert of(first, "done")[0]["final_checkpoint_verified"] is False
    hub_server.reset_faults()
    code, second = leg(tmp_path, "leg1", 9, **hub)
    assert code == 0, second[-3:]
    resumed = of(second, "resume")[0]
    assert resumed["from_step"] == 3, resumed
    assert of(second, "done")[0]["final_checkpoint_verified"] is True
    from runtime.store import open_store

    store = open_store("hf://tester/fsdp", "runs/fsdp")  # the loopback server, through HF_ENDPOINT
    assert [(c.step, c.verified) for c in store.list()] == [(6, True), (9, True)]  # step 6 pushed again, whole

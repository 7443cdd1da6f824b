"""The Hugging Face Trainer example on several ranks, launched as its users launch it: under
`torchrun --nproc_per_node 2` (one node, one disk, with two loader workers a rank), and on two
nodes of one rank each (`--nodes 2`: each node an empty folder of its own, only the store
shared). Each climbs static -> rehearsal -> `drill cold-resume --kills 2 --at mid-push` ->
report, every rank's `step` events read by the launcher's per-rank checks (docs/notes-multirank.md:
before, only rank 0 printed, ranks resumed at different steps from one shared `./restore`, every
CPU resume died loading optimizer.pt, two nodes pushed rank 0's RNG file only)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, edit_config, failed, leg_events, run_cli
from tests.legs.test_examples import copy_example, drill_and_report, hf_python


def every_rank_stepped_and_resumed_together(root: Path, run_id: str) -> None:
    """Each leg: both ranks printed `step` events for the same steps, and resumed from one step."""
    legs = run_cli(["ledger", run_id, "--json"], cwd=root).json()[0]["legs"]
    for leg in legs:
        events = leg_events(leg)
        steps = {r: sorted(e["step"] for e in events if e["event"] == "step" and e["rank"] == r) for r in (0, 1)}
        assert steps[0] and steps[0] == steps[1], (leg["leg"], steps)
        resumed = {(e["rank"], e["from_step"]) for e in events if e["event"] == "resume"}
        assert len({step for _, step in resumed}) <= 1 and len(resumed) in (0, 2), (leg["leg"], resumed)


def newest_drill_manifest(root: Path) -> dict:
    """The manifest of the drill's newest checkpoint in the local store."""
    stored = sorted((root / ".launcher" / "store" / "runs").glob("*drill*/step-*/manifest.json"))
    return json.loads(stored[-1].read_text())


def climb(root: Path, nodes: list[str]) -> float:
    """static -> rehearsal -> drill -> report; the seconds it took."""
    began = time.monotonic()
    assert run_cli(["up", "static", "--json"], cwd=root).code == 0
    rehearsal = run_cli(["up", "rehearsal", *nodes, "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    for kind in (Kind.RANK_DATA, Kind.RANK_SAMPLES, Kind.RANK_STATE):  # every rank proved, not rank 0
        assert check(rehearsal, kind, ok=True)["facts"]["ranks"] == 2
    every_rank_stepped_and_resumed_together(root, rehearsal.json()["run_id"])
    drill = drill_and_report(root, nodes)
    for leg in (0, 1):  # each kill took every process of the leg: on one node torchrun and both ranks
        left = check(drill, Kind.NOTHING_LEFT, leg=leg)
        found = re.match(r"(\d+) processes of the leg killed; 0 left", left["detail"])
        assert left["ok"] and (nodes or (found and int(found.group(1)) >= 3)), left
    return time.monotonic() - began


def test_the_hf_example_climbs_on_one_node_of_two_ranks_with_two_loader_workers(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("hf_trainer", tmp_path)
    train = root / "train.py"
    train.write_text(train.read_text().replace("dataloader_num_workers=0", "dataloader_num_workers=2"))
    torchrun = Path(hf_python()).with_name("torchrun")
    edit_config(root, trainer__command=f"{torchrun} --standalone --nproc_per_node 2 train.py --save-steps 5")
    assert run_cli(["review"], cwd=root).code == 0
    took = climb(root, [])
    print(f"1 node x 2 ranks, 2 workers: climbed in {took:.0f} s")
    epoch_end_lands_on_the_boundary(root)


def epoch_end_lands_on_the_boundary(root: Path) -> None:
    """`drill cold-resume --at epoch-end` after the climb (its oracle the rehearsal's straight leg,
    reused: 2 legs): 256 samples, 16 steps of 2 ranks x 8 an epoch, two loader workers a rank. The
    leg stops after step 16 and both ranks resume there, step 17 epoch 1. The Trainer's
    `state.epoch` after an epoch's last step is the next whole number; the step events printed
    int() of it, so that step read as the next epoch and the stop came a step early, at 15
    (scripts/resume-matrix.py found it; runtime.adapters.common.epoch_of_step)."""
    drill = run_cli(["drill", "cold-resume", "--at", "epoch-end", "--json"], cwd=root, timeout=900)
    assert drill.code == 0, failed(drill)
    placed = check(drill, Kind.KILL_MOMENT, leg=0)
    assert placed["ok"] and "stopped at step 16," in placed["detail"], placed
    assert check(drill, Kind.STRAIGHT_FINISHED)["facts"].get("reused_run"), "the rehearsal's straight leg"
    legs = run_cli(["ledger", drill.json()["run_id"], "--json"], cwd=root).json()[0]["legs"]
    events = leg_events(legs[1])
    resumed = [e for e in events if e["event"] == "resume"]
    assert sorted((e["rank"], e["from_step"]) for e in resumed) == [(0, 16), (1, 16)], resumed
    assert {e["epoch"] for e in events if e["event"] == "step" and e["step"] == 17} == {1}


def test_the_hf_example_climbs_on_two_nodes_of_one_rank(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("hf_trainer", tmp_path)
    edit_config(root, leg_env={"PREFLIGHT_NPROC_PER_NODE": "1"})
    assert run_cli(["review"], cwd=root).code == 0
    took = climb(root, ["--nodes", "2"])
    manifest = newest_drill_manifest(root)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {f["path"] for f in manifest["files"]}  # node 1's RNG too
    assert {k: manifest["meta"][k] for k in ("world_size", "accumulation", "per_rank_batch")} == {
        "world_size": 2,
        "accumulation": 1,
        "per_rank_batch": 8,
    }
    print(f"2 nodes x 1 rank: climbed in {took:.0f} s")


def test_a_leg_of_one_rank_refuses_the_checkpoint_two_ranks_saved_with_one_line(tmp_path: Path) -> None:
    """The example run by hand as two legs: two ranks save step 2; a leg of one rank resuming it
    ends before it trains, exit 3, its `stop` naming both world sizes (the plan refuses it too
    where it knows both: launcher.ops.shape; this is the leg's own check, for what it cannot know)."""
    import os
    import shutil
    import subprocess

    from tests.legs.test_examples import EXAMPLES, REPO

    shutil.copyfile(EXAMPLES / "hf_trainer" / "train.py", tmp_path / "train.py")
    python = hf_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAUNCHER_RUN_ID": "shape", "LAUNCHER_MAX_STEPS": "2"}
    env.pop("RANK", None)
    two = [str(Path(python).with_name("torchrun")), "--standalone", "--nproc_per_node", "2"]
    saved = subprocess.run(
        [*two, "train.py", "--save-steps", "2"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert saved.returncode == 0, saved.stderr[-6000:]
    env.update(LAUNCHER_LEG="1", LAUNCHER_MAX_STEPS="4")
    one = subprocess.run(
        [python, "train.py", "--save-steps", "2"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    events = [json.loads(line) for line in one.stdout.splitlines() if line.startswith('{"event": ')]
    stops = [e for e in events if e["event"] == "stop"]
    assert one.returncode == 3 and [s["reason"] for s in stops] == ["shape_changed"], one.stderr[-2000:]
    assert "saved by 2 ranks, this leg has 1" in stops[0]["error"] and "\n" not in stops[0]["error"]
    assert not [e for e in events if e["event"] in ("start", "step")]  # refused before anything trains

"""The examples climb the ladder unmodified but for their ladder.diff, on scripts in the
shapes users have (a flat script that trains at import time; a plain loop with SGD, a plateau
schedule and an epoch loader; the HF Trainer): static -> rehearsal, and for flat_gpt the drill
(two kills mid-push) -> report too. Every example's ladder.diff stays small. Their original
versions pass rung 0 as they are."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.checks.evidence import Kind
from tests.helpers import check, edit_config, fail_lines, failed, leg_events, run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REPO = EXAMPLES.parent


def hf_python() -> str:
    """The interpreter with transformers (`make test` builds .venv-hf and exports its path)."""
    python = os.environ.get("PREFLIGHT_HF_PYTHON") or str(REPO / ".venv-hf" / "bin" / "python")
    if not Path(python).is_file():
        pytest.fail(f"no interpreter with transformers at {python}: run `make test` (it builds .venv-hf)")
    return python


def pl_python() -> str:
    """The interpreter with lightning (`make test` builds .venv-lightning and exports its path)."""
    python = os.environ.get("PREFLIGHT_PL_PYTHON") or str(REPO / ".venv-lightning" / "bin" / "python")
    if not Path(python).is_file():
        pytest.fail(f"no interpreter with lightning at {python}: run `make test` (it builds .venv-lightning)")
    return python


# The examples whose trainer runs in an interpreter of its own (as on a cloud, in its image).
TRAINER_PYTHON = {"hf_trainer": hf_python, "accelerate": hf_python, "lightning": pl_python}


def changed_lines(diff: Path) -> int:
    return sum(
        1
        for line in diff.read_text().splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
    )


def copy_example(name: str, dest: Path, original: bool = False) -> Path:
    root = dest / name
    shutil.copytree(EXAMPLES / name, root)
    cfg = root / "launcher.yaml"
    if original:
        shutil.copyfile(root / "train_original.py", root / "train.py")
        cfg.write_text(cfg.read_text().replace(" --ckpt_every 5", "").replace(" --ckpt-every 5", ""))
    if name in TRAINER_PYTHON:
        cfg.write_text(cfg.read_text().replace("command: python ", f"command: {TRAINER_PYTHON[name]()} "))
    assert run_cli(["review"], cwd=root).code == 0
    return root


def drill_and_report(root: Path, nodes: list[str] | None = None) -> Any:
    """`drill cold-resume --kills 2 --at mid-push` passes (`nodes`: its `--nodes N` too), judged
    against the rehearsal's straight-through leg, reused (launcher.rungs.oracle: the drill's steps
    made the rehearsal's where they differ, on one node; a leg of several nodes needs launcher.yaml
    as the rehearsal ran it), then the report: proofs 1-4 and 6-8 PASS, 5 MISSING (no GPU rung
    here), exit 0. The drill's result."""
    rungs = yaml.safe_load((root / "launcher.yaml").read_text())["rungs"]
    if rungs["drill"]["steps"] != rungs["rehearsal"]["steps"]:
        assert not nodes, f"the example's drill steps must be its rehearsal's: {rungs}"
        edit_config(root, rungs__drill=rungs["drill"] | {"steps": rungs["rehearsal"]["steps"]})
    drill = run_cli(
        ["drill", "cold-resume", *(nodes or []), "--kills", "2", "--at", "mid-push", "--json"], cwd=root, timeout=900
    )
    assert drill.code == 0, failed(drill)
    oracle = check(drill, Kind.STRAIGHT_FINISHED).get("facts", {})  # no straight leg ran: the rehearsal's served
    assert "reused_run" in oracle and "disagreed" not in oracle, check(drill, Kind.STRAIGHT_FINISHED)
    assert run_cli(["ledger", oracle["reused_run"], "--json"], cwd=root).json()[0]["rung"] == "rehearsal", oracle
    report = run_cli(["report", "--json"], cwd=root, timeout=600)
    status = {p["number"]: p["status"] for p in report.json()["proofs"]}
    assert status == {1: "PASS", 2: "PASS", 3: "PASS", 4: "PASS", 5: "MISSING", 6: "PASS", 7: "PASS", 8: "PASS"}, {
        p["number"]: p["summary"] for p in report.json()["proofs"] if p["status"] != "PASS"
    }
    assert report.code == 0
    return drill


# The frameworks' adapters promise a few added lines: the Trainer's and Lightning's 3, Accelerate's 4.
ADDED_AT_MOST = {"hf_trainer": 3, "lightning": 3, "lightning_ddp": 3, "accelerate": 4}
# At most 20 changed lines, but for the scripts that gave their own checkpointing (a stateful
# loader's, FSDP's through DCP and its process group) to the session (docs/trainers.md).
CHANGED_AT_MOST = {"stateful_loader": 65, "fsdp_dcp": 45}


@pytest.mark.parametrize("name", sorted(diff.parent.name for diff in EXAMPLES.glob("*/ladder.diff")))
def test_the_examples_ladder_diff_is_small(name: str) -> None:
    diff = EXAMPLES / name / "ladder.diff"
    lines = diff.read_text().splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++") and line[1:].strip())
    changed, at_most = changed_lines(diff), CHANGED_AT_MOST.get(name, 20)
    assert 0 < changed <= at_most and added <= ADDED_AT_MOST.get(name, at_most), (changed, added)


@pytest.mark.parametrize("name", ["flat_gpt", "plain_loop"])
def test_the_example_climbs_the_ladder(name: str, tmp_path: Path, leg_tmp: Path) -> None:
    """The frameworks' examples climb on several ranks in tests/legs/test_multirank_*.py. In one
    process: hf_trainer's rehearsal is tests/legs/test_planted_bugs.py's ignore_data_skip plant,
    which fails the re-read's checks alone; Accelerate's and Lightning's resumes are in
    tests/legs/test_accelerate.py and test_lightning.py (leg by leg, beside the plants); their climbs with drills and reports on
    several ranks in tests/legs/test_multirank_*.py (examples/accelerate and lightning_ddp: one
    node of two ranks and two nodes of one, each killed mid-push twice). flat_gpt climbs on
    through the drill and the report; plain_loop stops at the rehearsal (test_drill.py's
    default drill drills the reference trainer)."""
    root = copy_example(name, tmp_path)
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out
    rehearsal = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    if name == "flat_gpt":
        drill_and_report(root)


@pytest.mark.parametrize("name", ["flat_gpt", "plain_loop", "hf_trainer", "lightning", "accelerate"])
def test_the_original_script_passes_rung_0_and_the_rehearsal_says_why_not(
    name: str, tmp_path: Path, leg_tmp: Path
) -> None:
    root = copy_example(name, tmp_path, original=True)
    cfg = root / "launcher.yaml"
    # The grace period is what the answer waits for: the original never speaks the contract, so a
    # short one proves as much as a long one (the default 180 s stands in for a slow install).
    cfg.write_text(cfg.read_text().replace("trainer:\n", "trainer:\n  events_grace_s: 8\n"))
    assert run_cli(["review"], cwd=root).code == 0
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out
    if name != "lightning":
        return  # every original exits without events before the grace ends: one branch, one shown
    began = time.monotonic()
    rehearsal = run_cli(["up", "rehearsal"], cwd=root, timeout=600)
    took = time.monotonic() - began
    assert rehearsal.code == 1 and took < 120, (took, rehearsal.out[-2000:])  # the grace period, not the 5-min budget
    fails = fail_lines(rehearsal.out)
    assert len(fails) == 1 and "printed no preflight events" in fails[0], rehearsal.out[-1500:]


def test_a_trainer_that_is_not_deterministic_is_a_finding_not_a_silent_band(tmp_path: Path, leg_tmp: Path) -> None:
    """Weights drawn before any seed: every fresh start differs. The straight-through run
    disagrees with the resumed one from step 1; a second straight run disagrees with the
    first: that is a FAIL naming the step and the field, and the resumes are compared within
    the band, said so."""
    root = copy_example("plain_loop", tmp_path)
    train = root / "train.py"
    train.write_text(train.read_text().replace("torch.manual_seed(args.seed)\n", "", 1))
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    bad = failed(res)
    # The finding, whatever the band says: a trainer that is random on every start may also land
    # outside the band on a resume (seen: a 0.249 loss drop across a restart against a band of
    # 0.245), so the band checks may fail too; every other check must hold.
    band = {(Kind.TIMELINE, None)} | {(Kind.LOSS_CONTINUITY, i) for i in (1, 2)}
    said = check(bad, Kind.CPU_DETERMINISM)["detail"]
    assert res.code == 1 and {(c["kind"], c.get("leg")) for c in bad} <= {(Kind.CPU_DETERMINISM, None)} | band, bad
    assert "two straight-through runs differ at step 1: loss" in said and "trainer.deterministic: false" in said, said
    assert "band" in check(res, Kind.TIMELINE)["detail"]
    status = {p["number"]: p for p in run_cli(["report", "--json"], cwd=root, timeout=600).json()["proofs"]}
    assert status[4]["status"] == "FAIL" and "CPU determinism" in status[4]["summary"], status[4]


def test_the_fsdp_example_rehearses_on_two_nodes_of_two_ranks(tmp_path: Path, leg_tmp: Path, sky_api) -> None:  # noqa: ANN001
    """examples/fsdp_dcp: an FSDP2 model and its optimizer sharded over 2 nodes x 2 ranks (the local
    backend's nodes, each its own folder), saved through torch.distributed.checkpoint by every rank,
    each node pushing its own shards: static -> rehearsal, whose resumed legs resume on all 4 ranks
    and push. Each node's `run:` is the one `--backend sky --dry-run` renders through SkyPilot's API
    server (`sky_api`). No drill or report here: 2-node kills mid-push are drilled by
    tests/legs/test_multirank_*.py (2 nodes x 1 rank) and tests/docker/test_docker.py (a node lost
    mid-push), a DCP resume on a fresh disk by tests/legs/test_sharded.py."""
    import json

    from tests.legs.test_nodes import each_node_ran_the_sky_script

    root = copy_example("fsdp_dcp", tmp_path)
    assert run_cli(["up", "static", "--json"], cwd=root).code == 0
    planned = run_cli(["up", "rehearsal", "--nodes", "2", "--dry-run", "--json"], cwd=root).json()
    rehearsal = run_cli(["up", "rehearsal", "--nodes", "2", "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    ranks = check(rehearsal, Kind.RANK_DATA)
    assert ranks["ok"] and ranks["kind"] == "rank_data" and "80 batch hashes across the ranks" in ranks["detail"]
    assert check(rehearsal, Kind.RANK_SAMPLES)["ok"] and check(rehearsal, Kind.RANK_STATE)["ok"]
    run_id = rehearsal.json()["run_id"]
    each_node_ran_the_sky_script(root, run_id, planned, steps=20)
    legs = run_cli(["ledger", run_id, "--json"], cwd=root).json()[0]["legs"]
    resumed = [leg for leg in legs if leg.get("role") is None and leg["leg"] >= 1]
    assert [leg["leg"] for leg in resumed] == [1, 2], [(leg["leg"], leg.get("role")) for leg in legs]
    for leg in resumed:  # leg 1 (ended by the deadline) and leg 2 (by the last step)
        each_node_pushed_its_own_shards(leg)
    manifests = sorted((root / ".launcher" / "store" / "runs" / run_id).glob("step-*/manifest.json"))
    assert manifests, run_id
    stored = json.loads(manifests[-1].read_text())
    assert stored["meta"]["format"] == "dcp" and stored["meta"]["world_size"] == 4
    assert sorted(f["path"] for f in stored["files"]) == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)] + [
        f"rank-0000{r}.pt" for r in range(4)
    ]


def each_node_pushed_its_own_shards(leg: dict) -> None:
    """One leg of 2 nodes x 2 ranks resumed on every rank from one step, pushed each node's own
    shards from that node's disk (each node's first rank deleted its local copy once verified),
    rank 0 sealed each checkpoint as verified over both nodes, and every rank ended verified."""
    events = leg_events(leg)
    resumed = [e for e in events if e["event"] == "resume"]
    assert sorted(e["rank"] for e in resumed) == [0, 1, 2, 3] and len({e["from_step"] for e in resumed}) == 1
    verify = [e for e in events if e["event"] == "verify"]
    assert verify and all(e["ok"] and e["nodes"] == 2 for e in verify), verify
    assert {e["rank"] for e in events if e["event"] == "delete_local"} == {0, 2}
    assert [e["final_checkpoint_verified"] for e in events if e["event"] == "done"] == [True] * 4


def test_the_stateful_loader_on_two_ranks_with_persistent_workers(tmp_path: Path, leg_tmp: Path) -> None:
    """examples/stateful_loader: torchdata's StatefulDataLoader with 2 worker processes, tracked
    by the Session, here under torchrun on 2 ranks, a DistributedSampler each, persistent workers
    (the example's own command is one process; the shapes meet in the same code): rung 0, then
    two resumes inside one epoch (the rehearsal's SIGTERM leg and its deadline leg), both exact
    on every rank, every batch the straight-through run's. The SIGTERM leg is also the one whose
    workers once died of the leg's group SIGTERM (runtime.session.workers). Its ladder.diff's
    size: test_the_examples_ladder_diff_is_small."""
    root = copy_example("stateful_loader", tmp_path)
    cfg = root / "launcher.yaml"
    cfg.write_text(
        cfg.read_text()
        .replace("command: python train.py", "command: torchrun --standalone --nproc_per_node=2 train.py")
        .replace("--workers 2", "--workers 2 --persistent-workers")
    )
    assert run_cli(["review"], cwd=root).code == 0
    assert run_cli(["up", "static", "--json"], cwd=root).code == 0
    rehearsal = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    stopped = check(rehearsal, Kind.STOPPED_AS_ASKED, leg=0)
    assert stopped["facts"]["want"] == "sigterm" and "sigterm" in stopped["detail"], stopped
    assert check(rehearsal, Kind.RANK_DATA)["ok"]
    samples, state = check(rehearsal, Kind.RANK_SAMPLES), check(rehearsal, Kind.RANK_STATE)
    assert samples["ok"] and samples["facts"]["unit"] == "samples" and state["ok"], (samples, state)

"""The Accelerate custom loop (examples/accelerate, the shape of accelerate's
by_feature/checkpointing.py) on the ladder, and resume bugs such loops have, planted one at a
time, each caught by a named check and a FAILed proof:
- the loader skipped twice: a stateful loader (`use_stateful_dataloader=True`, restored by
  `load_state`) *and* the loop's own `skip_first_batches`;
- the optimizer not registered: left out of `accelerator.prepare`, so `save_state` never saves
  it and every resume starts AdamW's moments afresh;
- the skip counted from the run's start instead of the epoch's (on a loader with 2 workers, its
  optimizer and scheduler prepared after `Preflight`: neither of those is a finding).
And a control: the stateful loader without the loop's skip (the other way the README allows)
resumes exactly, its evaluation loader's state included.
The trainer runs in .venv-hf (accelerate 1.15.0), as tests/legs/test_examples.py maps it; the example's
own climb (static -> rehearsal -> drill -> report) is there too."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from launcher.checks.evidence import Kind
from runtime import contract
from tests.helpers import check, checks_of, details, failed, run_cli
from tests.legs.test_examples import EXAMPLES, copy_example, hf_python
from tests.legs.test_planted_bugs import plant, rehearse, report_fails

STATEFUL = "dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)"
PREPARE = """model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )"""


def test_a_stateful_loader_that_is_also_skipped_loses_the_next_epochs_first_batches(
    tmp_path: Path, leg_tmp: Path
) -> None:
    """The "skips twice" trap: `load_state` restores the stateful loader's position *and* the loop
    skips the batches itself. The skipped loader finishes the epoch right; the position loaded
    into the prepared loader is still pending, so the next epoch starts that many batches in.
    The first batch after each resume is right (the data-position check on it holds); the loader
    state saved at the next checkpoint is not the straight-through run's, and the batches of the
    next epoch are not its either."""
    root = copy_example("accelerate", tmp_path)
    plant(root, "from accelerate import Accelerator\n", "from accelerate import Accelerator, DataLoaderConfiguration\n")
    plant(root, "Accelerator(cpu=True, ", "Accelerator(cpu=True, " + STATEFUL + ", ")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "data's state" in details(bad, Kind.STATE_STRAIGHT), bad
    assert "batch_hash" in check(bad, Kind.TIMELINE)["detail"], bad
    assert check(checks, Kind.DATA_POSITION, leg=1, ok=True)["ok"]  # the first batch after the resume is right
    moved = details(bad, Kind.DATA_POSITION)  # every resumed step's batch against the straight-through run's
    assert "read the straight-through run's batch of step" in moved and "the data position moved" in moved, moved
    fails = report_fails(root, 2, 4)
    assert "every resumed step's batch" in fails[2] and "state digests = straight-through run (data)" in fails[2], fails


def test_an_optimizer_left_out_of_prepare_restarts_its_moments_on_every_resume(tmp_path: Path, leg_tmp: Path) -> None:
    """The optimizer is not passed to `accelerator.prepare`: `save_state` does not save it, and
    each resume starts AdamW's moments afresh. The weights are restored, so the first resumed
    step's loss is right; the step after differs from the straight-through run's. The save events
    measure no optimizer state (proof 7 says 0.0 B/param of it, and the checkpoint holds what the
    state claims), and torch's global step hook sees an optimizer step that no prepared one took
    (proof 3)."""
    root = copy_example("accelerate", tmp_path)
    plant(root, PREPARE, PREPARE.replace("model, optimizer,", "model,", 2))
    code, checks = rehearse(root)
    bad = failed(checks)
    detail = details(bad, Kind.TIMELINE)
    assert code == 1 and "first difference at step" in detail and "loss" in detail, bad
    assert (
        "an optimizer that `accelerator.prepare` was not given" in check(bad, Kind.OPTIMIZER_IN_USE, leg=1)["detail"]
    ), bad
    assert {(c["kind"], c.get("leg")) for c in bad} <= {
        (Kind.TIMELINE, None),
        (Kind.LOSS_CONTINUITY, 1),
        (Kind.LOSS_CONTINUITY, 2),
        (Kind.OPTIMIZER_IN_USE, 1),
        (Kind.OPTIMIZER_IN_USE, 2),
    }, bad
    assert check(checks, Kind.LR, leg=1)["ok"]  # the scheduler was prepared: its LR is restored
    res = run_cli(["report", "--json"], cwd=root, timeout=600)
    status = {p["number"]: (p["status"], p["summary"]) for p in res.json()["proofs"]}
    assert res.code == 1 and status[4][0] == "FAIL" and "resumed run = straight-through run" in status[4][1], status
    assert "0.0 B/param of optimizer state" in status[7][1], status[7]
    assert status[3][0] == "FAIL" and "accelerator.prepare" in status[3][1], status[3]


def test_a_skip_counted_from_the_runs_start_reads_another_steps_batches(tmp_path: Path, leg_tmp: Path) -> None:
    """`skip_first_batches(loader, overall_step)` where the epoch's `resume_step` belongs: a resume
    in epoch 0 is right, one past it skips the whole epoch and starts the next one early, so the
    resumed steps read batches the straight run reads at other steps (proof 2). Planted with two
    shapes that must not be findings: the loader on 2 worker processes (the rehearsal's leg 0 ends
    by SIGTERM: its workers must live through the final `save_state`), and the optimizer and
    scheduler prepared after `Preflight(accelerator)` (their steps are the prepared optimizer's)."""
    root = copy_example("accelerate", tmp_path)
    plant(
        root, "skip_first_batches(train_dataloader, resume_step)", "skip_first_batches(train_dataloader, overall_step)"
    )
    plant(root, "batch_size=args.batch_size, shuffle=True)", "batch_size=args.batch_size, shuffle=True, num_workers=2)")
    plant(root, PREPARE, PREPARE.replace("model, optimizer,", "model,", 2).replace(", lr_scheduler", "", 2))
    plant(
        root,
        "    pf = Preflight(accelerator)\n",
        "    pf = Preflight(accelerator)\n    optimizer, lr_scheduler = accelerator.prepare(optimizer, lr_scheduler)\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and check(checks, Kind.LEG_FINISHED, leg=0)["ok"], bad  # SIGTERMed, workers and all
    assert not checks_of(bad, Kind.OPTIMIZER_IN_USE) and not checks_of(bad, Kind.LEG_FINISHED), bad
    moved = details(bad, Kind.DATA_POSITION)
    assert "the data position moved" in moved or "never reads" in moved, moved
    fails = report_fails(root, 2)
    assert 3 not in fails, fails


def _leg(root: Path, leg: int, steps: int) -> subprocess.Popen:
    """One leg of the example started by hand (the leg environment, the local store)."""
    env = {**os.environ, contract.LEG: str(leg), contract.MAX_STEPS: str(steps)}
    argv = [hf_python(), "train.py", "--ckpt-every", "5"]
    return subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(leg: subprocess.Popen) -> dict[str, dict[int, object]]:
    """A leg's step events (loss, batch hash) and state digests, by step, once it exited 0."""
    out, err = leg.communicate(timeout=300)
    assert leg.returncode == 0, err[-2000:]
    found: dict[str, dict[int, object]] = {"step": {}, "state_digest": {}}
    for line in out.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "step":
            found["step"][event["step"]] = (event["loss"], event.get("batch_hash"))
        elif event.get("event") == "state_digest":
            found["state_digest"][event["step"]] = event["digests"]
    return found


def test_a_stateful_loader_without_the_loops_skip_resumes_exactly(tmp_path: Path, leg_tmp: Path) -> None:
    """`use_stateful_dataloader=True` and no `skip_first_batches`: resumed at step 16 and run to 22,
    every step's loss and batch and the state digests at step 20 (training and evaluation loaders:
    the evaluation loader not iterated since the resume) are the straight run's."""
    text = (EXAMPLES / "accelerate" / "train.py").read_text()
    for old, new in (
        ("from accelerate import Accelerator\n", "from accelerate import Accelerator, DataLoaderConfiguration\n"),
        ("Accelerator(cpu=True, ", "Accelerator(cpu=True, " + STATEFUL + ", "),
        ("if epoch == starting_epoch and resume_step:", "if False:  # the loader's own state resumes it"),
    ):
        assert old in text, old
        text = text.replace(old, new, 1)
    straight, resumed = tmp_path / "a", tmp_path / "b"
    for root in (straight, resumed):
        root.mkdir()
        (root / "train.py").write_text(text)
    straight_leg, first = _leg(straight, 0, 22), _leg(resumed, 0, 16)  # side by side
    want, _ = _events(straight_leg), _events(first)
    got = _events(_leg(resumed, 1, 22))
    assert got["step"] == {s: want["step"][s] for s in range(17, 23)}, (got["step"], want["step"])
    assert got["state_digest"][20] == want["state_digest"][20]
    assert {"data", "data_1"} <= set(want["state_digest"][20])


def test_a_seed_set_after_load_state_is_left_as_set_and_named(tmp_path: Path, leg_tmp: Path) -> None:
    """`set_seed(1)` right after `load_state` (a "fresh randomness per resume" habit): the adapter
    does not undo it (it used to re-apply the loaded RNG at the first forward, hiding the line),
    so dropout draws other masks than the straight run's, and the straight comparison (proof 4)
    says no, naming the seed set after the restore as the cause."""
    root = copy_example("accelerate", tmp_path)
    plant(
        root,
        "        accelerator.load_state(args.resume_from)\n",
        "        accelerator.load_state(args.resume_from)\n        set_seed(1)\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    differs = details(bad, Kind.TIMELINE)
    assert code == 1 and "set the RNG" in differs and "after its restore" in differs, bad
    assert not checks_of(bad, Kind.DATA_POSITION), bad  # the batches are the straight run's
    assert "after its restore" in report_fails(root, 4)[4]

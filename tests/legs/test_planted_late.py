"""Two blind spots of issue 52, planted together in the reference trainer and answered by one
rehearsal of 15 steps (its legs end at steps 5, 13 and 15, with step limits 12, 14 and 15; the
straight-through run's is 15), each by a check of its own:
- a schedule whose horizon is each leg's own LAUNCHER_MAX_STEPS: leg 1 trains past the 10-step
  warm-up (launcher.ladder.PAST_WARMUP), so its LR leaves the straight-through run's at step 12:
  the LR check, proof 3. With equal thirds (5, 10, 15) leg 1 ended inside the warm-up and the
  rehearsal passed it (measured);
- an AdamW re-created after `sess.resume()` and tracked only then: the checkpoint's moments saved
  and never loaded, said by the session (`tracked_late`) and FAILed by the restore check, proof 3
  (it was MISSING: "no optimizer is tracked"). Planted alone it leaves the LR check passing
  (measured): the new optimizer takes the scheduler's LR."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, failed, run_cli
from tests.legs.test_planted_bugs import plant, report_fails

HORIZON = (
    "    args = build_parser().parse_args(argv)\n",
    "    args = build_parser().parse_args(argv)\n"
    '    args.total_steps = int(os.environ.get("LAUNCHER_MAX_STEPS", args.total_steps))  # the bug\n',
)
LATE_OPTIMIZER = (
    "    sess.track(model=raw, optimizer=opt, scheduler=sched, cursor=data)\n"
    "    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))\n",
    "    sess.track(model=raw, scheduler=sched, cursor=data)\n"
    "    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))\n"
    "    opt = torch.optim.AdamW(model.parameters(), lr=sched.get_last_lr()[0], weight_decay=0.1)  # the bug\n"
    "    sched.optimizer = opt\n"
    "    sess.track(optimizer=opt)\n",
)


def test_a_per_leg_schedule_horizon_and_an_optimizer_tracked_after_the_resume(project: Path) -> None:
    plant(project, "import math\n", "import math\nimport os\n")
    plant(project, *HORIZON)
    plant(project, *LATE_OPTIMIZER)
    res = run_cli(["up", "rehearsal", "--steps", "15", "--json"], cwd=project, timeout=900)
    checks = res.json()["checks"]
    bad = failed(checks)
    assert res.code == 1, bad
    lr = check(bad, Kind.LR, leg=1)
    assert "step 12 ran with LR" in lr["detail"], lr  # past the warm-up, not inside it
    unloaded = check(bad, Kind.STATE_RESTORED, leg=1)
    assert unloaded["facts"]["not_loaded"] == ["optimizer"] and "optimizer" in unloaded["facts"]["kinds"], unloaded
    assert check(checks, Kind.OPTIMIZER_IN_USE, leg=1)["ok"]  # the late-tracked optimizer is the one stepping
    proof_3 = report_fails(project, 3)[3]
    assert "leg 1: LR follows the schedule" in proof_3 and "leg 1: optimizer loaded as saved" in proof_3, proof_3

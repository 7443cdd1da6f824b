"""`launcher drill preempt --notice S` on the reference trainer (the project `launcher init`
writes), local backend: SIGTERM at a step, the kill S seconds later, a fresh leg resumes."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, failed, run_cli
from tests.legs.test_planted_bugs import plant


def preempt(project: Path, *args: str) -> tuple[int, list[dict], dict]:
    res = run_cli(["drill", "preempt", "--json", *args], cwd=project, timeout=900)
    out = res.json()
    run = run_cli(["ledger", out["run_id"], "--json"], cwd=project).json()[0]
    return res.code, out["checks"], run


def test_with_gcps_notice_the_final_checkpoint_verifies_and_the_next_leg_resumes_there(project: Path) -> None:
    code, checks, run = preempt(project, "--notice", "gcp", "--at-step", "18")
    assert code == 0, failed(checks)
    notice = check(checks, Kind.PREEMPT_NOTICE, leg=0)
    assert notice["facts"]["notice_s"] == 25, notice
    stopped = notice["facts"]["stop_step"]  # the step it was in when the signal came may finish first
    assert stopped in (18, 19) and notice["facts"]["expected"] == stopped, notice
    assert notice["detail"].startswith(f"SIGTERM at step 18; stopped at step {stopped} and its checkpoint verified")
    assert notice["facts"]["verify_s"] < 25 and notice["facts"]["stop_reason"] == "sigterm"
    assert f"resumed at step {stopped};" in check(checks, Kind.RESUMED_NEWEST, leg=1)["detail"]
    assert check(checks, Kind.WORK_LOST, leg=0)["facts"]["steps"] == 0
    assert run["rung"] == "drill" and [leg["killed"] for leg in run["legs"]] == [False, False]


def test_with_no_notice_the_next_leg_resumes_from_the_previous_verified_checkpoint(project: Path) -> None:
    code, checks, run = preempt(project, "--notice", "0", "--at-step", "18")
    assert code == 0, failed(checks)
    notice = check(checks, Kind.PREEMPT_NOTICE, leg=0)
    newest = notice["facts"]["expected"]  # what the cadence had verified by step 18 (a push may still be in flight)
    assert newest is not None and newest < 18 and newest % 5 == 0, notice
    assert notice["detail"] == f"no notice: killed at step 18; the store's newest verified checkpoint was step {newest}"
    assert f"resumed at step {newest};" in check(checks, Kind.RESUMED_NEWEST, leg=1)["detail"]
    lost = check(checks, Kind.WORK_LOST, leg=0)
    assert lost["facts"]["steps"] == 18 - newest and lost["detail"].startswith(f"{18 - newest} steps ("), lost
    assert run["legs"][0]["killed"] and "preempted at step 18 with no notice" in run["legs"][0]["end_reason"]


def test_a_trainer_that_ignores_sigterm_loses_the_work_since_its_last_verified_checkpoint(
    project: Path, tmp_path: Path
) -> None:
    """SIGTERM ignored: leg 0 trains on (a slow loader: 0.25 s a batch) until the notice runs
    out and the kill lands; the next leg (at full speed) resumes from the newest checkpoint the
    cadence verified; the drill says no, and how many steps were lost."""
    plant(
        project,
        "    model.train()\n",
        "    model.train()\n    import os\n    import signal\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the bug: the notice is ignored\n"
        "    if os.environ['LAUNCHER_LEG'] != '0':\n        args.data_delay = 0  # only leg 0 is preempted\n",
    )
    cfg = project / "launcher.yaml"
    cfg.write_text(
        cfg.read_text().replace(
            "command: python train.py --ckpt-every 5", "command: python train.py --ckpt-every 5 --data-delay 0.25"
        )
    )
    assert run_cli(["review"], cwd=project).code == 0
    code, checks, run = preempt(project, "--notice", "2", "--at-step", "12")
    notice = check(checks, Kind.PREEMPT_NOTICE, leg=0)
    assert code == 1 and not notice["ok"] and "the leg never stopped on the SIGTERM" in notice["detail"], notice
    assert "the 2 s notice ran out" in run["legs"][0]["end_reason"] and run["legs"][0]["killed"]
    resumed = check(checks, Kind.RESUMED_NEWEST, leg=1)
    lost = check(checks, Kind.WORK_LOST, leg=0)
    at, steps = lost["facts"]["resumed_at"], lost["facts"]["steps"]
    assert resumed["ok"] and f"resumed at step {at};" in resumed["detail"] and at == notice["facts"]["expected"]
    assert (
        f"{steps} steps (" in lost["detail"]
        and f"trained to step {at + steps}, leg 1 resumed at step {at}" in lost["detail"]
    ), lost
    assert failed(checks) == [notice] and notice["facts"]["notice_s"] == 2, failed(checks)
    # the report says it too, with the steps
    rep = run_cli(["report", "--out", str(tmp_path / "rep"), "--json"], cwd=project)
    assert rep.code == 0, rep.err
    [drill] = rep.json()["plan"]["drills"]
    assert (drill["run"], drill["notice_ok"], drill["lost_steps"], drill["resumed_at"]) == (run["id"], False, steps, at)
    text = (tmp_path / "rep" / "preflight.md").read_text()
    assert f"- **Preemption drill** ({run['id']}): {notice['detail']}; work lost: {lost['detail']}." in text


def test_a_notice_or_step_that_makes_no_sense_is_one_line_and_exit_2(project: Path) -> None:
    for args, says in (
        (["--notice", "soon"], "--notice takes seconds or one of aws, gcp, azure, k8s"),
        (["--notice", "-5"], "--notice must be 0 to 600 seconds"),
        (["--notice", "aws", "--at-step", "40"], "--at-step must lie in 1..39"),
        (["--notice", "aws", "--backend", "sky"], "the sky backend cannot send a leg SIGTERM"),
    ):
        res = run_cli(["drill", "preempt", *args], cwd=project)
        assert res.code == 2 and says in res.err and len(res.err.strip().splitlines()) <= 2, (args, res.err)
    assert not (project / ".launcher" / "runs").exists() or not any((project / ".launcher" / "runs").iterdir())

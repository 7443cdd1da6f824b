"""The ladder is the one source of rung facts: each rung's runner resolves to a function
of launcher.rungs, leg 0's step count is the one its runner gives it, and a dry run builds
leg 0's environment with the function real legs use (the end-to-end check, against a real
leg 0, is in tests/legs/test_rehearsal.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from launcher.ladder import DRILL, RUNGS, first_leg_steps, leg_steps, probe_plan, resume_plan, resume_rungs, rung_named
from launcher.rungs import runner_of


def test_every_rung_names_a_runner_that_exists() -> None:
    for rung in (*RUNGS, DRILL):
        for name in filter(None, (rung.runner, rung.runner_sky)):
            function = runner_of(name)
            assert function.__module__.startswith("launcher.rungs."), name
            assert list(inspect.signature(function).parameters)[0] == "ctx", name
    assert resume_rungs() == ("rehearsal", "smoke", "probe", "run", "drill")
    assert not rung_named("static").trains and all(rung_named(n).trains for n in resume_rungs()[:-1])


def test_leg_0_steps_follow_the_rungs_plans() -> None:
    assert resume_plan(20) == [6, 13, 20] and probe_plan(200) == [180, 200]
    assert first_leg_steps("rehearsal", 20, can_terminate=True) == 12  # stopped by SIGTERM at step 6
    assert first_leg_steps("smoke", 20, can_terminate=False) == 6  # sky: no SIGTERM, its share
    assert first_leg_steps("probe", 200, can_terminate=True) == 180
    assert first_leg_steps("run", 500, can_terminate=True) == 500 and first_leg_steps("static", 9, True) == 0
    assert leg_steps("rehearsal", 20, True, 3) == [12, 19, 20] and leg_steps("smoke", 20, False, 3) == [6, 19, 20]
    assert leg_steps("probe", 200, True, 2) == [180, 200] and leg_steps("run", 500, True, 1) == [500]
    # 15 steps and more: leg 1 trains past a 10-step warm-up (step 13), each leg with a step limit
    # of its own (a schedule whose horizon is the leg's limit shows); fewer: equal thirds
    assert resume_plan(15) == [5, 13, 15] and leg_steps("rehearsal", 15, True, 3) == [12, 14, 15]
    assert resume_plan(14) == [4, 9, 14] and resume_plan(30) == [10, 20, 30]


@pytest.mark.parametrize(
    "rung_name, gpus, session_hours, quota",
    [("rehearsal", None, None, None), ("smoke", "T4:2", 0.1, 30.0), ("probe", "T4:1", None, 0.05)],
)
def test_the_dry_run_builds_leg_0s_env_as_a_real_leg_does(
    tmp_path: Path, rung_name: str, gpus: str | None, session_hours: float | None, quota: float | None
) -> None:
    import dataclasses

    from launcher.backends.local import LocalBackend
    from launcher.cli.init import init_project
    from launcher.config.load import load_config
    from launcher.config.schema import parse_gpus, store_uri
    from launcher.legs import RunContext
    from launcher.plan import PLACEHOLDER_RUN, leg0_env

    init_project(tmp_path / "p")
    cfg = load_config(tmp_path / "p" / "launcher.yaml")
    cfg = dataclasses.replace(cfg, quota=dataclasses.replace(cfg.quota, session_hours=session_hours, gpu_hours=quota))
    spec = parse_gpus(gpus) if gpus else None
    reviewed = {"train.py": "ab" * 32}
    now = 1_700_000_000.0

    from launcher.backends.base import StagedFile
    from launcher.leg_env import leg_deadline

    ctx = RunContext(
        cfg,
        rung_named(rung_name),
        LocalBackend(),
        None,
        PLACEHOLDER_RUN,
        store_uri(cfg),  # type: ignore[arg-type]
        {"train.py": StagedFile(tmp_path / "p" / "train.py", "ab" * 32)},
        spec,
        lambda leg, line: None,
    )
    ctx.quota_left_hours = quota  # what the guard leaves a run when nothing else is used or held
    steps = cfg.rung(rung_name).steps
    first = {"rehearsal": resume_plan(steps)[1] - 1, "smoke": resume_plan(steps)[1] - 1, "probe": probe_plan(steps)[0]}[
        rung_name
    ]  # what launcher.rungs gives leg 0 on local
    shown = leg0_env(cfg, rung_named(rung_name), spec, spec.count if spec else 0, first, quota, reviewed, now=now)
    budget_s = cfg.rung(rung_name).budget_minutes * 60.0
    real = ctx.leg_env(0, first, leg_deadline(cfg, budget_s, ctx.quota_left_hours, ctx.gpu_count, now))
    assert shown == real
    assert (shown.get("CUDA_VISIBLE_DEVICES") == "") == (gpus is None)
    caps = (
        [budget_s]
        + ([session_hours * 3600] if session_hours else [])
        + ([quota / spec.count * 3600] if quota is not None and spec else [])
    )
    assert int(shown["LAUNCHER_DEADLINE"]) == int(now + min(caps))


def test_the_readme_states_each_rungs_where_and_question_as_the_ladder_does() -> None:
    """The rung table in the README is the ladder's, word for word (the ladder is its source)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for rung in RUNGS:
        assert f"| {rung.index} `{rung.name}` | {rung.where} | {rung.question} |" in readme, rung.name


def test_a_deadline_after_the_resume_only_ever_brings_the_deadline_sooner() -> None:
    """LAUNCHER_DEADLINE_AFTER_RESUME (sky's leg 1): counted from the resume, capped by LAUNCHER_DEADLINE."""
    from runtime.contract import DEADLINE_AFTER_RESUME, leg_env, resumed_deadline

    env = leg_env(
        run_id="r",
        leg=1,
        rung="smoke",
        store="file:///s",
        max_steps=29,
        deadline=2000.0,
        files_sha256={},
        on_gpu=True,
        deadline_after_resume=7.5,
    )
    assert env[DEADLINE_AFTER_RESUME] == "7.50"
    assert resumed_deadline(2000.0, env, now=1000.0) == 1007.5  # 7.5 s after the resume
    assert resumed_deadline(1003.0, env, now=1000.0) == 1003.0  # never later than LAUNCHER_DEADLINE
    for bad in ("", "soon", "nan", "-1", "inf"):
        assert resumed_deadline(2000.0, {DEADLINE_AFTER_RESUME: bad}, now=1000.0) == 2000.0
    assert DEADLINE_AFTER_RESUME not in leg_env(
        run_id="r", leg=1, rung="smoke", store="file:///s", max_steps=29, deadline=2000.0, files_sha256={}, on_gpu=True
    )


def test_a_leg_holds_itself_once_at_its_step_until_the_deadline_is_due(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """LAUNCHER_HOLD_AT_STEP: before the held step nothing waits; at it, one `hold` that sleeps
    until the deadline is within the stop margin, so the stop decision that follows is the
    deadline's; never twice, and never without a finite deadline or a number."""
    import json
    import time

    from runtime.contract import HOLD_AT
    from runtime.session import rules as runtime_leg

    slept: list[float] = []
    monkeypatch.setattr(runtime_leg.time, "sleep", slept.append)
    monkeypatch.setattr(runtime_leg, "_held", [])
    monkeypatch.setenv(HOLD_AT, "13")
    deadline = time.time() + 60.0
    assert runtime_leg.local_stop(deadline, 0.0, 0.1, False, step=12) == 0 and slept == []
    runtime_leg.local_stop(deadline, 0.0, 0.1, False, step=13)
    assert len(slept) == 1 and 54.0 < slept[0] < 55.2  # the deadline less the 5 s margin, then a little
    held = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"hold"' in line]
    assert [(e["step"], e["deadline"]) for e in held] == [(13, deadline)]
    runtime_leg.local_stop(deadline, 0.0, 0.1, False, step=14)
    assert len(slept) == 1  # once
    monkeypatch.setattr(runtime_leg, "_held", [])
    for value, dl in (("soon", deadline), ("13", float("inf"))):
        monkeypatch.setenv(HOLD_AT, value)
        runtime_leg.local_stop(dl, 0.0, 0.1, False, step=20)
    assert len(slept) == 1


def test_a_held_leg_places_its_deadline_a_quarter_second_out_and_stops_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """LAUNCHER_HOLD_DEADLINE_S: at the hold step the deadline is placed that long plus the stop
    margin ahead (never later than the one the leg has), the hold waits that long on the real
    clock, and the stop that follows is the deadline's; a SIGTERM hold places nothing."""
    import json
    import time

    from launcher.leg_env import Ending, ending_env
    from runtime.contract import HOLD_AT, HOLD_DEADLINE_S, HOLD_UNTIL, deadline_after
    from runtime.session import rules as runtime_leg

    env = ending_env(Ending(deadline_s=60.0, hold_at=13))
    assert env == {HOLD_AT: "13", HOLD_DEADLINE_S: "0.25"}  # the launcher's deadline leg
    assert HOLD_DEADLINE_S not in ending_env(Ending(sigterm_at=6, hold_at=6))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(runtime_leg, "_held", [])
    monkeypatch.setattr(runtime_leg, "_placed", [])
    far = time.time() + 60.0
    began = time.time()
    assert runtime_leg.local_stop(far, 0.0, 0.1, False, step=12) == 0
    assert runtime_leg.local_stop(far, 0.0, 0.1, False, step=13) == 2  # the placed deadline is due
    assert 0.25 <= time.time() - began < 5.0  # it waited on the real clock, not for the far deadline
    [held] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"hold"' in line]
    assert held["until"] == "deadline" and 0 < held["seconds"] <= 0.31 and held["deadline"] < far - 50  # 0.25 + 0.05
    assert runtime_leg.local_stop(far, 0.0, 0.1, False, step=14) == 2  # it stands for the rest of the leg
    monkeypatch.setattr(runtime_leg, "_held", [])
    monkeypatch.setattr(runtime_leg, "_placed", [])
    soon = time.time() + 5.1  # a deadline already sooner than the placed one is kept
    slept: list[float] = []
    monkeypatch.setattr(runtime_leg.time, "sleep", slept.append)
    runtime_leg.local_stop(soon, 0.0, 0.1, False, step=13)
    assert runtime_leg._placed == [] and len(slept) == 1 and slept[0] < 0.2
    monkeypatch.setattr(runtime_leg, "_held", [])
    monkeypatch.setenv(HOLD_UNTIL, "sigterm")
    runtime_leg.local_stop(far, 0.0, 0.1, [True], step=13)
    assert runtime_leg._placed == []  # a SIGTERM hold places no deadline
    for bad in ("soon", "-1", "nan"):
        assert deadline_after(far, {HOLD_DEADLINE_S: bad}, HOLD_DEADLINE_S, time.time() + 5.0) == far


def test_a_leg_that_missed_its_planned_stop_is_told_apart_from_one_that_outran_the_launcher() -> None:
    """`leg N stopped on sigterm` fails either way; its detail says, from the trainer's own step
    times, whether the trainer went on after the SIGTERM went out (its bug) or had printed its
    last step before it did (the rung needs more steps)."""
    from launcher.backends.base import LegResult
    from launcher.checks.evidence import LegEvents
    from launcher.checks.leg import check_ending
    from launcher.leg_env import Ending
    from launcher.legs import LegOutcome

    steps = [(n, {"event": "step", "step": n, "t": 100.0 + n}) for n in range(1, 13)]
    stop = [(13, {"event": "stop", "step": 12, "reason": "max_steps", "t": 112.5})]
    result = LegResult(0, 100.0, 113.0, False, "exit 0")
    events = LegEvents(0, Path("leg-0.log"), steps + stop)
    ending = Ending(sigterm_at=6)
    ignored = check_ending(LegOutcome(result, events, acted_at=106.2), ending)
    assert ignored is not None and not ignored.ok
    assert "SIGTERM went out at step 6, and the trainer went on to step 12" in ignored.detail, ignored.detail
    outran = check_ending(LegOutcome(result, events, acted_at=112.2), ending)
    assert outran is not None and not outran.ok and "outran the launcher" in outran.detail, outran.detail
    never = check_ending(LegOutcome(result, events), ending)
    assert never is not None and "never sent SIGTERM" in never.detail, never.detail
    honoured = LegEvents(0, Path("leg-0.log"), steps[:7] + [(8, {"event": "stop", "step": 7, "reason": "sigterm"})])
    passed = check_ending(LegOutcome(result, honoured, acted_at=106.2), ending)
    assert passed is not None and passed.ok and "went out" not in passed.detail
    # a trainer the SIGTERM itself ended: no `stop`, no `done`, a signal's exit: not "more steps"
    for code, said in ((-15, "exit -15"), (143, "exited 143"), (1, "exited 1")):
        died = LegResult(code, 100.0, 107.0, False, f"exit {code}")
        cut = check_ending(LegOutcome(died, LegEvents(0, Path("leg-0.log"), steps[:6]), acted_at=106.2), ending)
        assert cut is not None and not cut.ok and cut.facts["got"] is None
        assert "does not handle the stop" in cut.detail and said in cut.detail, cut.detail
        assert "more steps" not in cut.detail.replace("more steps would not help", ""), cut.detail


def test_a_leg_that_refused_by_itself_before_its_planned_stop_gets_no_stop_finding() -> None:
    """A leg that ended with a refusal of its own (a loader the adapter cannot make resumable,
    exit 3) before the launcher's SIGTERM: that refusal is the finding; "the launcher never sent
    SIGTERM" beside it would be a second, false one."""
    from launcher.backends.base import LegResult
    from launcher.checks.evidence import LegEvents
    from launcher.checks.leg import check_ending
    from launcher.leg_env import Ending
    from launcher.legs import LegOutcome

    refused = [(1, {"event": "stop", "step": 0, "reason": "loader_not_resumable", "t": 100.5})]
    result = LegResult(3, 100.0, 101.0, False, "exit 3")
    assert check_ending(LegOutcome(result, LegEvents(0, Path("leg-0.log"), refused)), Ending(sigterm_at=6)) is None

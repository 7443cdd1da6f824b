"""The legs of rungs 1 and 2 (launcher.rungs.rehearsal, launcher.rungs.smoke): train, push,
resume on a NEW empty disk — twice.

Three legs, each on a fresh instance: leg 0 trains a third of the rung's steps
and pushes; legs 1 and 2 must each resume solely from the store (two
sequential resumes, proof 8), at exactly the step the previous leg pushed,
with the LR the schedule gives that step (proof 3), the loss where the previous
leg's trend says (proof 4), and the data position right after the last batch
consumed — never backwards, nothing read twice, nothing skipped (proof 2).
Smoke adds: the legs ran on the accelerator.
"""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Check, Kind, LegEvents, silent
from launcher.checks.leg import check_device, check_ending, check_leg_exit
from launcher.checks.resume import check_resumed
from launcher.ladder import RESUME_LEGS as LEGS
from launcher.ladder import leg_steps, resume_leg0_hold, resume_plan
from launcher.leg_env import Ending
from launcher.legs import LegOutcome, RunContext, run_leg


def plan_endings(ctx: RunContext, steps: int, legs: int, first: LegOutcome | None, leg: int) -> tuple[int, Ending]:
    """(LAUNCHER_MAX_STEPS, how the launcher ends it) for each leg of a resume rung: leg 0
    is stopped by SIGTERM, leg 1 by its deadline, the last runs to the rung's end. A
    trainer that pushes no final checkpoint on SIGTERM or at its deadline fails here."""
    plan = resume_plan(steps, legs)
    max_steps = leg_steps(ctx.rung.name, steps, ctx.backend.can_terminate, legs)[leg]  # what the plan shows
    if leg == legs - 1:
        return max_steps, Ending()
    if leg == 0:  # held at its step until the SIGTERM comes: a SIGTERM read late still lands there
        hold = resume_leg0_hold(ctx.rung.name, steps, ctx.backend.can_terminate, legs)
        return max_steps, Ending(sigterm_at=hold, hold_at=hold)
    # The deadline: far enough for the leg to start and train, then the leg holds itself at a known
    # step until the deadline is within its margin (LAUNCHER_HOLD_AT_STEP), so the stop lands
    # mid-run. The deadline is counted from the leg's resume (LAUNCHER_DEADLINE_AFTER_RESUME), so it
    # lands after the planned steps, whatever the leg took to start; LAUNCHER_DEADLINE stays a
    # generous fallback, from leg 0's start-up, for a trainer that reads only it. Without the hold
    # a deadline had to guess the steps' speed: on sky a leg that stepped faster than leg 0 reached
    # its step limit first (seen under load); a hold from outside (freezing the leg when the launcher
    # read the step) came 6 steps late on a loaded docker engine.
    startup = _startup_s(first) if first else 10.0
    step_s = _step_s(first) if first else 1.0
    ahead = (plan[leg] - plan[leg - 1]) * step_s
    fallback = max(15.0, 2 * startup + 6.0) + ahead
    return max_steps, Ending(deadline_s=fallback, hold_at=plan[leg], after_resume_s=5.0 + max(2.0, 3 * ahead))


def under_torchrun(ctx: RunContext) -> bool:
    """The leg's program is torchrun, which exits 1 after a SIGTERM once its ranks are done, or
    `accelerate launch`, which has no SIGTERM handler and dies of it while its trainer makes its
    final save: only then is a non-zero exit after the launcher's SIGTERM judged by the ranks'
    `done` events. A plain Python trainer exits 0 after a graceful stop; its exit 1 is a failure
    (a rank-only assert after the final checkpoint verified passed as a graceful stop before)."""
    command = ctx.cfg.trainer.command
    return ctx.nodes > 1 or (bool(command) and Path(command[0]).name in ("torchrun", "accelerate"))  # several
    # nodes: the rung's `run:` script execs torchrun on each


def _startup_s(out: LegOutcome) -> float:
    first = out.events.first("step")
    return max(1.0, first[1]["t"] - out.result.started_at) if first and "t" in first[1] else 10.0


def _step_s(out: LegOutcome) -> float:
    times = [e["t"] for _, e in out.events.all("step") if "t" in e]
    return max(0.01, (times[-1] - times[0]) / (len(times) - 1)) if len(times) > 1 else 1.0


def run_resume_legs(ctx: RunContext, steps: int, need_gpu: bool, legs: int = LEGS) -> list[Check]:
    """Leg 0 trains and pushes; every later leg resumes on a fresh disk; on a CPU rung the
    same trainer then runs straight through once, as the oracle. Returns the checks."""
    from launcher.checks.readback import check_leg_store

    checks: list[Check] = []
    outs: list[LegOutcome] = []
    store = ctx.open_store()
    expected: int | None = None
    for leg in range(legs):
        max_steps, ending = plan_endings(ctx, steps, legs, outs[0] if outs else None, leg)
        out = run_leg(ctx, leg, max_steps, ending=ending)
        outs.append(out)
        exited = check_leg_exit(out, sigterm=ending.sigterm_at is not None and under_torchrun(ctx))
        checks.append(exited)
        if silent(out.events):
            return checks  # one answer, naming the cause: the checks after it would only echo it
        if need_gpu:
            checks.append(check_device(out))
        if leg > 0:
            checks.append(check_resumed(out.events, expected))
        ended = check_ending(out, ending)
        if ended is not None:
            checks.append(ended)
        readback = check_leg_store(store, out.events)
        checks.append(readback)
        done = out.events.last("done")
        expected = int(done[1]["step"]) if done else None
        if not (readback.ok and exited.ok):
            return checks  # nothing sound to resume from: the next leg would only repeat the failure
    checks.append(check_run_length(outs[-1], steps))
    return checks + straight_and_exact(ctx, outs, steps, need_gpu)


def check_run_length(last: LegOutcome, steps: int) -> Check:
    """The last leg finished at the rung's step count: not short of it, not past it."""
    done = last.events.last("done")
    return Check(
        "the run ended at exactly its step count",
        bool(done and done[1]["step"] == steps),
        f"last leg finished at step {done[1]['step'] if done else None} of {steps}",
        last.events.pointer(done),
        kind=Kind.RUN_LENGTH,
    )


def straight_and_exact(ctx: RunContext, outs: list[LegOutcome], steps: int, need_gpu: bool) -> list[Check]:
    """On a CPU the same trainer runs straight through once (the oracle, leg len(outs);
    `Rung.straight_leg` decides); then the timeline's checks, exact where they can be (exact_checks)."""
    checks: list[Check] = []
    straight = None
    if ctx.rung.straight_leg:
        s_out = run_leg(ctx, len(outs), steps, ending=Ending(straight=True))
        ran = check_leg_exit(s_out)
        checks.append(
            Check(
                f"straight-through run (leg {len(outs)}, no restart) finished",
                ran.ok,
                ran.detail,
                ran.evidence,
                kind=Kind.STRAIGHT_FINISHED,
                leg=len(outs),
            )
        )
        straight = s_out.events
    return checks + exact_checks(ctx, [o.events for o in outs], straight, need_gpu, steps)


def exact_checks(
    ctx: RunContext, legs: list[LegEvents], straight: LegEvents | None, on_gpu: bool, steps: int
) -> list[Check]:
    """The timeline's checks, exact where they can be: on a CPU for a deterministic trainer,
    on a GPU when the legs' deterministic mode held (launcher.checks.determinism.check_determinism)."""
    from launcher.checks.determinism import check_determinism

    mode = check_determinism(legs, on_gpu)
    exact = ctx.cfg.trainer.deterministic and (not on_gpu or (mode is not None and mode.kind == Kind.GPU_EXACT))
    return ([mode] if mode is not None else []) + oracle_checks(ctx, legs, straight, exact, steps)


PREFIX_STEPS = 3
"""Leg 0's fewest steps that, agreeing with the straight-through run's, stand for a second
straight-through run (oracle_checks)."""


def oracle_checks(
    ctx: RunContext, legs: list[LegEvents], straight: LegEvents | None, exact: bool, steps: int
) -> list[Check]:
    """The timeline's checks; if an exact comparison fails, first ask whether the trainer
    reproduces itself. Leg 0 and the straight-through run are two fresh starts already: where
    leg 0's steps (at least PREFIX_STEPS) agree with the straight run's in every field, the
    trainer reproduced itself and the differences are the resumes'. Otherwise (they differ,
    which may also be a trainer that reads its leg's step limit, or leg 0 is too short) a
    second straight-through run settles it. One that does not reproduce itself is a finding
    (FAIL, naming the first step and field the two runs differ in), never a silent fall-back:
    its resumes are then compared within the band, and the checks say so."""
    from launcher.checks.resume import check_deterministic, resume_step, steps_of
    from launcher.checks.state import timeline_checks

    found = timeline_checks(legs, straight, exact)
    if exact and straight is not None and not all(c.ok for c in found):
        if (
            legs
            and resume_step(legs[0]) is None
            and len(steps_of(legs[0])) >= PREFIX_STEPS
            and check_deterministic(straight, legs[0]).ok
        ):
            return found
        repeat = run_leg(ctx, straight.leg + 1, steps, ending=Ending(straight=True))
        same = check_deterministic(straight, repeat.events)
        if not same.ok:
            found = [
                Check(
                    "CPU determinism",
                    False,
                    same.detail + ": an exact comparison cannot prove this "
                    "trainer's resumes (seed everything before building the model and drawing data, or set "
                    "trainer.deterministic: false to compare within a band)",
                    same.evidence,
                    kind=Kind.CPU_DETERMINISM,
                )
            ] + timeline_checks(legs, straight, exact=False)
    return found

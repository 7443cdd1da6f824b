"""Rung 4, the run: leg after leg, each on a fresh instance, to the run's last step.

Every leg gets LAUNCHER_MAX_STEPS = the run's steps and a deadline from its budget
(`rungs.run.budget_minutes`, `quota.session_hours`, and what the quota still
allows); it trains until it is done, its deadline (a final verified checkpoint,
then exit), or until it is lost (preempted, killed, crashed). The next leg resumes
from the store. After each leg the launcher reads the store itself: the newest
verified checkpoint there is where the next leg must resume, and every checkpoint
the logs call verified must still be there. Each resume is checked as the drill
checks it (position, LR, loss, no re-read); the first bad one stops the run.

The run stops:
- done: a leg reached the run's steps (exit 0);
- a bad resume, or a store that lost a verified checkpoint (exit 1, the check named);
- a crash loop: `max_restarts_on_errors` legs in a row left no newer verified
  checkpoint (exit 1, naming the newest verified one);
- the quota: too little is left for another leg; the last leg's deadline already
  came from what was left, so it pushed a final checkpoint (exit 3, with what the
  rest of the run needs);
- `launcher stop` (the leg pushes its final checkpoint; no further leg launches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.checks.evidence import Check, Kind, LegEvents, silent
from launcher.checks.leg import check_leg_exit
from launcher.errors import QuotaOut
from launcher.legs import LegOutcome, RunContext, run_leg

if TYPE_CHECKING:
    from launcher.ops.spend import LegGrant

MIN_LEG_S = 30.0
"""The shortest leg worth launching before the run has measured one (the quota's floor for
its first leg). From then on: twice the longest a leg took from launch to its first
verified checkpoint, at least MIN_MEASURED_LEG_S; a shorter leg could not push one."""
MIN_MEASURED_LEG_S = 10.0


def first_leg_gpu_hours(gpus: int) -> float:
    """The least the quota must leave a run on `gpus` GPUs (all nodes) for it to launch at all."""
    return MIN_LEG_S / 3600.0 * gpus


MAX_LEGS = 10_000


def hold_leg(ctx: RunContext, want_gpu_hours: float) -> LegGrant:
    """The next leg's share of the quota, out of the run's reservation (launcher.ops.spend.hold_leg)."""
    from launcher.ops.spend import hold_leg as hold

    assert ctx.reservation_id is not None
    return hold(
        ctx.cfg, ctx.ledger, ctx.reservation_id, ctx.run_id, want_gpu_hours, ctx.gpu_hour_price, ctx.allow_overdraft
    )


def min_leg_s(outs: list[LegOutcome]) -> float:
    """The shortest leg worth launching, from what this run's legs measured (see MIN_LEG_S)."""
    firsts = []
    for out in outs:
        first = next((e for _, e in out.events.all("verify") if e.get("ok") and "t" in e), None)
        if first is not None:
            firsts.append(float(first["t"]) - out.result.started_at)
    return max(MIN_MEASURED_LEG_S, 2.0 * max(firsts)) if firsts else MIN_LEG_S


def newest_in_store(store: Any) -> tuple[int | None, str | None]:
    from runtime.store.base import newest_verified

    newest = newest_verified(store)
    return (newest.step, newest.name) if newest else (None, None)


def describe_end(out: LegOutcome) -> str:
    r, ev = out.result, out.events
    stop, last = ev.last("stop"), ev.last("step")
    how = f"stopped on {stop[1]['reason']}" if stop else "killed" if r.killed else f"exited {r.exit_code}"
    return f"{how} ({r.end_reason}) after {r.wall_seconds:.0f} s at step {int(last[1]['step']) if last else '-'}"


def check_resume_point(ev: LegEvents, expected: int | None) -> Check:
    """The leg resumed from the newest verified checkpoint the launcher read in the store
    before launching it (a fresh start only if there was none)."""
    resume = ev.first("resume")
    got = int(resume[1]["from_step"]) if resume else None
    name = f"leg {ev.leg} resumed from the newest verified checkpoint"
    where = "a fresh start" if got is None else f"step {got}"
    return Check(
        name,
        got == expected,
        f"{where}; the newest verified checkpoint in the store before leg {ev.leg} "
        f"was {'none' if expected is None else f'step {expected}'}",
        ev.pointer(resume),
        kind=Kind.RESUMED_NEWEST,
        leg=ev.leg,
        facts={"resumed_at": got, "expected": expected},
    )


def leg_checks(
    ctx: RunContext, store: Any, outs: list[LegOutcome], before: int | None, after: int | None, exact: bool
) -> list[Check]:
    """What the launcher checks after leg i: the store kept what the logs verified, and the
    leg's resume (if it resumed and trained) was exact."""
    from launcher.checks.data import check_batches
    from launcher.checks.kills import check_store_after_kill
    from launcher.checks.resume import check_loss, check_lr

    checks = [check_store_after_kill(store, outs, after, when="its end")]
    i = len(outs) - 1
    ev = outs[-1].events
    if i > 0:
        checks.append(check_resume_point(ev, before))
        if ev.first("resume") is not None and ev.all("step"):
            legs = [o.events for o in outs]
            checks += [check_lr(legs, i), check_batches(legs, i), check_loss(legs, i, exact)]
    return checks


def quota_out(
    ctx: RunContext,
    outs: list[LegOutcome],
    grant: Any,
    newest: tuple[int | None, str | None],
    steps: int,
    checks: list[Check],
    shortest: float,
) -> QuotaOut:
    from launcher.ops.watch import rate_now

    rate = rate_now([o.events for o in outs])
    step_s = rate["step_s"] if rate else None
    left = newest[0] or 0
    gpus = ctx.gpus_total
    need = (steps - left) * step_s * gpus / 3600.0 if step_s else None
    rest = (
        f"the rest (steps {left + 1}..{steps}) needs about {need:,.2f} GPU-h at the measured {step_s:.3g} s/step"
        if need is not None
        else f"the rest is steps {left + 1}..{steps}"
    )
    where = f"{newest[1]} (step {left})" if newest[1] else "no verified checkpoint"
    msg = (
        f"quota: {max(0.0, grant.left_gpu_hours):.3f} GPU-h left in the period, less than one "
        f"{shortest:.0f} s leg on {gpus} GPUs; {rest}; the run stopped at {where}, verified in the store"
    )
    checks = checks + [Check("the quota allows another leg", False, msg, kind=Kind.QUOTA_LEG)]
    return QuotaOut(
        msg,
        checks,
        hint=f"the checkpoint stays in the store under runs/{ctx.run_id}; raise "
        "quota.gpu_hours or wait for the next period (continuing this run id is not in this version: "
        "a new `launcher up run` starts from step 0)",
    )


@dataclass
class Progress:
    """Where the run stands between legs: the newest verified checkpoint the launcher read
    in the store (step, name), and how many legs in a row added none."""

    newest: tuple[int | None, str | None]
    stalled: int = 0


def reached_end(out: LegOutcome, steps: int) -> bool:
    done = out.events.last("done")
    return bool(done and int(done[1]["step"]) == steps and out.result.exit_code == 0)


def judge_leg(
    ctx: RunContext, store: Any, outs: list[LegOutcome], progress: Progress, exact: bool, checks: list[Check]
) -> str | None:
    """After a leg ended: read the store, check the leg (its resume, what it verified) and the
    crash-loop rule; the checks go into `checks`. Returns why the run must stop, or None."""
    run_cfg = ctx.cfg.rungs.run
    ended = outs[-1]
    before = progress.newest[0]
    progress.newest = newest_in_store(store)
    after, name = progress.newest
    found = leg_checks(ctx, store, outs, before, after, exact)
    checks.append(
        Check(
            f"leg {ended.events.leg} ended",
            True,
            describe_end(ended) + "; newest verified in the "
            "store: " + (f"step {after}" if after is not None else "none"),
            kind=Kind.LEG_ENDED,
            leg=ended.events.leg,
        )
    )
    checks.extend(found)
    if not all(c.ok or c.missing for c in found):
        return "a resume check failed"  # or a store that lost a checkpoint: the run must not go on
    if reached_end(ended, run_cfg.steps) or ctx.ledger.stop_requested(ctx.run_id):
        return None
    progressed = after is not None and (before is None or after > before)
    progress.stalled = 0 if progressed else progress.stalled + 1
    if progress.stalled < max(1, run_cfg.max_restarts_on_errors):
        return None
    where = f"{name} (step {after})" if name else "none (nothing was ever verified)"
    checks.append(
        Check(
            "the run makes progress",
            False,
            f"crash loop: {progress.stalled} leg(s) in a row left no newer verified checkpoint "
            f"(rungs.run.max_restarts_on_errors: {run_cfg.max_restarts_on_errors}); the newest verified "
            f"checkpoint is {where}; the last leg {describe_end(ended)}",
            ended.events.pointer(ended.events.last("stop")),
            kind=Kind.PROGRESS,
        )
    )
    return "crash loop"


def finished(outs: list[LegOutcome], steps: int) -> list[Check]:
    """The checks of a run that reached its last step: the whole timeline's."""
    from launcher.checks.data import check_no_repeat, check_sample_index

    last = outs[-1].events
    legs = [o.events for o in outs]
    witness = check_sample_index(legs)
    return [
        Check(
            "the run ended at exactly its step count",
            True,
            f"leg {last.leg} finished at step {steps} of {steps} after {len(outs) - 1} restarts",
            last.pointer(last.last("done")),
            kind=Kind.RUN_LENGTH,
            leg=last.leg,
        ),
        check_no_repeat(legs),
    ] + ([witness] if witness else [])


def climb(ctx: RunContext, cmp: object = None) -> list[Check]:
    """Carry the run to its last step; returns the checks (QuotaOut when the quota runs out)."""
    steps = ctx.cfg.rungs.run.steps
    store = ctx.open_store()
    exact = not ctx.gpu_count and ctx.cfg.trainer.deterministic
    outs: list[LegOutcome] = []
    checks: list[Check] = []
    progress = Progress(newest_in_store(store))
    gpus = ctx.gpus_total
    budget_h = ctx.cfg.rungs.run.budget_minutes / 60.0 * gpus
    for leg in range(MAX_LEGS):
        if ctx.reservation_id is not None and gpus:
            grant = hold_leg(ctx, budget_h)
            shortest = min_leg_s(outs)
            if grant.gpu_hours * 3600.0 / gpus < shortest:
                raise quota_out(ctx, outs, grant, progress.newest, steps, checks, shortest)
            ctx.quota_left_hours = grant.gpu_hours if math.isfinite(grant.gpu_hours) else None
        if leg:
            ctx.show(
                leg,
                f"launcher: leg {leg} (restart {leg}) resumes from "
                f"{progress.newest[1] or 'nothing verified: a fresh start'}\n",
            )
        out = run_leg(ctx, leg, steps)
        outs.append(out)
        if silent(out.events):
            return checks + [check_leg_exit(out)]  # the trainer does not speak the contract: no restart helps
        if judge_leg(ctx, store, outs, progress, exact, checks):
            return checks
        if reached_end(out, steps):
            return checks + finished(outs, steps)
        if ctx.ledger.stop_requested(ctx.run_id):
            return checks  # `launcher stop`: the leg pushed its final checkpoint; up records "stopped"
    checks.append(Check("the run ended within the leg cap", False, f"{MAX_LEGS} legs and not done", kind=Kind.LEG_CAP))
    return checks

"""Rung 3 (probe): does the config hold for hours?

Two legs on fresh instances. Leg 0 trains most of the rung's steps and is
measured: the sustained rate (warm-up excluded, with its standard error), the
memory trend (flat or leaking), and the checkpoint cycle's cost at the
configured cadence. Leg 1 is a cold resume from the store on an empty disk,
checked like every resume (position, LR, loss continuity, no re-read), and must
end at exactly the rung's step count. With --cpu a third leg runs straight
through, and the resumed run must equal it, as in the rehearsal.
"""

from __future__ import annotations

from launcher.checks.evidence import Check, silent
from launcher.checks.leg import check_device, check_leg_exit
from launcher.checks.measure import check_breakdown, check_cadence, check_memory, check_sustained
from launcher.checks.resume import check_pushed, check_resumed
from launcher.checks.stragglers import check_stragglers
from launcher.efficiency import check_efficiency, check_utilisation
from launcher.ladder import leg_steps
from launcher.legs import LegOutcome, RunContext, run_leg


def climb(ctx: RunContext, cmp: object = None) -> list[Check]:
    """Rung 3: its configured steps, on the accelerator unless --cpu."""
    return run_probe(ctx, ctx.cfg.rung(ctx.rung.name).steps, need_gpu=ctx.rung.needs_gpu)


def run_probe(ctx: RunContext, steps: int, need_gpu: bool) -> list[Check]:
    run_steps = ctx.cfg.rungs.run.steps
    plan = leg_steps(ctx.rung.name, steps, ctx.backend.can_terminate, ctx.rung.legs)  # what the plan shows
    first = run_leg(ctx, 0, plan[0])
    checks = [check_leg_exit(first)]
    if silent(first.events):
        return checks  # one answer naming the cause, not a rate or warm-up complaint
    if need_gpu:
        checks.append(check_device(first))
    checks += [check_sustained(first.events), check_memory(first.events, run_steps), check_cadence(first.events)]
    gpu_name, gpu_total = (ctx.gpus.name if ctx.gpus else None), ctx.gpus_total
    for extra in (
        check_breakdown(first.events),
        check_efficiency(first.events, gpu_name, gpu_total, run_steps),
        check_utilisation(first.events),
        check_stragglers(first.events),
    ):
        if extra is not None:
            checks.append(extra)
    pushed, pushed_step = check_pushed(first.events)
    checks.append(pushed)
    if not (pushed.ok and first.result.exit_code == 0):
        return checks
    second: LegOutcome = run_leg(ctx, 1, plan[1])
    checks.append(check_leg_exit(second))
    if need_gpu:
        checks.append(check_device(second))
    from launcher.checks.readback import check_leg_store
    from launcher.rungs.resume_legs import check_run_length, straight_and_exact

    store = ctx.open_store()
    checks += [
        check_resumed(second.events, pushed_step),
        check_pushed(second.events)[0],
        check_leg_store(store, second.events),
        check_run_length(second, steps),
    ]
    # With --cpu, the rehearsal's oracle: a straight-through run and exact comparisons. On a GPU
    # the band: the probe keeps the user's settings (it measures speed), so no deterministic mode.
    return checks + straight_and_exact(ctx, [first, second], steps, need_gpu)

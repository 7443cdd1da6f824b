"""Rungs 1 and 2 (rehearsal, smoke): train, push, then resume on a NEW empty disk.

Leg 0 trains to half the rung's steps and pushes a verified checkpoint; leg 1
starts on a fresh instance and must resume solely from the store, at exactly
the step leg 0 pushed, with the LR the schedule gives that step and the data
position right after the last batch leg 0 consumed. Smoke adds: the legs ran
on the accelerator.
"""

from __future__ import annotations

from launcher.evidence import Check, LegEvents
from launcher.legs import LegOutcome, RunContext, run_leg


def leg_plan(steps: int) -> list[int]:
    """LAUNCHER_MAX_STEPS for each leg: half the rung, then all of it."""
    return [steps // 2, steps]


def check_leg_exit(out: LegOutcome) -> Check:
    ev = out.events
    done = ev.last("done")
    ok = out.result.exit_code == 0 and done is not None and not out.result.killed
    stop = ev.last("stop")
    detail = (f"leg {ev.leg} exited {out.result.exit_code} ({out.result.end_reason}) after "
              f"{out.result.wall_seconds:.1f} s" + (f", last step {done[1]['step']}" if done else ", no `done` event"))
    if stop and stop[1].get("error"):
        detail += f"; stopped: {stop[1]['reason']}: {stop[1]['error']}"
    return Check(f"leg {ev.leg} finished", ok, detail, ev.pointer(done or stop))


def check_pushed(leg0: LegEvents) -> tuple[Check, int | None]:
    verified = [(n, e) for n, e in leg0.all("verify") if e.get("ok")]
    if not verified:
        return Check("leg 0 pushed a verified checkpoint", False, "no `verify` event with ok=true in leg 0"), None
    item = verified[-1]
    e = item[1]
    detail = f"{e['name']} verified: {e['windows']} windows, {e['bytes_read']} bytes read in {e['seconds']} s"
    return Check("leg 0 pushed a verified checkpoint", True, detail, leg0.pointer(item)), int(e["step"])


def check_resumed(leg1: LegEvents, pushed_step: int | None) -> Check:
    resume = leg1.first("resume")
    if resume is None:
        return Check("leg 1 resumed from the store", False, "leg 1 printed no `resume` event: it started from scratch")
    e = resume[1]
    ok = pushed_step is not None and e["from_step"] == pushed_step
    return Check("leg 1 resumed from the store", ok,
                 f"resumed from {e['checkpoint']} at step {e['from_step']}; leg 0 pushed step {pushed_step}",
                 leg1.pointer(resume))


def check_lr(leg1: LegEvents) -> Check:
    resume = leg1.first("resume")
    if resume is None or "lr_expected" not in resume[1]:
        return Check("LR restored", False, "no `resume` event with lr and lr_expected")
    e = resume[1]
    return Check("LR restored", e["lr"] == e["lr_expected"],
                 f"first resumed LR {e['lr']!r}, schedule says {e['lr_expected']!r} at step {e['from_step']}",
                 leg1.pointer(resume))


def check_position(leg0: LegEvents, leg1: LegEvents, pushed_step: int | None) -> Check:
    """The first batch leg 1 reads starts right after the last one leg 0 consumed
    up to the pushed step: never backwards, nothing skipped."""
    steps0 = {e["step"]: (n, e) for n, e in leg0.all("step")}
    first1 = leg1.first("step")
    resume = leg1.first("resume")
    if pushed_step is None or pushed_step not in steps0 or first1 is None or resume is None:
        return Check("data position continues", False, "missing step events around the resume")
    last0 = steps0[pushed_step][1]
    prev = steps0.get(pushed_step - 1)
    # The per-step stride in samples, from leg 0's own last two steps.
    batch = last0["sample_index"] - prev[1]["sample_index"] if prev else None
    expected = last0["sample_index"] + batch if batch else None
    got = first1[1]["sample_index"]
    ok = batch is not None and batch > 0 and got == expected == resume[1]["sample_index"]
    return Check("data position continues", ok,
                 f"leg 0 step {pushed_step} read samples from {last0['sample_index']} (batch {batch}); "
                 f"leg 1 resumed at sample {resume[1]['sample_index']} and read from {got} (expected {expected})",
                 leg0.pointer(steps0[pushed_step]) + leg1.pointer(first1))


def check_device(out: LegOutcome) -> Check:
    start = out.events.first("start")
    device = start[1].get("device") if start else None
    return Check(f"leg {out.events.leg} ran on the accelerator", device == "cuda",
                 f"device {device!r}", out.events.pointer(start))


def run_two_legs(ctx: RunContext, steps: int, need_gpu: bool) -> list[Check]:
    """Leg 0 trains and pushes; leg 1 resumes on a fresh disk. Returns the checks."""
    checks: list[Check] = []
    plan = leg_plan(steps)
    leg0 = run_leg(ctx, 0, plan[0])
    checks.append(check_leg_exit(leg0))
    pushed, pushed_step = check_pushed(leg0.events)
    checks.append(pushed)
    if need_gpu:
        checks.append(check_device(leg0))
    if not (checks[0].ok and pushed.ok):
        return checks  # nothing to resume from: leg 1 would only repeat the failure
    leg1 = run_leg(ctx, 1, plan[1])
    checks += [check_leg_exit(leg1), check_resumed(leg1.events, pushed_step), check_lr(leg1.events),
               check_position(leg0.events, leg1.events, pushed_step)]
    if need_gpu:
        checks.append(check_device(leg1))
    return checks

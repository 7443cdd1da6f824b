"""Rungs 1 and 2 (rehearsal, smoke): train, push, resume on a NEW empty disk — twice.

Three legs, each on a fresh instance: leg 0 trains a third of the rung's steps
and pushes; legs 1 and 2 must each resume solely from the store (two
sequential resumes, proof 8), at exactly the step the previous leg pushed,
with the LR the schedule gives that step (proof 3), the loss where the previous
leg's trend says (proof 4), and the data position right after the last batch
consumed — never backwards, nothing read twice, nothing skipped (proof 2).
Smoke adds: the legs ran on the accelerator.
"""

from __future__ import annotations

from runtime.contract import NO_SAMPLE_INDEX
from launcher.evidence import Check, LegEvents
from launcher.legs import LegOutcome, RunContext, run_leg
from runtime.metrics import loss_continuity

LEGS = 3


def leg_plan(steps: int, legs: int = LEGS) -> list[int]:
    """LAUNCHER_MAX_STEPS for each leg: equal shares, the last reaching `steps`."""
    return [steps * (i + 1) // legs for i in range(legs)]


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


def check_pushed(ev: LegEvents) -> tuple[Check, int | None]:
    """The newest checkpoint this leg pushed AND verified: the only one a resume may use."""
    name = f"leg {ev.leg} pushed a verified checkpoint"
    verified = [(n, e) for n, e in ev.all("verify") if e.get("ok")]
    if not verified:
        return Check(name, False, f"no `verify` event with ok=true in leg {ev.leg}"), None
    item = verified[-1]
    e = item[1]
    detail = f"{e['name']} verified: {e['windows']} windows, {e['bytes_read']} bytes read in {e['seconds']} s"
    return Check(name, True, detail, ev.pointer(item)), int(e["step"])


def check_resumed(ev: LegEvents, pushed_step: int | None) -> Check:
    resume = ev.first("resume")
    name = f"leg {ev.leg} resumed from the store"
    if resume is None:
        return Check(name, False, f"leg {ev.leg} printed no `resume` event: it started from scratch")
    e = resume[1]
    ok = pushed_step is not None and e["from_step"] == pushed_step
    ranks = {r["from_step"] for _, r in ev.all("resume", rank=None)}
    if len(ranks) > 1:
        ok = False
    return Check(name, ok, f"resumed from {e['checkpoint']} at step {e['from_step']}; leg {ev.leg - 1} pushed "
                 f"step {pushed_step}" + (f"; ranks disagree: {sorted(ranks)}" if len(ranks) > 1 else ""),
                 ev.pointer(resume))


def check_lr(ev: LegEvents) -> Check:
    resume = ev.first("resume")
    name = f"leg {ev.leg}: LR restored"
    if resume is None or "lr_expected" not in resume[1]:
        return Check(name, False, "no `resume` event with lr and lr_expected")
    e = resume[1]
    return Check(name, e["lr"] == e["lr_expected"],
                 f"first resumed LR {e['lr']!r}, schedule says {e['lr_expected']!r} at step {e['from_step']}",
                 ev.pointer(resume))


def check_position(before: LegEvents, after: LegEvents, pushed_step: int | None) -> Check:
    """The first batch the resumed leg reads starts right after the last one consumed
    up to the pushed step: never backwards, nothing skipped."""
    name = f"leg {after.leg}: data position continues"
    steps0 = {e["step"]: (n, e) for n, e in before.all("step")}
    first1, resume = after.first("step"), after.first("resume")
    if pushed_step is None or pushed_step not in steps0 or first1 is None or resume is None:
        return Check(name, False, "missing step events around the resume")
    last0 = steps0[pushed_step][1]
    prev = steps0.get(pushed_step - 1)
    if any("sample_index" not in e for e in (last0, first1[1], *(prev[1:] if prev else ()))):
        return Check(name, False, NO_SAMPLE_INDEX)
    stride = last0["sample_index"] - prev[1]["sample_index"] if prev else None  # samples per step
    expected = last0["sample_index"] + stride if stride else None
    got = first1[1]["sample_index"]
    ok = stride is not None and stride > 0 and got == expected == resume[1]["sample_index"]
    return Check(name, ok,
                 f"leg {before.leg} step {pushed_step} read from sample {last0['sample_index']} (stride {stride}); "
                 f"leg {after.leg} resumed at sample {resume[1]['sample_index']} and read from {got} "
                 f"(expected {expected}); batch {resume[1]['batch_hash'][:12]}",
                 before.pointer(steps0[pushed_step]) + after.pointer(first1))


def check_continuity(before: LegEvents, after: LegEvents) -> Check:
    name = f"leg {after.leg}: loss continuity"
    pre = [e["loss"] for _, e in before.all("step")]
    post = [e["loss"] for _, e in after.all("step")]
    result = loss_continuity(pre, post)
    if result is None:
        return Check(name, False, "too few steps on one side of the restart to measure")
    return Check(name, result.ok,
                 f"loss {pre[-1]:.5f} -> {post[0]:.5f} across the restart ({result.delta:+.5f}); band "
                 f"+-{result.band:.5f} (1.5 x the largest step-to-step jump of the last {result.window} steps)",
                 after.pointer(after.first("step")))


def check_no_reread(legs: list[LegEvents]) -> Check:
    """Across every leg, in order: each step reads the samples right after the previous step's."""
    steps = [(ev.leg, e) for ev in legs for _, e in ev.all("step")]
    name = f"no sample read twice or skipped ({len(legs)} legs, {len(steps)} steps)"
    if any("sample_index" not in e for _, e in steps):
        return Check(name, False, NO_SAMPLE_INDEX)
    seq = [(leg, e["step"], e["sample_index"]) for leg, e in steps]
    if len(seq) < 2:
        return Check(name, False, "fewer than two step events")
    stride = seq[1][2] - seq[0][2]
    bad = [(a, b) for a, b in zip(seq, seq[1:]) if b[2] - a[2] != stride or b[1] != a[1] + 1]
    if bad or stride <= 0:
        a, b = bad[0] if bad else (seq[0], seq[1])
        return Check(name, False, f"leg {a[0]} step {a[1]} read sample {a[2]}, then leg {b[0]} step {b[1]} read "
                     f"sample {b[2]} (stride {stride})")
    return Check(name, True, f"samples {seq[0][2]}..{seq[-1][2] + stride - 1} read once each, in order, "
                 f"stride {stride}, legs {[ev.leg for ev in legs]}")


def check_device(out: LegOutcome) -> Check:
    start = out.events.first("start")
    device = start[1].get("device") if start else None
    return Check(f"leg {out.events.leg} ran on the accelerator", str(device).startswith("cuda"),
                 f"device {device!r}", out.events.pointer(start))


def run_resume_legs(ctx: RunContext, steps: int, need_gpu: bool, legs: int = LEGS) -> list[Check]:
    """Leg 0 trains and pushes; every later leg resumes on a fresh disk. Returns the checks."""
    checks: list[Check] = []
    outs: list[LegOutcome] = []
    pushed_step: int | None = None
    for leg, max_steps in enumerate(leg_plan(steps, legs)):
        out = run_leg(ctx, leg, max_steps)
        outs.append(out)
        checks.append(check_leg_exit(out))
        if need_gpu:
            checks.append(check_device(out))
        if leg > 0:
            before = outs[-2].events
            checks += [check_resumed(out.events, pushed_step), check_lr(out.events),
                       check_position(before, out.events, pushed_step), check_continuity(before, out.events)]
        pushed, pushed_step = check_pushed(out.events)
        checks.append(pushed)
        if not (checks[-1].ok and out.result.exit_code == 0):
            return checks  # nothing sound to resume from: the next leg would only repeat the failure
    checks.append(check_no_reread([o.events for o in outs]))
    return checks

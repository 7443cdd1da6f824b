"""`launcher drill preempt --notice S`: a spot machine taken with notice. When rank 0 prints the
planned step the leg gets SIGTERM, and S seconds later the instance is killed unless the leg
ended by itself (S = 0: killed at that step, no SIGTERM). Then a fresh leg on an empty disk
runs to the end. Presets (`--notice aws|gcp|azure|k8s`): launcher.cadence.NOTICE_S.

The evidence, from the killed leg's own events against the launcher's own read of the store:
when the notice came, what the leg did with it (its `stop`, the final save, push and verify,
each timed from the notice), whether that checkpoint reached *verified* before the kill, where
the next leg resumed (the final checkpoint if it verified, else the previous verified one,
never an unverified one), and the work lost, in steps and seconds.
"""

from __future__ import annotations

import os
from typing import Any

from launcher.backends.local import trainer_python
from launcher.checks.evidence import Check, Kind, LegEvents
from launcher.checks.kills import Kill, check_resumed_newest, check_store_after_kill, read_states
from launcher.checks.leg import check_leg_exit
from launcher.checks.readback import StateReader
from launcher.leg_env import Ending
from launcher.legs import LegOutcome, RunContext, run_leg
from launcher.rungs.resume_legs import check_run_length
from runtime.store.base import newest_verified
from runtime.store.seal import KEY_ENV


def climb(ctx: RunContext, steps: int, notice_s: float, at_step: int) -> list[Check]:
    """Leg 0 preempted at `at_step` with `notice_s` of notice; leg 1 resumes and finishes."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV} | ctx.secrets()
    reader = StateReader(trainer_python(ctx.cfg.trainer.command), ctx.store_uri, f"runs/{ctx.run_id}", env)
    try:
        store = ctx.open_store()
        first = run_leg(ctx, 0, steps, ending=Ending(sigterm_at=at_step, notice_s=notice_s))
        newest = newest_verified(store)
        expected = newest.step if newest else None
        kill = Kill(
            0,
            f"preempt with {notice_s:g} s notice",
            "",
            expected,
            check_store_after_kill(store, [first], expected, "the preemption"),
        )
        kill.reads = read_states(reader, store, [first], expected)
        last = run_leg(ctx, 1, steps)
    finally:
        reader.close()
    return [
        check_notice(first, notice_s, at_step, expected),
        *([kill.store_check] if kill.store_check else []),
        check_resumed_newest(last.events, kill),
        check_work_lost(first.events, last.events, notice_s),
        check_leg_exit(last),
        check_run_length(last, steps),
    ]


def _seconds_after(ev: LegEvents, kind: str, t0: float, step: int | None) -> float | None:
    """Seconds from the notice to the first `kind` event (of `step`, when given) after it."""
    for _, e in ev.all(kind):
        if float(e.get("t", 0.0)) >= t0 and (step is None or e.get("step") == step):
            return round(float(e["t"]) - t0, 3)
    return None


def notice_timeline(ev: LegEvents, t0: float) -> dict[str, Any]:
    """What the leg did with the notice, each timed from it: its stop, and the final checkpoint's
    save, push and verify (the step it stopped at)."""
    stop = next(((n, e) for n, e in ev.all("stop") if float(e.get("t", 0.0)) >= t0), None)
    step = int(stop[1]["step"]) if stop and isinstance(stop[1].get("step"), int) else None
    out: dict[str, Any] = {"stop_reason": stop[1].get("reason") if stop else None, "stop_step": step}
    for kind in ("stop", "save", "push", "verify", "done"):
        out[f"{kind}_s"] = _seconds_after(ev, kind, t0, None if kind in ("stop", "done") else step)
    return out


def check_notice(out: LegOutcome, notice_s: float, at_step: int, expected: int | None) -> Check:
    """With notice: the leg stopped on it and its final checkpoint verified before the kill. With
    none: nothing can be saved; the check states where the store stood."""
    ev, leg = out.events, out.events.leg
    name = f"leg {leg}: the final checkpoint within the {notice_s:g} s notice"
    sent = out.acted_at
    if sent is None:
        return Check(
            name,
            False,
            f"leg {leg} ended ({out.result.end_reason}) before step {at_step}: the preemption "
            "never came; raise the drill's steps or lower --at-step",
            kind=Kind.PREEMPT_NOTICE,
            leg=leg,
        )
    if notice_s == 0:
        return Check(
            name,
            True,
            f"no notice: killed at step {at_step}; the store's newest verified checkpoint was step {expected}",
            kind=Kind.PREEMPT_NOTICE,
            leg=leg,
            facts={"expected": expected},
        )
    t = notice_timeline(ev, sent)
    facts = {**t, "notice_s": notice_s, "expected": expected, "killed": out.result.killed}
    steps = f"stop {t['stop_s']} s, save {t['save_s']} s, push {t['push_s']} s, verify {t['verify_s']} s"
    ok = t["stop_step"] is not None and t["verify_s"] is not None and expected == t["stop_step"]
    if ok:
        return Check(
            name,
            True,
            f"SIGTERM at step {at_step}; stopped at step {t['stop_step']} and its checkpoint "
            f"verified {t['verify_s']} s into the notice ({steps}): margin "
            f"{notice_s - t['verify_s']:.1f} s",
            ev.pointer(ev.last("verify")),
            kind=Kind.PREEMPT_NOTICE,
            leg=leg,
            facts=facts,
        )
    why = (
        "the leg never stopped on the SIGTERM"
        if t["stop_step"] is None
        else f"it stopped at step {t['stop_step']}, but that checkpoint did not verify before the kill"
    )
    return Check(
        name,
        False,
        f"SIGTERM at step {at_step}, killed {notice_s:g} s later ({out.result.end_reason}): "
        f"{why} ({steps}); the store's newest verified checkpoint is step {expected}",
        kind=Kind.PREEMPT_NOTICE,
        leg=leg,
        facts=facts,
    )


def check_work_lost(
    killed: LegEvents,
    resumed: LegEvents,
    notice_s: float | None,
    cause: str = "the preemption",
    end: float | None = None,
) -> Check:
    """The steps the lost leg trained past the checkpoint the next one resumed from, and the
    seconds they took (to `end`, the leg's end, where the time after its last step was lost too,
    as a hung rank's is): what the loss cost (a statement; the drill's other checks judge)."""
    trained = {int(e["step"]): float(e.get("t", 0.0)) for _, e in killed.all("step")}
    resume = resumed.first("resume")
    at = int(resume[1]["from_step"]) if resume else 0
    last = max(trained, default=0)
    lost = max(0, last - at)
    start = trained.get(at) if at in trained else (min(trained.values()) if trained else None)
    until = end if end is not None else trained.get(last)
    seconds = round(until - start, 2) if (lost or end is not None) and start is not None and until else 0.0
    how = "" if notice_s is None else f" ({notice_s:g} s of notice)" if notice_s else " (no notice)"
    spent = "of training" if end is None else "from that checkpoint's step to the leg's end"
    return Check(
        f"leg {killed.leg}: work lost to {cause}",
        True,
        f"{lost} steps ({seconds} s {spent}): leg {killed.leg} trained to step {last}, leg "
        f"{resumed.leg} resumed at step {at}{how}",
        kind=Kind.WORK_LOST,
        leg=killed.leg,
        facts={"steps": lost, "seconds": seconds, "resumed_at": at},
    )

"""Gradient accumulation, read from the step events: how many steps (micro-batches) the loop
takes per optimizer step, and whether each resume came at the end of such a window.

Every step event of a leg whose optimizer is tracked carries `opt_steps`, the tracked
optimizer's steps so far in that leg. A step at which it rose is a window's end (the optimizer
stepped there); the gaps between window ends are the window: K micro-batches per optimizer step,
the most common gap in the straight-through run (else within each leg) (an epoch's last window may be shorter, as Accelerate's `accumulate` closes
it at the loader's end; a GradScaler that skips an overflowing step makes one gap a multiple).

A checkpoint taken between two window ends holds the weights and the optimizer as of the last
window end, not the gradients accumulated since: measured on the reference trainer with K=4 and
an Accelerate loop with `accumulate` (K=4), resumed at micro-steps 5 and 13, and 16: the
resumed leg's first optimizer step took only the micro-batches left in that window, and the
loss left the straight-through run's at the step after it. Without this check the rehearsal
said "first difference at step 9: loss", and proof 3 was MISSING ("neither the tracked
optimizer nor any other stepped") for a leg shorter than one window.

A trainer that keeps its accumulated gradients in the checkpoint resumes inside a window
exactly: where the straight-through run is compared exactly, a loss after the resumed leg's
first window end equal to the straight run's clears that resume.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents, surviving_timeline
from launcher.checks.resume import resume_step, resumed_legs, same_loss, steps_of


def window_ends(ev: LegEvents) -> list[int] | None:
    """The steps of this leg at which the tracked optimizer stepped (`opt_steps` rose since the
    leg's previous step event; at its first, above 0). None: a step event without `opt_steps`."""
    ends: list[int] = []
    before = 0
    for s, (_, e) in sorted(steps_of(ev).items()):
        if "opt_steps" not in e:
            return None
        now = int(e["opt_steps"])
        if now > before:
            ends.append(s)
        before = now
    return ends


@dataclass(frozen=True)
class Windows:
    """The run's accumulation window: `size` micro-batches per optimizer step (the most common
    gap between window ends within a leg), and every gap seen."""

    size: int
    gaps: tuple[int, ...]

    @property
    def constant(self) -> bool:
        return set(self.gaps) == {self.size}

    def said(self) -> str:
        if self.constant:
            return f"{self.size} micro-batches per optimizer step, constant"
        other = sorted(set(self.gaps) - {self.size})
        return f"{self.size} micro-batches per optimizer step ({len(self.gaps)} windows; also {other}: an epoch's end?)"


def _gaps(ev: LegEvents) -> list[int] | None:
    """The gaps between this leg's consecutive window ends (from step 0 for a fresh leg)."""
    ends = window_ends(ev)
    if ends is None:
        return None
    if ends and resume_step(ev) is None:
        ends = [0] + ends
    return [b - a for a, b in zip(ends, ends[1:])]


def measure(legs: list[LegEvents], straight: LegEvents | None = None) -> Windows | None:
    """The window from the straight-through run's window ends, one uninterrupted leg, where it has
    two; else from every leg's own (a gap across a resume is not a window: it may have moved).
    None: no `opt_steps`, or no two window ends in one leg."""
    gaps: list[int] = []
    for group in ([straight] if straight is not None else [], legs):
        found = [_gaps(ev) for ev in group]
        if any(g is None for g in found):
            return None
        gaps = [x for g in found for x in g or []]
        if gaps:
            break
    if not gaps:
        return None
    counts = Counter(gaps)
    size = min(counts, key=lambda g: (-counts[g], g))
    return Windows(size, tuple(gaps))


@dataclass(frozen=True)
class Inside:
    """A resume between two window ends: `held` micro-batches accumulated since the last end."""

    leg: LegEvents
    at: int
    held: int
    after: int | None
    """The resumed leg's first window end, if it reached one."""
    restored: bool
    """The straight-through run's loss after that window end, exactly: the gradients came back."""


def insides(legs: list[LegEvents], windows: Windows, straight: LegEvents | None, exact: bool) -> list[Inside]:
    """Each resume whose step is not a window end on the surviving timeline before it (a gap a
    multiple of the window is an end the optimizer skipped, a GradScaler's overflow)."""
    timeline = surviving_timeline(legs)
    ref = steps_of(straight) if straight is not None and exact else {}
    found = []
    for i in resumed_legs(legs):
        at = resume_step(legs[i]) or 0
        last = max((s for ev in timeline[:i] for s in window_ends(ev) or [] if s <= at), default=0)
        held = (at - last) % windows.size
        if not held:
            continue
        after = next(iter(window_ends(legs[i]) or []), None)
        mine = steps_of(legs[i])
        nxt = None if after is None else after + 1
        restored = nxt in mine and nxt in ref and same_loss(mine[nxt][1]["loss"], ref[nxt][1]["loss"])
        found.append(Inside(legs[i], at, held, after, restored))
    return found


def _lost(x: Inside, k: int) -> str:
    """What became of the `held` micro-batches, from where the resumed leg's first window ended."""
    n = f"{x.held} micro-batch{'es' if x.held > 1 else ''}'{'' if x.held > 1 else 's'} gradients"
    head = f"resumed at micro-step {x.at} inside an accumulation window of {k}: {n} lost at the resume"
    if x.after is None:
        return head + f" (leg {x.leg.leg} ended before its first optimizer step)"
    if x.after - x.at == k - x.held:
        summed = f"{k - x.held} micro-batch{'es' if k - x.held > 1 else ''}"
        return head + f" (its first optimizer step, at micro-step {x.after}, summed {summed} of {k})"
    if x.after - x.at == k:
        return (
            head + f", and every later window moved {x.held} micro-steps (the loop counts its windows from the resume)"
        )
    return head + f" (its first optimizer step came {x.after - x.at} micro-steps after the resume)"


FIX: dict[str | None, str] = {
    None: "call `sess.step()` once per optimizer step (after `opt.step()`), so that every checkpoint, "
    "a stop's too, is at a window's end; or keep the accumulated gradients in the checkpoint",
    "accelerate": "the adapter saves at any `pf.step()` (a stop's checkpoint too): gradient accumulation "
    "counted in micro-batches is not supported (README)",
}
"""The fix, by the adapter the `start` event names (None: the Session)."""


def _adapter(legs: list[LegEvents]) -> str | None:
    start = next((ev.first("start") for ev in legs if ev.first("start") is not None), None)
    return start[1].get("adapter") if start else None


def check_accumulation(legs: list[LegEvents], straight: LegEvents | None, exact: bool) -> Check | None:
    """One run: with more than one micro-batch per optimizer step, every resume at a window's end.
    None: no accumulation (one step event per optimizer step), or no `opt_steps` to say."""
    windows = measure(legs, straight) if resumed_legs(legs) else None
    if windows is None or windows.size == 1:
        return None
    k = windows.size
    found = insides(legs, windows, straight, exact)
    shown = any(x.restored for x in found)  # a leg that ended before its window's end shows nothing either way
    bad = [x for x in found if not x.restored and not (shown and x.after is None)]
    resumes = [resume_step(legs[i]) for i in resumed_legs(legs)]
    facts: dict[str, Any] = {
        "micro_per_step": k,
        "constant": windows.constant,
        "inside": [{"leg": x.leg.leg, "step": x.at, "held": x.held, "restored": x.restored} for x in found],
    }
    name = "resumes at the end of an accumulation window"
    if bad:
        x = bad[0]
        more = f"; also inside a window: micro-steps {[y.at for y in bad[1:]]}" if len(bad) > 1 else ""
        return Check(
            name,
            False,
            f"{_lost(x, k)}{more} ({windows.said()}): {FIX.get(_adapter(legs), FIX[None])}",
            x.leg.pointer(x.leg.first("resume")),
            kind=Kind.ACCUMULATION,
            leg=x.leg.leg,
            facts=facts,
        )
    kept = (
        f"; inside a window at {[x.at for x in found]}: the gradients came back (the loss after its next optimizer "
        "step = the straight-through run's)"
        if found
        else ""
    )
    return Check(
        name,
        True,
        f"{windows.said()}; resumed at micro-steps {resumes}{kept}",
        kind=Kind.ACCUMULATION,
        leg=legs[-1].leg,
        facts=facts,
    )


def within_first_window(legs: list[LegEvents], i: int, straight: LegEvents | None = None) -> bool:
    """Resumed leg i ended before its first optimizer step could come, fewer micro-steps after the
    resume than one accumulation window: its tracked optimizer's 0 steps say nothing (proof 3)."""
    windows = measure(legs, straight)
    steps = steps_of(legs[i])
    if windows is None or windows.size == 1 or not steps:
        return False
    return not window_ends(legs[i]) and max(steps) - (resume_step(legs[i]) or 0) < windows.size

"""When a drill kills: the moments read from a leg's own events as it runs, and the kills
`--at auto` places from the events of the straight-through run (launcher/rungs/drill.py says
what each moment means)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from launcher.checks.evidence import LegEvents
from runtime.events import parse_line

MOMENTS = ("after-push", "mid-save", "mid-push", "mid-verify", "mid-step")
RANDOM_MOMENTS = ("after-push", "mid-push", "mid-verify", "mid-step")
"""What `random` picks from: the moments every trainer has (a synchronous save has no mid-save)."""


NODE_LOST = "node-lost"
"""On a leg of several nodes: the last node alone dies mid-push (the `mid-push` line); the rest
of the cluster goes on until its job ends it."""


def kill_predicate(moment: str) -> Callable[[str], bool]:
    """True on the output line at which to kill, for one leg (state kept per leg)."""
    seen = {"cycled": False, "steps_after": 0}
    moment = "mid-push" if moment == NODE_LOST else moment

    def at(line: str) -> bool:
        event = parse_line(line)
        if event is None or event.get("rank", 0) != 0:
            return False
        kind, cycled = event["event"], seen["cycled"]
        if kind == "prune":
            seen["cycled"] = True
            return moment == "after-push"
        if not cycled:
            return False
        if kind == "step":
            seen["steps_after"] += 1
        background = kind == "save" and event.get("async_save") is True
        return {
            "mid-save": background,
            "mid-push": kind == "serialized" or (kind == "save" and not background),
            "mid-verify": kind == "push",
            "mid-step": kind == "step" and seen["steps_after"] == 2,
        }.get(moment, False)

    return at


AUTO = "auto"


@dataclass(frozen=True)
class Planned:
    """One kill of a drill: at a moment (MOMENTS), or when rank 0 prints `step` (`how` is
    "step": SIGKILL there; "sigterm": a graceful SIGTERM there)."""

    how: str
    step: int | None = None

    @property
    def name(self) -> str:
        if self.how == "sigterm":
            return f"by SIGTERM at step {self.step}"
        return f"at step {self.step}" if self.how == "step" else self.how


def lr_turns(ev: LegEvents, after: int) -> int | None:
    """The first step after `after` where the LR's course changes: it had held and now moves
    (a plateau cut), or it had risen and now does not (the end of warm-up)."""
    lrs = [(int(e["step"]), float(e["lr"])) for _, e in ev.all("step") if isinstance(e.get("lr"), (int, float))]
    for (_, a), (_, b), (s, c) in zip(lrs, lrs[1:], lrs[2:]):
        before, now = b - a, c - b
        if s > after and ((before == 0 and now != 0) or (before > 0 >= now)):
            return s
    return None


def epoch_starts(ev: LegEvents, after: int) -> int | None:
    """The first step after `after` whose printed `epoch` is not the step before's."""
    epochs = [(int(e["step"]), e["epoch"]) for _, e in ev.all("step") if "epoch" in e]
    for (_, a), (s, b) in zip(epochs, epochs[1:]):
        if s > after and a != b:
            return s
    return None


def auto_plan(kills: int, steps: int, straight: LegEvents | None) -> list[Planned]:
    """Where `--at auto` puts each kill (module docstring). Every kill after the first storage
    cycle of the straight run (a kill before it would test only a fresh start), in step order,
    each before the run's last step."""
    cycled = next((int(e["step"]) for _, e in straight.all("prune")), None) if straight else None
    first = cycled if cycled is not None else max(1, steps // (kills + 2))
    marks: list[Planned] = []
    if straight is not None:
        turn = lr_turns(straight, first)
        if turn is not None and turn + 1 < steps:
            marks.append(Planned("step", turn + 1))  # just after the LR's course changed
        boundary = epoch_starts(straight, first)
        if boundary is not None and boundary + 1 < steps:
            marks.append(Planned("sigterm", boundary + 1))  # just after the epoch boundary
    if not any(m.how == "sigterm" for m in marks) and kills > len(marks):
        marks.append(Planned("sigterm"))  # a graceful stop mid-run, placed below
    while len(marks) < kills:
        marks.append(Planned("step"))  # spread between, placed below
    marks = marks[:kills]
    fixed = sorted({m.step for m in marks if m.step is not None})
    free = [m for m in marks if m.step is None]
    # the steps left free go evenly into the gaps, each at least one step from the others
    spots = [s for s in range(first + 2, steps) if all(abs(s - f) > 1 for f in fixed)]
    chosen = [spots[(i + 1) * len(spots) // (len(free) + 1)] for i in range(len(free))] if spots else []
    placed = [m for m in marks if m.step is not None] + [Planned(m.how, step) for m, step in zip(free, chosen)]
    return sorted(placed, key=lambda m: m.step or 0)


def planned_kills(
    kills: int, moment: str, kills_at: list[int] | None, steps: int, straight: LegEvents | None, rng: random.Random
) -> list[Planned]:
    if kills_at:
        return [Planned("step", s) for s in kills_at]
    if moment == AUTO:
        return auto_plan(kills, steps, straight)
    return [Planned(rng.choice(RANDOM_MOMENTS) if moment == "random" else moment) for _ in range(kills)]


def step_predicate(step: int) -> Callable[[str], bool]:
    """True on rank 0's step event for `step` (or a later one)."""

    def at(line: str) -> bool:
        event = parse_line(line)
        return (
            event is not None and event["event"] == "step" and event.get("rank", 0) == 0 and int(event["step"]) >= step
        )

    return at

"""When a drill kills: the moments read from a leg's own events as it runs, the kills
`--at auto` places from the events of the straight-through run, the epoch moments placed there
too, and `--at` read as one moment or a list of one per kill (launcher/rungs/drill.py says what
each moment means)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from launcher.checks.evidence import LegEvents
from launcher.errors import BadInput
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
EPOCH_MOMENTS = ("mid-epoch", "epoch-end", "mid-epoch-1")
"""Graceful SIGTERMs placed from the straight-through run's `epoch` so that the next leg resumes
exactly there, in this order in any run: the middle of the first epoch, its last step (the next
leg starts the second epoch), the middle of the second epoch."""
EVERY_KILL = (AUTO, *MOMENTS, "random", NODE_LOST)
"""The moments one `--at` may name for every kill (an epoch moment is one step: once a drill)."""
DEFAULT_KILLS = 2


@dataclass(frozen=True)
class Planned:
    """One kill of a drill: at a moment (MOMENTS), or when rank 0 prints `step` (`how` is
    "step": SIGKILL there; "sigterm": a graceful SIGTERM there, the leg held at that step until
    it comes). `moment`: the epoch moment that placed it, if one did."""

    how: str
    step: int | None = None
    moment: str = ""

    @property
    def name(self) -> str:
        if self.how == "sigterm":
            return f"{self.moment + ' ' if self.moment else ''}by SIGTERM at step {self.step}"
        return f"at step {self.step}" if self.how == "step" else self.how


def parse_at(text: str, kills: int | None, gpu: bool, kills_at: bool = False) -> tuple[list[str], int]:
    """`--at`: one moment for every kill (`--kills`, default 2), or a comma list of one moment per
    kill in order (`--kills` defaults to its length; another count is refused). The moments and
    the kills; bad input (exit 2) otherwise."""
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in (*EVERY_KILL, *EPOCH_MOMENTS):
            known = ", ".join((*EVERY_KILL, *EPOCH_MOMENTS))
            raise BadInput(f"--at takes one of {known}, or a comma list of them (one per kill); got {name!r}")
    if len(names) == 1 and names[0] in EVERY_KILL:
        return names, DEFAULT_KILLS if kills is None else kills
    if kills_at:
        raise BadInput("--kills-at places every kill at a step of its own: it takes no --at list or epoch moment")
    if AUTO in names:
        raise BadInput("--at auto places every kill itself: it takes no list")
    epochs = [n for n in names if n in EPOCH_MOMENTS]
    if epochs != sorted(set(epochs), key=EPOCH_MOMENTS.index):
        raise BadInput(
            f"--at {text}: the epoch moments come once each, in the run's order ({', '.join(EPOCH_MOMENTS)}): "
            "a leg resumed past one cannot stop there"
        )
    if kills is not None and kills != len(names):
        named = f"{len(names)} moment{'s' if len(names) > 1 else ''}"
        raise BadInput(f"--kills {kills}, but --at names {named}, one per kill: leave --kills out")
    if epochs and gpu:
        raise BadInput(
            f"--at {epochs[0]} is placed from the straight-through run's epochs, and a GPU drill runs "
            "none: drill it on the CPU (no --gpus)"
        )
    return names, len(names)


def lr_turns(ev: LegEvents, after: int) -> int | None:
    """The first step after `after` where the LR's course changes: it had held and now moves
    (a plateau cut), or it had risen and now does not (the end of warm-up)."""
    lrs = [(int(e["step"]), float(e["lr"])) for _, e in ev.all("step") if isinstance(e.get("lr"), (int, float))]
    for (_, a), (_, b), (s, c) in zip(lrs, lrs[1:], lrs[2:]):
        before, now = b - a, c - b
        if s > after and ((before == 0 and now != 0) or (before > 0 >= now)):
            return s
    return None


def epoch_spans(straight: LegEvents) -> list[tuple[object, int, int]]:
    """(epoch, first step, last step) of each epoch rank 0's steps printed, in run order."""
    spans: list[tuple[object, int, int]] = []
    for _, e in straight.all("step"):
        if "epoch" not in e:
            continue
        step, epoch = int(e["step"]), e["epoch"]
        if spans and spans[-1][0] == epoch:
            spans[-1] = (epoch, spans[-1][1], step)
        else:
            spans.append((epoch, step, step))
    return spans


def epoch_starts(ev: LegEvents, after: int) -> int | None:
    """The first step after `after` whose printed `epoch` is not the step before's."""
    return next((first for _, first, _ in epoch_spans(ev)[1:] if first > after), None)


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


class Unplaced(ValueError):
    """An epoch moment the straight-through run has no place for (its message says why)."""


def place_epoch(moment: str, straight: LegEvents | None) -> Planned:
    """The graceful stop an epoch moment asks for (EPOCH_MOMENTS), at the step after which the
    next leg must resume: the middle of an epoch (half its steps done, at least one left in it)
    or the first epoch's last step. Unplaced, naming the run's epochs, where the run has none."""
    spans = epoch_spans(straight) if straight is not None else []
    seen = ", ".join(f"epoch {e} at steps {a}-{b}" for e, a, b in spans)
    want = 1 if moment == "mid-epoch-1" else 0
    why = ""
    if not spans:
        why = "needs steps that print their `epoch` (sess.step(..., epoch=...)); the straight-through run's print none"
    elif len(spans) < 2 and moment != "mid-epoch":
        why = f"needs a second epoch: the straight-through run had {seen} (raise rungs.drill.steps)"
    elif moment != "epoch-end" and spans[want][1] == spans[want][2]:
        why = f"needs an epoch of two steps or more: the straight-through run had {seen}"
    if why:
        raise Unplaced(f"--at {moment} {why}")
    _, first, last = spans[want]
    step = last if moment == "epoch-end" else first + (last - first + 1) // 2 - 1
    return Planned("sigterm", step, moment)


def planned_kills(
    kills: int,
    moments: list[str],
    kills_at: list[int] | None,
    steps: int,
    straight: LegEvents | None,
    rng: random.Random,
) -> list[Planned]:
    """One Planned per kill: `kills_at`'s steps, `auto`'s placement, or `moments` (parse_at's: one
    for every kill or one per kill). Raises Unplaced for an epoch moment the run has no room for."""
    if kills_at:
        return [Planned("step", s) for s in kills_at]
    if moments == [AUTO]:
        return auto_plan(kills, steps, straight)
    each = moments * kills if len(moments) == 1 else moments
    return [
        place_epoch(m, straight) if m in EPOCH_MOMENTS else Planned(rng.choice(RANDOM_MOMENTS) if m == "random" else m)
        for m in each
    ]


def step_predicate(step: int) -> Callable[[str], bool]:
    """True on rank 0's step event for `step` (or a later one)."""

    def at(line: str) -> bool:
        event = parse_line(line)
        return (
            event is not None and event["event"] == "step" and event.get("rank", 0) == 0 and int(event["step"]) >= step
        )

    return at

"""Checks with evidence: every claim points at an event line (leg + line number).

The host reads the legs' host-side logs (never the instance's disk, which is
gone) through the same parser the runtime's printer defines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from runtime.contract import exit_code_of
from runtime.events import DAMAGED, iter_events


@dataclass(frozen=True)
class Pointer:
    """Where a claim's evidence is: leg, log file, 1-based line, the line itself."""

    leg: int
    log: str
    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"leg": self.leg, "log": self.log, "line": self.line, "text": self.text}


class Kind(StrEnum):
    """What a check is, for the readers that select checks (the report, the gate): a stable id
    they match instead of a check's wording, which is free to change. A check nobody selects
    carries none."""

    READBACK = "readback"
    """The launcher read back the checkpoint a leg's events call verified (`leg` set)."""
    STORE_AFTER_KILL = "store_after_kill"
    """The store after a drill's kill or SIGTERM holds the newest verified checkpoint, read back (`leg`)."""
    STOPPED_AS_ASKED = "stopped_as_asked"
    """A leg the launcher ended by SIGTERM or its deadline stopped on it (`leg`; facts: want, got)."""
    LEG_FINISHED = "leg_finished"
    """A leg ended on its own, every rank's `done` printed (`leg`)."""
    RESUMED_NEWEST = "resumed_newest"
    """A drill's leg resumed from the newest verified checkpoint at the kill, by the launcher's own
    read of the store (`leg`; facts: resumed_at, expected, state)."""
    CPU_DETERMINISM = "cpu_determinism"
    """Two straight-through runs of a CPU rung disagreed: the trainer does not reproduce itself."""
    GPU_EXACT = "gpu_exact"
    """Every GPU leg held the deterministic mode: the re-run steps are compared exactly."""
    GPU_BAND = "gpu_band"
    """A GPU leg ran an op without a deterministic kernel (or without the mode): compared within the band."""


@dataclass(frozen=True)
class Check:
    """One pass/fail answer with the numbers it rests on."""

    name: str
    ok: bool
    detail: str
    evidence: tuple[Pointer, ...] = ()
    missing: bool = False
    """Not answerable from what the leg printed (no batch hashes, say): never a pass."""
    kind: str = ""
    """A `Kind` where a reader selects the check; its readers never match `name` or `detail`."""
    leg: int | None = None
    """The leg the check is about, where it is about one."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Structured fields a reader uses (numbers, steps), so that none parses `detail`."""

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "ok": self.ok, "detail": self.detail,
               "evidence": [p.to_json() for p in self.evidence]}
        if self.missing:
            out["missing"] = True
        if self.kind:
            out["kind"] = str(self.kind)
        if self.leg is not None:
            out["leg"] = self.leg
        if self.facts:
            out["facts"] = self.facts
        return out


def find(checks: list[dict[str, Any]], kind: Kind, leg: int | None = None, ok: bool | None = None
         ) -> list[dict[str, Any]]:
    """The recorded checks (ledger rows, `Check.to_json`) of `kind`, of leg `leg` if given,
    passed or failed if `ok` is given: how the report and the gate select checks."""
    return [c for c in checks if c.get("kind") == kind and (leg is None or c.get("leg") == leg)
            and (ok is None or bool(c.get("ok")) == ok)]


@dataclass
class LegEvents:
    """The events of one leg's log, in order, each with its line number."""

    leg: int
    log: Path
    items: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def read(cls, leg: int, log: Path) -> "LegEvents":
        if not log.is_file():
            return cls(leg, log)
        with log.open(encoding="utf-8", errors="replace") as fh:
            return cls(leg, log, list(iter_events(fh)))

    def all(self, name: str, rank: int | None = 0) -> list[tuple[int, dict[str, Any]]]:
        """Events called `name` printed by `rank` (None: every rank)."""
        return [(n, e) for n, e in self.items
                if e["event"] == name and (rank is None or e.get("rank", 0) == rank)]

    def first(self, name: str, rank: int | None = 0) -> tuple[int, dict[str, Any]] | None:
        found = self.all(name, rank)
        return found[0] if found else None

    def last(self, name: str, rank: int | None = 0) -> tuple[int, dict[str, Any]] | None:
        found = self.all(name, rank)
        return found[-1] if found else None

    def damaged(self) -> list[dict[str, Any]]:
        """Lines that claimed to be events and were not usable ones: shown, never used as evidence."""
        return [{"leg": self.leg, "line": n, "reason": e["reason"], "kind": e.get("kind")}
                for n, e in self.items if e["event"] == DAMAGED]

    def pointer(self, item: tuple[int, dict[str, Any]] | None) -> tuple[Pointer, ...]:
        if item is None:
            return ()
        lineno, event = item
        return (Pointer(self.leg, str(self.log), lineno, json.dumps(event)),)


def upto(ev: LegEvents, step: int) -> LegEvents:
    """The leg's events with its step events after `step` dropped: what survived a
    kill that lost everything after the checkpoint at `step`."""
    return LegEvents(ev.leg, ev.log, [(n, e) for n, e in ev.items if not (e["event"] == "step" and e["step"] > step)])


def surviving_timeline(legs: list[LegEvents]) -> list[LegEvents]:
    """Each leg's steps up to where the next leg resumed: the updates that survived
    (a leg the next one did not resume from keeps none; the last keeps all)."""
    out = []
    for ev, nxt in zip(legs, legs[1:] + [None]):
        if nxt is None:
            out.append(ev)
            continue
        resume = nxt.first("resume")
        out.append(upto(ev, int(resume[1]["from_step"]) if resume else 0))
    return out


NO_EVENTS = ("the trainer printed no preflight events: it does not speak the leg contract (README, "
             "'Bring your own trainer': runtime.session.Session, or the events listed there)")


def last_line(path: Path) -> str:
    """The last non-blank line of a leg's log (what it said before it ended)."""
    if not path.is_file():
        return "(no log)"
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(empty log)"


def silent(ev: LegEvents) -> bool:
    """The leg's log holds no event line at all (damaged ones count as events: they tried)."""
    return not ev.items


def exit_code_from_events(events: LegEvents) -> int | None:
    """The leg's own verdict, read from its events (runtime.contract.exit_code_of): for
    backends whose transport reports something else (SkyPilot's tail_logs returns a JobExitCode)."""
    done, stop = events.last("done"), events.last("stop")
    return exit_code_of(done[1] if done else None, stop[1] if stop else None)

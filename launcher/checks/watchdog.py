"""A leg watched, not trusted: each rank's events against the leg's own rhythm (docs/watchdog.md).

Every rank that prints events is followed on its own. A rank is *silent* from its last event of
any kind (a step, a save, a push, a log line of the contract); its silence is judged against a
limit that depends on what the rank was doing:

- before its first step in the leg (start-up: imports, the restore, the first batch):
  `first_step_s`;
- while it steps: `multiple` x the 99th percentile of the gaps between its own events in this
  leg so far, never under `floor_s` (with fewer than `min_gaps` gaps: the largest of them; after
  its first step, before any gap: `first_step_s` still, the second step may be warming up);
- after a `stop` event (the final checkpoint and its cycle): `finish_s`;
- after a `hold` (the launcher placed it) or `done`: not judged.

A rank silent past its limit is a *suspect*, with the numbers that made it one. What a suspect
leg's processes are doing is then read from them (`LiveWatch.second_look`), and only a leg that
look shows hung (`confirm`) is ended. The policy is pure: times are passed in, so the same code
judges a live leg and a recorded log (scripts/watchdog_replay.py).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.backends.looks import Look, collective_in, look
from launcher.config.schema import WatchdogConfig
from runtime.events import MARKER, parse_line

STEPPING, STARTING, FINISHING, QUIET = "stepping", "starting", "finishing", "quiet"
WAITING_ALL = "every rank waits in a collective"
"""How `confirm` begins where no process is stopped but every rank waits (a second look must agree)."""


@dataclass(frozen=True)
class Policy:
    multiple: float = 5.0
    floor_s: float = 15.0
    first_step_s: float = 900.0
    finish_s: float = 900.0
    min_gaps: int = 5
    act: bool = True
    """End a leg the look shows hung (False: show and record it, and let the leg go on)."""

    @classmethod
    def of(cls, cfg: WatchdogConfig) -> Policy:
        """The policy launcher.yaml's `trainer.watchdog` sets."""
        return cls(cfg.multiple, cfg.floor_s, cfg.first_step_s, cfg.finish_s, act=cfg.act)

    def describe(self) -> str:
        return (
            f"a rank is suspect when silent past {self.multiple:g} x the 99th percentile of its own gaps "
            f"between events (at least {self.floor_s:g} s), {self.first_step_s:g} s before its first step, "
            f"{self.finish_s:g} s after its `stop`"
        )


@dataclass(frozen=True)
class Suspect:
    rank: int
    silent_s: float
    limit_s: float
    phase: str
    last_event: str
    last_step: int | None
    since: float = 0.0
    """When its silence began (its last event, or the leg's start)."""

    def line(self) -> str:
        at = f" after step {self.last_step}" if self.last_step is not None else ""
        return (
            f"rank {self.rank} silent {self.silent_s:.1f} s{at} (its last event `{self.last_event}`; "
            f"limit {self.limit_s:.1f} s while {self.phase})"
        )


@dataclass
class Rhythm:
    """One rank's events so far in this leg."""

    rank: int
    since: float
    last_t: float | None = None
    last_event: str = ""
    last_step: int | None = None
    phase: str = STARTING
    gaps: Gaps = field(default_factory=lambda: Gaps())

    def hear(self, t: float, event: dict[str, Any]) -> None:
        name = str(event.get("event"))
        if self.phase == STEPPING and self.last_t is not None and t >= self.last_t:
            self.gaps.append(t - self.last_t)
        if name == "step":
            self.phase = STEPPING if self.phase in (STARTING, STEPPING) else self.phase
            step = event.get("step")
            self.last_step = step if isinstance(step, int) else self.last_step
        elif name == "stop":
            self.phase = FINISHING
        elif name in ("hold", "done"):
            self.phase = QUIET
        self.last_t, self.last_event = t, name

    def silent_since(self) -> float:
        """When its present silence began: its last event, or the leg's start."""
        return self.last_t if self.last_t is not None else self.since

    def limit(self, policy: Policy) -> float | None:
        """Seconds of silence allowed now (None: not judged)."""
        if self.phase == STARTING:
            return policy.first_step_s
        if self.phase == FINISHING:
            return policy.finish_s
        if self.phase == QUIET:
            return None
        if not self.gaps:  # one step so far: the next can still be warming up (compiling, the loader's workers)
            return policy.first_step_s
        return max(policy.floor_s, policy.multiple * self.gaps.p99(policy.min_gaps))

    def suspect(self, now: float, policy: Policy) -> Suspect | None:
        limit = self.limit(policy)
        began = self.silent_since()
        if limit is None or now - began <= limit:
            return None
        return Suspect(self.rank, now - began, limit, self.phase, self.last_event or "none", self.last_step, began)


class Gaps:
    """A rank's gaps so far, in bounded memory and time: kept exactly while there are up to
    `EXACT` of them (their p99 is `p99`'s), then counted in log-spaced bins 1 % wide, whose p99
    is the upper edge of the bin holding it: never under the exact one, at most 1 % over. A 24 h
    leg at 10 events a second is 864,000 gaps a rank: a sorted list of them cost a core's
    seconds at each judgment (bench/watchdog_cost.py)."""

    EXACT = 2048
    BIN = math.log(1.01)
    FLOOR_S = 1e-4
    """Gaps under 0.1 ms share the lowest bin."""

    def __init__(self) -> None:
        self.exact: list[float] | None = []
        self.bins: dict[int, int] = {}
        self.n = 0
        self._p99: tuple[int, int, float] | None = None
        """(n, min_gaps, p99) of the last computation: judged every second, changed by each event."""

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def append(self, gap: float) -> None:
        self.n += 1
        if self.exact is not None:
            self.exact.append(gap)
            if len(self.exact) <= self.EXACT:
                return
            for each in self.exact:
                self._count(each)
            self.exact = None
            return
        self._count(gap)

    def _count(self, gap: float) -> None:
        index = 0 if gap <= self.FLOOR_S else math.ceil(math.log(gap / self.FLOOR_S) / self.BIN)
        self.bins[index] = self.bins.get(index, 0) + 1

    def p99(self, min_gaps: int) -> float:
        cached = self._p99
        if cached is not None and cached[:2] == (self.n, min_gaps):
            return cached[2]
        if self.exact is not None:
            value = p99(self.exact, min_gaps)
        else:  # nearest rank: the k-th largest, k = n - ceil(0.99 n) + 1, from the top bin down
            k, seen = self.n - math.ceil(0.99 * self.n) + 1, 0
            for index in sorted(self.bins, reverse=True):
                seen += self.bins[index]
                if seen >= k:
                    break
            value = self.FLOOR_S * math.exp(index * self.BIN)
        self._p99 = (self.n, min_gaps, value)
        return value


def p99(gaps: list[float], min_gaps: int) -> float:
    """The 99th percentile of the gaps (nearest rank); the largest while there are fewer than `min_gaps`."""
    ordered = sorted(gaps)
    if len(ordered) < min_gaps:
        return ordered[-1]
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class Watchdog:
    """Every rank of one leg: `hear` each event as it arrives, `suspects` at any moment."""

    def __init__(self, policy: Policy, began: float) -> None:
        self.policy, self.began = policy, began
        self.ranks: dict[int, Rhythm] = {}

    def hear(self, t: float, event: dict[str, Any]) -> None:
        rank = event.get("rank", 0)
        if not isinstance(rank, int) or isinstance(rank, bool):
            return
        rhythm = self.ranks.setdefault(rank, Rhythm(rank, self.began))
        rhythm.hear(t, event)

    def suspects(self, now: float) -> list[Suspect]:
        found = [r.suspect(now, self.policy) for r in self.ranks.values()]
        return sorted((s for s in found if s is not None), key=lambda s: -s.silent_s / s.limit_s)

    def closest(self, now: float) -> float:
        """The largest silence / limit over the ranks now (1.0 and above: a suspect)."""
        ratios = [
            (now - r.silent_since()) / limit for r in self.ranks.values() if (limit := r.limit(self.policy)) is not None
        ]
        return max(ratios, default=0.0)


class LiveWatch:
    """A running leg's watchdog: lines heard on the thread that pumps them, judged on the one
    that waits for the leg; a suspect is looked at (`second_look`), shown and recorded with the
    leg (docs/watchdog.md)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.lock = threading.Lock()
        self.dog: Watchdog | None = None
        self.paused = False
        self.found: list[Suspect] = []
        self.looks: list[dict[str, Any]] = []
        self.looked_at: dict[int, tuple[float, float]] = {}
        """rank -> (when its present silence began, when it was last looked at)."""
        self.closest = 0.0
        self.waiting: dict[int, float] = {}
        """rank -> the silence (its start) in which a look last found every rank waiting."""

    def begin(self, t: float) -> None:
        with self.lock:
            self.dog = Watchdog(self.policy, t)

    def hear_line(self, line: str, t: float) -> None:
        if MARKER not in line:
            return
        event = parse_line(line)
        if event is None or event.get("event") == "damaged":
            return
        with self.lock:
            if self.dog is not None:
                self.dog.hear(t, event)

    def pause(self) -> None:
        """The launcher is ending the leg itself (a drill's freeze, a SIGTERM, a notice): its
        silence from here on is the launcher's doing, not the trainer's."""
        with self.lock:
            self.paused = True

    def judge(self, now: float) -> list[Suspect]:
        """The suspects to look at now: each rank that fell silent past its limit since the last
        call, and each still silent one last looked at a limit ago or more (what its look found
        can change: another rank may stop meanwhile)."""
        with self.lock:
            if self.dog is None or self.paused:
                return []
            self.closest = max(self.closest, self.dog.closest(now))
            due = []
            for suspect in self.dog.suspects(now):
                since, looked = self.looked_at.get(suspect.rank, (None, 0.0))
                if since != suspect.since:  # a silence not named before
                    self.found.append(suspect)
                elif now - looked < suspect.limit_s:
                    continue
                self.looked_at[suspect.rank] = (suspect.since, now)
                due.append(suspect)
            return due

    def second_look(self, suspect: Suspect, pids: list[int], beside: Path) -> tuple[list[Look], str | None]:
        """What each of the leg's processes is doing now (launcher.backends.looks), their stacks
        written beside the leg's log, kept with the suspect; and why the leg is hung, where the
        look shows it (`confirm`), else None."""
        seen = look(pids)
        stacks = beside.with_name(f"{beside.stem}.stacks-{len(self.looks)}.txt") if seen else None
        if stacks is not None:
            stacks.write_text("".join(f"== {p.line()}\n{p.stack or p.note}\n" for p in seen))
        hung = confirm(seen)
        with self.lock:
            if hung is not None and hung.startswith(WAITING_ALL):
                # every rank waiting could still be one long transfer: hung only when the look a
                # limit later, in the same silence, finds them all still waiting
                before, self.waiting[suspect.rank] = self.waiting.get(suspect.rank), suspect.since
                if before != suspect.since:
                    hung = None
            self.looks.append(
                {
                    "rank": suspect.rank,
                    "t": round(time.time(), 3),
                    "processes": [p.line() for p in seen],
                    "stacks": str(stacks) if stacks else None,
                    "hung": hung,
                }
            )
        return seen, hung

    def record(self) -> dict[str, Any]:
        """For the ledger: the policy, the closest call (silence / limit at a judgment), each
        suspect and whether its rank spoke again afterwards (a false alarm, had it been acted on)."""
        with self.lock:
            ranks = self.dog.ranks if self.dog is not None else {}
            suspects = []
            for s in self.found:
                last = ranks[s.rank].last_t if s.rank in ranks else None
                spoke = last is not None and last > s.since
                suspects.append({**asdict(s), "silent_s": round(s.silent_s, 2), "spoke_again": spoke})
            return {
                "policy": asdict(self.policy),
                "closest": round(self.closest, 4),
                "suspects": suspects,
                "looks": list(self.looks),
            }


def confirm(seen: list[Look]) -> str | None:
    """Why a suspect leg is hung, from the look at its processes; None where the look does not
    show it. Hung: a process of the leg is stopped (SIGSTOP or a debugger: it will not go on by
    itself), or every rank waits in a collective (none is left to answer; acted on only when a
    second look, a limit later in the same silence, finds the same). A rank that computes,
    reads, sleeps or waits on a store is not called hung: a rank-0-only evaluation or save keeps
    the others waiting in a barrier, and that is healthy."""
    stopped = [p for p in seen if p.state in ("T", "t")]
    if stopped:
        return "; ".join(p.line() for p in stopped)
    ranks = [p for p in seen if p.rank is not None]
    if ranks and all(collective_in(p.stack) for p in ranks):
        return f"{WAITING_ALL}: " + "; ".join(p.line() for p in ranks)
    return None

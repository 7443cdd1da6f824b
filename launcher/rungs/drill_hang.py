"""`launcher drill hang`: one rank stops at a chosen step, and the leg's watchdog must find it.

When rank R prints step N, the launcher finds rank R's processes among the leg's (by the RANK
their launcher gave them, read from outside: launcher.backends.looks) and stops them with
SIGSTOP: the rank neither exits nor answers, as one stuck in a driver call or a dead mount would
be, and its peers block in their next collective. The drill does nothing more. The leg's own
watchdog (launcher.checks.watchdog, under the policy launcher.yaml sets) must name the rank,
take the stacks of every process of the leg, and end the leg as hung; then a fresh leg on an
empty disk resumes from the store's newest verified checkpoint and runs to the end.

The figure: seconds from the stop to the watchdog's call, against the leg's p99 step time and
the limit the watchdog held the rank to.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from launcher.backends.base import LegHandle
from launcher.backends.local import trainer_python
from launcher.backends.looks import look
from launcher.checks.evidence import Check, Kind, LegEvents
from launcher.checks.kills import Kill, check_resumed_newest, check_store_after_kill, read_states
from launcher.checks.leg import check_leg_exit
from launcher.checks.readback import StateReader
from launcher.checks.watchdog import WAITING_ALL, p99
from launcher.leg_env import Ending
from launcher.legs import LegOutcome, RunContext, run_leg
from launcher.rungs.drill_preempt import check_work_lost
from launcher.rungs.resume_legs import check_run_length
from runtime.events import MARKER, parse_line
from runtime.store.base import newest_verified
from runtime.store.seal import KEY_ENV

STOP, COLLECTIVE = "stop", "collective"
HOWS = (STOP, COLLECTIVE)


class Stopper:
    """Heard on every line of the leg: on rank `rank`'s step `step` (or the first after it), every
    process of that rank is stopped, once (`how` stop); or (`how` collective) only the moment is
    noted: the runtime blocks that rank itself (LAUNCHER_DRILL_HANG)."""

    def __init__(self, ctx: RunContext, rank: int, step: int, how: str = STOP) -> None:
        self.ctx, self.rank, self.step, self.how = ctx, rank, step, how
        self.at: float | None = None
        self.pids: list[int] = []
        self.missing: str | None = None

    def __call__(self, line: str, handle: LegHandle) -> None:
        if self.at is not None or self.missing is not None or MARKER not in line:
            return
        event = parse_line(line)
        if event is None or event.get("event") != "step" or event.get("rank", 0) != self.rank:
            return
        if not isinstance(event.get("step"), int) or event["step"] < self.step:
            return
        ours = [p.pid for p in look(self.ctx.backend.pids(handle), stacks=False) if p.rank == self.rank]
        if not ours:
            self.missing = f"no process of the leg carries RANK={self.rank} (its launcher sets none)"
            return
        if self.how == STOP:
            for pid in ours:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
            self.ctx.show(
                0, f"launcher: drill: rank {self.rank} stopped at step {event['step']} (SIGSTOP to pid {ours})\n"
            )
        self.at, self.pids = time.time(), ours  # collective: the runtime blocks the rank itself


def climb(ctx: RunContext, steps: int, rank: int, at_step: int, how: str = STOP) -> list[Check]:
    """Leg 0's rank `rank` stopped (or blocked in a collective) at `at_step`; leg 1 resumes from
    the store and finishes."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV} | ctx.secrets()
    reader = StateReader(trainer_python(ctx.cfg.trainer.command), ctx.store_uri, f"runs/{ctx.run_id}", env)
    stopper = Stopper(ctx, rank, at_step, how)
    try:
        store = ctx.open_store()
        stray = Ending(stray_at=(rank, at_step)) if how == COLLECTIVE else Ending()
        first = run_leg(ctx, 0, steps, tap=stopper, ending=stray)
        if stopper.at is not None and first.watchdog is not None:  # a hang the launcher made, not a false alarm
            first.watchdog["drilled"] = {
                "rank": rank,
                "step": at_step,
                "how": how,
                "pids": stopper.pids,
                "at": stopper.at,
            }
            ctx.ledger.note_leg(ctx.run_id, 0, watchdog=json.dumps(first.watchdog))
        newest = newest_verified(store)
        expected = newest.step if newest else None
        kill = Kill(0, f"rank {rank} hung", "", expected, check_store_after_kill(store, [first], expected, "the hang"))
        kill.reads = read_states(reader, store, [first], expected)
        last = run_leg(ctx, 1, steps)
    finally:
        reader.close()
    return [
        check_hang_found(first, stopper),
        *([kill.store_check] if kill.store_check else []),
        check_resumed_newest(last.events, kill),
        check_work_lost(first.events, last.events, None, "the hang", end=first.result.ended_at),
        check_leg_exit(last),
        check_run_length(last, steps),
    ]


def step_p99(ev: LegEvents, before: float | None) -> float | None:
    """The 99th percentile (nearest rank) of the gaps between each rank's consecutive step events
    up to `before`: the leg's own step time, every rank counted."""
    last: dict[int, float] = {}
    gaps: list[float] = []
    for _, e in ev.all("step", rank=None):
        t, r = float(e.get("t", 0.0)), e.get("rank", 0)
        if before is not None and t > before:
            continue
        if r in last and t >= last[r]:
            gaps.append(t - last[r])
        last[r] = t
    return p99(gaps, 1) if gaps else None


def hang_facts(out: LegOutcome, stopper: Stopper) -> dict[str, Any]:
    """The numbers of the hang: when the rank stopped, when the watchdog called the leg hung
    (its look that found it), the limit it held the rank to, the leg's p99 step time."""
    record = out.watchdog or {}
    hung = next((each for each in record.get("looks", []) if each.get("hung")), None)
    suspect = next((s for s in record.get("suspects", []) if hung and s["rank"] == hung["rank"]), None)
    p = step_p99(out.events, stopper.at)
    found_s = round(hung["t"] - stopper.at, 2) if hung and stopper.at is not None and "t" in hung else None
    return {
        "rank": stopper.rank,
        "how": stopper.how,
        "pids": stopper.pids,
        "stopped_at": stopper.at,
        "detected_s": found_s,
        "p99_step_s": None if p is None else round(p, 4),
        "times_p99": None if found_s is None or not p else round(found_s / p, 1),
        "limit_s": None if suspect is None else round(suspect["limit_s"], 2),
        "suspect": suspect,
        "hung": hung["hung"] if hung else None,
        "stacks": hung["stacks"] if hung else None,
        "end_reason": out.result.end_reason,
    }


def check_hang_found(out: LegOutcome, stopper: Stopper) -> Check:
    """The watchdog ended the leg as hung, its look naming the hung rank (stopped; or, blocked in
    a collective, every rank waiting), with stacks taken: the detection time stated against the
    leg's p99 step time."""
    leg, facts = out.events.leg, hang_facts(out, stopper)
    what = "stopped" if stopper.how == STOP else "blocked in a collective"
    name = f"leg {leg}: the watchdog found rank {stopper.rank} {what}"
    if stopper.at is None:
        why = stopper.missing or f"rank {stopper.rank} never printed step {stopper.step}"
        detail = f"the drill hung no rank: {why}; the leg ended ({out.result.end_reason})"
        return Check(name, False, detail, kind=Kind.HANG_FOUND, leg=leg, facts=facts)
    said = facts["hung"] or ""
    mine = f"rank {stopper.rank} (pid " in said
    named = mine and ("stopped" in said if stopper.how == STOP else said.startswith(WAITING_ALL))
    took = out.result.ended_at - stopper.at
    if not (out.result.killed and out.result.end_reason.startswith("hung: ") and named and facts["stacks"]):
        detail = (
            f"rank {stopper.rank} {what} at step {stopper.step}; the leg ended {took:.1f} s later "
            f"({out.result.end_reason}) without the watchdog calling it hung with rank {stopper.rank} named"
        )
        return Check(name, False, detail, kind=Kind.HANG_FOUND, leg=leg, facts=facts)
    p = facts["p99_step_s"]
    against = f"{facts['times_p99']:g} x the leg's p99 step time ({p:g} s)" if p else "no step time measured"
    detail = (
        f"rank {stopper.rank} {what} at step {stopper.step}; called hung {facts['detected_s']:.1f} s later "
        f"({against}; its limit {facts['limit_s']:g} s), stacks of every process taken "
        f"({os.path.basename(facts['stacks'])}), the leg ended {took:.1f} s after"
    )
    return Check(name, True, detail, kind=Kind.HANG_FOUND, leg=leg, facts=facts)

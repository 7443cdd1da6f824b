"""A straggler: a rank whose own work runs persistently longer than its peers', so they wait for
it every step (docs/watchdog.md, "Stragglers").

Ranks that meet in a collective every step end their steps together: their step times are the
same, the slowest rank's. What differs is the work each does on its own, outside the step's
collectives: reading its batch (`data`), its optimizer step, its own code after the last lap
(`other`), the runtime's bookkeeping (`drain`, `session`). Those are the phases each rank's step
event reports. A rank whose own work is persistently above every other rank's is named, with
what it costs the others: the difference is time they spend waiting in the next collective.
The forward and backward (`compute`) are left out: a rank's includes its wait for the others in
the gradients' all-reduce, so a fast rank's reads long there.
"""

from __future__ import annotations

import statistics
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents

OWN = ("data", "optimizer", "other", "drain", "session")
"""The phases a rank spends on its own, outside the step's collectives."""
WINDOW = 50
"""The steps judged: the leg's last ones that every rank reported."""
MIN_STEPS = 10
PERSISTENT = 0.8
"""A straggler's own work is the longest of all ranks' in at least this share of the steps..."""
SHARE = 0.1
MIN_EXCESS_S = 0.01
"""...and its median exceeds the other ranks' by at least this share of the step and these seconds."""


def own_times(ev: LegEvents) -> dict[int, dict[int, float]]:
    """rank -> step -> seconds of its own work (OWN phases), from each rank's step events."""
    out: dict[int, dict[int, float]] = {}
    for _, e in ev.all("step", rank=None):
        phases, rank, step = e.get("phases"), e.get("rank", 0), e.get("step")
        if isinstance(phases, dict) and isinstance(rank, int) and isinstance(step, int):
            out.setdefault(rank, {})[step] = sum(float(phases.get(k) or 0.0) for k in OWN)
    return out


def stragglers(ev: LegEvents) -> dict[str, Any] | None:
    """The straggler among the leg's ranks over its last WINDOW common steps, with the numbers;
    {"rank": None, ...} where no rank is one; None where there is nothing to compare (one rank,
    too few steps, no phases)."""
    own = own_times(ev)
    if len(own) < 2:
        return None
    common = sorted(set.intersection(*(set(steps) for steps in own.values())))[-WINDOW:]
    if len(common) < MIN_STEPS:
        return None
    step_s = statistics.median(
        float(e["step_s"]) for _, e in ev.all("step") if e.get("step") in common and e.get("step_s")
    )
    medians = {r: statistics.median(own[r][s] for s in common) for r in own}
    slowest = max(medians, key=lambda r: medians[r])
    others = statistics.median(m for r, m in medians.items() if r != slowest)
    longest = sum(1 for s in common if all(own[slowest][s] >= own[r][s] for r in own if r != slowest))
    excess = medians[slowest] - others
    found = longest >= PERSISTENT * len(common) and excess >= max(MIN_EXCESS_S, SHARE * step_s)
    return {
        "rank": slowest if found else None,
        "slowest": slowest,
        "own_s": round(medians[slowest], 4),
        "others_s": round(others, 4),
        "excess_s": round(excess, 4),
        "step_s": round(step_s, 4),
        "longest_share": round(longest / len(common), 3),
        "steps": [common[0], common[-1]],
        "ranks": len(own),
    }


def describe_stragglers(s: dict[str, Any]) -> str:
    window = f"steps {s['steps'][0]}..{s['steps'][1]}, {s['ranks']} ranks"
    if s["rank"] is None:
        return (
            f"no straggler ({window}): the slowest rank's own work, rank {s['slowest']}'s, is {s['own_s']:.4f} s "
            f"a step against the others' {s['others_s']:.4f} s, in a {s['step_s']:.4f} s step"
        )
    return (
        f"rank {s['rank']} is a straggler ({window}): its own work outside the collectives takes "
        f"{s['own_s']:.4f} s a step (median), the other ranks' {s['others_s']:.4f} s, and it was the longest "
        f"in {100 * s['longest_share']:.0f} % of the steps: the others wait about {s['excess_s']:.4f} s of "
        f"each {s['step_s']:.4f} s step for it ({100 * s['excess_s'] / s['step_s']:.0f} %)"
    )


def check_stragglers(ev: LegEvents) -> Check | None:
    """A statement: the straggler named with its numbers, or that there is none (None: nothing
    to compare)."""
    s = stragglers(ev)
    if s is None:
        return None
    return Check(
        f"leg {ev.leg}: a straggler among the ranks",
        True,
        describe_stragglers(s),
        kind=Kind.STRAGGLER,
        leg=ev.leg,
        facts=s,
    )

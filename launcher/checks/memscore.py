"""A GPU rung's memory, predicted against measured: the memory guard's prediction that let it
launch, beside the peak its legs measured on the GPU (the caching allocator's
`max_memory_allocated` and `max_memory_reserved`, the max across ranks, from each leg's `memory`
events), and the error. docs/memory.md.

One check per launched GPU rung, recorded when the run ends however it ends, so the ledger holds
every prediction with its truth: the report shows them per rung, and the guard's allowance grows by
the largest under-prediction this project has measured (`margin`). Legs that ran on a CPU (the
local backend's GPU rungs on a host without one) measured the host's RSS, which is not a GPU's
peak: their measurement is MISSING, never a CPU figure passed off as a GPU's.

A statement, never a failure: a rung that ran measured what it measured; a prediction off by any
amount does not make the run fail (the guard decides before renting, this says how well it did).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents, find
from launcher.checks.memfit import gib


def measured(legs: list[LegEvents]) -> dict[str, Any] | None:
    """The GPU peaks the legs' `memory` events give (max over windows and legs: each window's
    figure is already the max across ranks), with the event that held the allocated peak; None
    where no leg measured a GPU."""
    cuda = [
        (ev, item)
        for ev in legs
        for item in ev.all("memory")
        if item[1].get("kind") == "cuda" and _bytes(item[1].get("peak_max")) is not None
    ]
    if not cuda:
        return None
    ev, top = max(cuda, key=lambda pair: _bytes(pair[1][1]["peak_max"]) or 0)
    reserved = [b for _, (_, e) in cuda if (b := _bytes(e.get("peak_reserved_max"))) is not None]
    return {
        "allocated": _bytes(top[1]["peak_max"]),
        "reserved": max(reserved) if reserved else None,
        "legs": len({ev.leg for ev, _ in cuda}),
        "evidence": ev.pointer(top),
    }


def _bytes(value: Any) -> int | None:
    """A byte count a leg printed, where it is one (a finite number, not negative, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return int(value)


def scored(decision: dict[str, Any], legs: list[LegEvents]) -> Check:
    """The check a launched GPU rung records: its memory decision (MemoryDecision.to_json) against
    what its legs measured."""
    ranks = [r for r in decision.get("ranks", []) if "peak" in r]
    name = "memory: predicted against measured"
    if not ranks:
        why = "; ".join(f"rank {r.get('rank')}: {r.get('error')}" for r in decision.get("ranks", [])) or "no rank"
        return Check(name, True, f"no prediction ({why})", kind=Kind.MEMORY_SCORED, facts={"predicted": None})
    top = max(ranks, key=lambda r: int(r["peak"]))
    facts: dict[str, Any] = {
        "gpu": top["gpu"],
        "world_size": decision.get("world_size"),
        "rank": top["rank"],
        "predicted": int(top["peak"]),
        "needed": int(top["needed"]),
        "capacity": top.get("capacity"),
        "guard": decision.get("guard", "refuse"),
        "over": any(r.get("fits") is False for r in ranks),
    }
    said = (
        f"predicted peak {gib(facts['predicted'])} (rank {top['rank']} of {facts['world_size']}; with the allowance "
        f"{gib(facts['needed'])} against {top['gpu']})"
    )
    if facts["over"]:
        said += f"; launched over the guard's figure (memory.guard: {facts['guard']})"
    m = measured(legs)
    if m is None:
        facts.update(allocated=None, reserved=None, error=None)
        detail = f"{said}; measured on the GPU: MISSING (no leg measured a GPU's memory: host RSS is not a GPU's peak)"
        return Check(name, True, detail, kind=Kind.MEMORY_SCORED, facts=facts)
    error = facts["predicted"] / m["allocated"] - 1 if m["allocated"] else None
    facts.update(allocated=m["allocated"], reserved=m["reserved"], error=error, legs=m["legs"])
    detail = f"{said}; measured on the GPU: peak allocated {gib(m['allocated'])}"
    if m["reserved"] is not None:
        detail += f", reserved {gib(m['reserved'])}"
    detail += f" (max across ranks, {m['legs']} leg(s)): error " + ("n/a" if error is None else f"{100 * error:+.1f} %")
    return Check(name, True, detail, m["evidence"], kind=Kind.MEMORY_SCORED, facts=facts)


def score_run(decision: dict[str, Any] | None, leg_rows: list[Any]) -> Check | None:
    """`scored` over a run's legs as the ledger lists them; None where the plan made no decision
    (a CPU rung)."""
    if decision is None:
        return None
    legs = [LegEvents.read(int(row["leg"]), Path(row["log_path"])) for row in leg_rows if row.get("leg") is not None]
    return scored(decision, legs)


def under_prediction(check: dict[str, Any]) -> float:
    """How far a recorded score's measurement exceeded its prediction (0.12: 12 % over; 0 where it
    did not, or where nothing was measured)."""
    facts = check.get("facts") or {}
    predicted, allocated = facts.get("predicted"), facts.get("allocated")
    if not isinstance(predicted, int) or not isinstance(allocated, int) or predicted <= 0:
        return 0.0
    return max(0.0, allocated / predicted - 1)


def margin(runs: list[Any]) -> float:
    """The largest under-prediction measured on a GPU in these runs (the ledger's rows, with their
    checks): the part of the guard's allowance that the project's own errors set."""
    scores = [c for run in runs for c in find(list(run.get("checks") or []), Kind.MEMORY_SCORED)]
    return max((under_prediction(c) for c in scores), default=0.0)

"""Where a run's billed hours went (docs/hours.md): each leg's time from launch to end split into
what it was spent on, from the ledger's times and the trainer's own events, then priced.

A leg's wall time (the ledger's launch to end) is partitioned, every second into one part:

- `startup`: launch to the first step's start (the image, the imports, the first batch), less:
- `restore`: the trainer's `start` to its `resume` event (loading the checkpoint);
- each step, from the previous step's event to its own, split by the step's `phases` where the
  trainer reports them: `data` (waiting for the batch), `saves` (the checkpoint's share of the
  step: the critical-path snapshot), `outside` (time between steps outside the step's own timer:
  a synchronous save, an evaluation, logging), and the rest `productive`;
- `lost`: steps past the checkpoint the next leg resumed from (retrained), and a killed leg's
  unfinished end;
- `hang`: a leg the watchdog ended as hung, from its last step to its end;
- `finish`: after the last step of a leg that stopped by itself (its final checkpoint, exit);
- `reference`: a drill's straight-through legs (the oracle its resumes are compared with).

The bill can exceed the wall time: `rounding` is what the provider bills past it (its minimum
and granularity, every node counted). `gap` (between one leg's end and the next one's launch)
is wall-clock time no instance bills; it is stated apart and is not in the billed sum.
Goodput = productive / billed. Rank 0's events are the clock (every rank waits for the slowest
in a collective, so rank 0's step time is the leg's).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents

PARTS = ("productive", "startup", "restore", "data", "saves", "outside", "lost", "hang", "finish", "reference")
BILLED = (*PARTS, "rounding")
TOLERANCE = 0.01
"""The parts must sum to the billed time within 1 %."""


def _rank0(ev: LegEvents, kind: str) -> list[dict[str, Any]]:
    """Rank 0's `kind` events (LegEvents.all's default rank) that carry their time."""
    return [e for _, e in ev.all(kind) if isinstance(e.get("t"), (int, float))]


def leg_parts(started: float, ended: float, ev: LegEvents, next_from: int | None, how: str) -> dict[str, float]:
    """One leg's wall time [started, ended] in parts (module doc). `next_from`: the step the next
    leg resumed from (steps past it were lost; None: none lost, this is the last leg); `how`:
    "done" (it stopped by itself), "hung", or "killed"."""
    parts = dict.fromkeys(PARTS, 0.0)

    def at(t: float) -> float:
        return min(max(float(t), started), ended)

    steps = [e for e in _rank0(ev, "step") if isinstance(e.get("step"), int)]
    if not steps:
        parts["hang" if how == "hung" else "startup"] = ended - started
        return parts
    begin = at(float(steps[0]["t"]) - float(steps[0].get("step_s") or 0.0))
    start, resume = _rank0(ev, "start"), _rank0(ev, "resume")
    if start and resume:  # the resume's time may read a millisecond past the first step's start
        restored = min(at(resume[0]["t"]), begin)
        parts["restore"] = max(0.0, restored - at(start[0]["t"]))
    parts["startup"] = begin - started - parts["restore"]
    prev = begin
    for e in steps:
        t = max(prev, at(e["t"]))
        interval, prev = t - prev, t
        if next_from is not None and int(e["step"]) > next_from:
            parts["lost"] += interval
            continue
        phases = e.get("phases") if isinstance(e.get("phases"), dict) else {}
        step_s = min(interval, float(e.get("step_s") or interval))
        data = min(step_s, float(phases.get("data") or 0.0))
        saves = min(step_s - data, float(phases.get("ckpt") or 0.0))
        parts["data"] += data
        parts["saves"] += saves
        parts["outside"] += interval - step_s
        parts["productive"] += step_s - data - saves
    parts[{"hung": "hang", "done": "finish"}.get(how, "lost")] += ended - prev
    return parts


def _how(leg: dict[str, Any], ev: LegEvents) -> str:
    reason = str(leg.get("end_reason") or "")
    if reason.startswith("hung: "):
        return "hung"
    if _rank0(ev, "stop") or _rank0(ev, "done"):  # it stopped itself (a SIGTERM, its deadline, its steps)
        return "done"
    return "killed" if leg.get("killed") else "done"


def account(run: dict[str, Any], now: float | None = None, read: dict[int, LegEvents] | None = None) -> dict[str, Any]:
    """The run's hours: per leg and summed, in seconds, GPU-hours and USD, with goodput. A leg
    still running is counted to `now`. `read`: the legs' events the caller has already read, by
    leg (the rest are read here; a straight-through leg's are not needed)."""
    now = time.time() if now is None else now
    gpus = int(run.get("gpu_count") or 0)
    legs = sorted(
        (leg for leg in run.get("legs", []) if _number(leg.get("started_at")) and isinstance(leg.get("leg"), int)),
        key=lambda leg: (leg["started_at"], leg["leg"]),
    )  # a row damaged by hand (its start unreadable) is left out
    read = read or {}
    events = {
        leg["leg"]: read.get(leg["leg"]) or LegEvents.read(leg["leg"], Path(leg["log_path"]))
        for leg in legs
        if leg.get("role") != "straight"
    }
    main = [leg for leg in legs if leg.get("role") != "straight"]
    resumed = {a["leg"]: _resumed_from(events[b["leg"]]) for a, b in zip(main, main[1:])}
    out_legs, gap, billed = [], 0.0, 0.0
    total = dict.fromkeys(BILLED, 0.0)
    for i, leg in enumerate(legs):
        ended = float(leg["ended_at"]) if _number(leg.get("ended_at")) else now
        wall = max(0.0, ended - float(leg["started_at"]))
        if leg.get("role") == "straight":
            parts = dict.fromkeys(PARTS, 0.0) | {"reference": wall}
        else:
            ev = events[leg["leg"]]
            parts = leg_parts(float(leg["started_at"]), ended, ev, resumed.get(leg["leg"]), _how(leg, ev))
        instances = int(run.get("nodes") or 1) if run.get("backend") == "sky" else 1
        leg_billed = _billed_s(leg, wall, instances)
        parts = {k: v * instances for k, v in parts.items()}
        parts["rounding"] = max(0.0, leg_billed - wall * instances)
        if i + 1 < len(legs):
            gap += max(0.0, float(legs[i + 1]["started_at"]) - ended)
        billed += leg_billed
        for k in BILLED:
            total[k] += parts[k]
        out_legs.append(_priced(leg["leg"], parts, leg_billed, leg.get("cost_usd"), gpus))
    usd = (
        sum(leg["usd"] for leg in out_legs if leg["usd"] is not None)
        if any(leg["usd"] is not None for leg in out_legs)
        else None
    )
    return {
        "billed_s": round(billed, 3),
        "accounted_s": round(sum(total.values()), 3),
        "gap_s": round(gap, 3),
        "goodput": round(total["productive"] / billed, 4) if billed else None,
        "parts": {k: round(v, 3) for k, v in total.items()},
        "gpu_hours": {k: round(v / 3600.0 * gpus, 6) for k, v in total.items()},
        "usd": None if usd is None else {k: round(usd * v / billed, 4) if billed else 0.0 for k, v in total.items()},
        "legs": out_legs,
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _resumed_from(ev: LegEvents) -> int | None:
    """The step a leg resumed from (0: it started fresh, so the previous leg's every step was lost)."""
    resume = _rank0(ev, "resume")
    return int(resume[0]["from_step"]) if resume and isinstance(resume[0].get("from_step"), int) else 0


def _billed_s(leg: dict[str, Any], wall: float, instances: int) -> float:
    """The instance-seconds billed for the leg (the ledger's, else its wall time on every instance)."""
    value = leg.get("billed_s")
    return float(value) if isinstance(value, (int, float)) else wall * instances


def _priced(leg: int, parts: dict[str, float], billed: float, cost: float | None, gpus: int) -> dict[str, Any]:
    return {
        "leg": leg,
        "billed_s": round(billed, 3),
        "parts": {k: round(v, 3) for k, v in parts.items()},
        "goodput": round(parts["productive"] / billed, 4) if billed else None,
        "gpu_hours": round(billed / 3600.0 * gpus, 6),
        "usd": None if cost is None else round(float(cost), 4),
    }


def check_hours(hours: dict[str, Any]) -> Check:
    """The parts sum to the billed time within 1 %, goodput stated."""
    billed, accounted = hours["billed_s"], hours["accounted_s"]
    off = abs(accounted - billed) / billed if billed else 0.0
    biggest = sorted(((v, k) for k, v in hours["parts"].items() if k != "productive" and v > 0), reverse=True)[:3]
    losses = ", ".join(f"{k} {v:.1f} s" for v, k in biggest) or "none"
    goodput = "-" if hours["goodput"] is None else f"{100 * hours['goodput']:.1f} %"
    return Check(
        "the run's billed hours accounted for",
        off <= TOLERANCE,
        f"{accounted:.1f} s accounted of {billed:.1f} s billed ({100 * off:.2f} % apart); goodput {goodput}; "
        f"the largest losses: {losses}; {hours['gap_s']:.1f} s between legs, unbilled",
        kind=Kind.HOURS,
        facts={"goodput": hours["goodput"], "off": round(off, 5)},
    )


LABELS = {
    "productive": "productive",
    "startup": "start-up",
    "restore": "restore",
    "data": "data stalls",
    "saves": "saves in steps",
    "outside": "between steps",
    "lost": "lost (retrained)",
    "hang": "hung",
    "finish": "final checkpoint and exit",
    "reference": "straight-through reference",
    "rounding": "billing rounding",
}


def describe_hours(hours: dict[str, Any]) -> str:
    """One line: billed, goodput, every part that is not zero, largest first, and the gaps."""
    parts = sorted(((v, k) for k, v in hours["parts"].items() if v > 0), reverse=True)
    goodput = "-" if hours["goodput"] is None else f"{100 * hours['goodput']:.1f} %"
    return (
        f"{hours['billed_s']:,.1f} instance-s billed, goodput {goodput}: "
        + ", ".join(f"{LABELS[k]} {v:,.1f} s" for v, k in parts)
        + f"; {hours['gap_s']:,.1f} s between legs (unbilled)"
    )

"""The run watched against its plan: `launcher status` on a run, and a finished run's
actuals in `launcher report`.

The plan is the report that let the run launch (recorded in the ledger beside the
run: its probe's rate, ETA, GPU-hours and USD). The actuals come from the run's
own legs: their step events (the rate now), the ledger's billed time (what was
spent), and the quota's arithmetic (what is left).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from launcher.checks.evidence import LegEvents
from runtime import contract

SLOW_FRACTION = 0.10
"""Warn when the rate now is more than this far under the probe's."""
RECENT_STEPS = 50
"""The rate now: over the newest this many steps of the current leg."""


def rate_now(legs: list[LegEvents]) -> dict[str, float] | None:
    """Seconds per step and tokens/s over the newest steps of the newest leg that trained."""
    for ev in reversed(legs):
        steps = [e for _, e in ev.all("step") if "t" in e][-RECENT_STEPS:]
        if len(steps) >= 3:
            span = (steps[-1]["t"] - steps[0]["t"]) / (int(steps[-1]["step"]) - int(steps[0]["step"]) or 1)
            tok = [float(e["tok_s"]) for e in steps[1:] if e.get("tok_s")]
            return {
                "step_s": span,
                "tok_s": statistics.median(tok) if tok else 0.0,
                "window": [int(steps[0]["step"]), int(steps[-1]["step"])],
                "leg": ev.leg,
            }
    return None


def spent(run: dict[str, Any], now: float) -> tuple[float, float | None]:
    """(GPU-hours, USD) billed so far: ended legs as billed, a running leg up to now."""
    gpus = int(run["gpu_count"] or 0) * int(run["nodes"] or 1)
    hours, usd, priced = 0.0, 0.0, True
    for leg in run["legs"]:
        if leg["ended_at"] is not None:
            hours += leg["billed_gpu_hours"] or 0.0
            if leg["cost_usd"] is None:
                priced = priced and not gpus
            usd += leg["cost_usd"] or 0.0
        else:
            running = max(0.0, now - leg["started_at"]) / 3600.0
            hours += running * gpus
            if leg.get("hourly_usd") is not None:
                usd += running * leg["hourly_usd"] * int(run["nodes"] or 1)
            else:
                priced = priced and not gpus
    return hours, (usd if priced else None)


def watch(
    run: dict[str, Any], legs: list[LegEvents], quota_for_run: float | None, price: float | None = None
) -> dict[str, Any]:
    """Progress, restarts, the rate now vs the plan's, ETA, spend vs plan, projection vs quota."""
    now = time.time()
    env = run["legs"][0]["env"] if run["legs"] else {}
    steps = int(env.get(contract.MAX_STEPS) or 0) or None
    done_steps = [int(e["step"]) for ev in legs for _, e in ev.all("step")]
    step = max(done_steps, default=0)
    gpus = int(run["gpu_count"] or 0) * int(run["nodes"] or 1)
    plan = (run.get("preflight") or {}).get("plan") or {}
    out: dict[str, Any] = {
        "steps": steps,
        "step": step,
        "percent": round(100.0 * step / steps, 1) if steps else None,
        "legs": len(run["legs"]),
        "restarts": max(0, len(run["legs"]) - 1),
        "leg_ends": [leg["end_reason"] for leg in run["legs"] if leg["ended_at"] is not None],
        "preflight": run.get("preflight"),
        "warnings": [],
    }
    rate = rate_now(legs)
    hours, usd = spent(run, now)
    if usd is None and price is not None:
        usd = hours * price
    out["spent"] = {"gpu_hours": round(hours, 4), "usd": None if usd is None else round(usd, 4)}
    out["plan"] = {k: plan.get(k) for k in ("tok_s", "eta_hours", "gpu_hours", "usd")} if plan else None
    if rate is not None:
        out["rate"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rate.items()}
        if plan.get("tok_s") and rate["tok_s"]:
            ratio = rate["tok_s"] / float(plan["tok_s"])
            out["rate"]["vs_plan"] = round(ratio, 3)
            if ratio < 1.0 - SLOW_FRACTION:
                out["warnings"].append(
                    f"rate {rate['tok_s']:,.0f} tok/s is {100 * (1 - ratio):.0f} % under the "
                    f"probe's {float(plan['tok_s']):,.0f} tok/s"
                )
        if steps and run["ended_at"] is None:
            eta_s = max(0, steps - step) * rate["step_s"]
            out["eta_s"] = round(eta_s, 1)
            projected = hours + eta_s / 3600.0 * gpus
            out["projected_gpu_hours"] = round(projected, 4)
            if quota_for_run is not None and gpus:
                out["quota_gpu_hours_for_run"] = round(quota_for_run, 4)
                if projected > quota_for_run + 1e-9:
                    out["warnings"].append(
                        f"projected {projected:,.2f} GPU-h crosses what the quota leaves this run "
                        f"({quota_for_run:,.2f} GPU-h): it will stop at the quota with a final "
                        "checkpoint"
                    )
    if plan.get("gpu_hours") and hours > float(plan["gpu_hours"]) * (1 + SLOW_FRACTION):
        out["warnings"].append(
            f"spent {hours:,.2f} GPU-h, over the report's estimate of {float(plan['gpu_hours']):,.2f} for the whole run"
        )
    return out


def quota_for_run(cfg: Any, ledger: Any, run_id: str) -> float | None:
    """GPU-hours the quota leaves this run in all: the quota less every other run's bills
    and holds in the period (None: no GPU-hour quota)."""
    from launcher.ops.spend import period_start

    if cfg.quota.gpu_hours is None:
        return None
    used, _, held, _ = ledger.period_totals(period_start(cfg))
    mine, own = ledger.run_holds(run_id)
    return cfg.quota.gpu_hours - (used - own) - (held - mine)

"""The plan section: what the full run will take, from what the rungs measured.

The sustained rate and ETA (proof 5), GPU-hours and cost against the quota (the
same arithmetic as `launcher spend`), memory, where step time goes, the
checkpoint cycle's cost, efficiency (MFU, GPU idle, what it would buy), and a
finished run beside the plan that let it launch.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import LegEvents
from launcher.checks.measure import (
    check_cadence,
    check_memory,
    cycle_cost,
    describe_breakdown,
    memory_trend,
    step_breakdown,
    sustained,
)
from launcher.config.schema import Config, GpuSpec
from launcher.ledger.db import Ledger
from launcher.report.memory import scores as memory_scores
from launcher.report.notice import hang_drills, notice_plan, preempt_drills
from launcher.report.runs import Evidence, Proof, RunData, rate_leg


def plan(cfg: Config, ledger: Ledger, runs: list[RunData], proofs: dict[int, Proof], cite: Evidence) -> dict[str, Any]:
    """The plan numbers: rate, ETA, GPU-hours and cost, quota, memory, checkpoint cadence."""
    from launcher.ops.spend import summary

    p5 = proofs[5]
    out: dict[str, Any] = {"run_steps": cfg.rungs.run.steps}
    measured = rate_leg(runs, gpu=True)
    gpus = None
    if measured and p5.numbers.get("eta_s"):
        run = measured[0]
        gpus = GpuSpec(run.row["gpu_name"], int(run.row["gpu_count"]))
        out.update(_run_cost(cfg, run, gpus, p5))
    spend = summary(cfg, ledger, gpus)
    out["quota"] = {
        k: spend[k]
        for k in (
            "period",
            "period_from",
            "quota_gpu_hours",
            "used_gpu_hours",
            "reserved_gpu_hours",
            "remaining_gpu_hours",
            "budget_usd",
            "used_usd",
        )
    }
    if "gpu_hours" in out:
        remaining = spend["remaining_gpu_hours"]
        out["fits"] = remaining is None or out["gpu_hours"] <= remaining
    actuals = [run_actuals(r) for r in runs if r.rung == "run" and r.row["ended_at"] is not None]
    if actuals:
        out["actuals"] = actuals
    # memory and checkpoint cost: the target's leg if any, else the longest leg measured (labelled)
    leg = measured or rate_leg(runs, gpu=False)
    if leg:
        run, ev, _ = leg
        out.update(_leg_costs(cfg, run, ev, p5 if measured else None, cite))
        out.update(notice_plan(cfg, runs, run, ev, out.get("eta_hours"), cite))
    out["memory_scores"] = memory_scores(runs)
    drills, hangs = preempt_drills(runs), hang_drills(runs)
    if drills:
        out["drills"] = drills
    if hangs:
        out["hangs"] = hangs
    return out


def _run_cost(cfg: Config, run: RunData, gpus: GpuSpec, p5: Proof) -> dict[str, Any]:
    """The run rung at proof 5's rate: ETA, GPU-hours, USD and the legs its budget needs."""
    nodes = int(run.row["nodes"])
    gpu_n = gpus.count * nodes
    hours = p5.numbers["eta_s"] / 3600.0
    gpu_hours = hours * gpu_n
    price = cfg.prices.get(gpus.name)
    return {
        "rate_source": "target",
        "rate_status": p5.status,
        "tok_s": p5.numbers["tok_s"],
        "eta_hours": hours,
        "gpus": run.gpus,
        "gpu_hours": gpu_hours,
        "usd": None if price is None else gpu_hours * price,
        "price_per_gpu_hour": price,
        "run_leg_budget_hours": cfg.rungs.run.budget_minutes / 60.0,
        "legs_needed": max(1, -int(-hours // (cfg.rungs.run.budget_minutes / 60.0))),
    }


def _leg_costs(cfg: Config, run: RunData, ev: LegEvents, p5: Proof | None, cite: Evidence) -> dict[str, Any]:
    """Memory, step-time breakdown, checkpoint cycle and efficiency of one measured leg."""
    out: dict[str, Any] = {}
    m = memory_trend(ev)
    if m:
        check = check_memory(ev, cfg.rungs.run.steps)
        out["memory"] = {k: v for k, v in m.items() if k not in ("evidence", "series")}
        out["memory"].update(
            {
                "run": run.id,
                "leg": ev.leg,
                "on": run.gpus,
                "verdict": check.detail,
                "evidence": cite.cite(run, m["evidence"]),
            }
        )
    b = step_breakdown(ev)
    if b:
        out["breakdown"] = {
            "run": run.id,
            "leg": ev.leg,
            "on": run.gpus,
            "summary": describe_breakdown(b),
            "largest": b["largest"],
            "shares": b["shares"],
            "evidence": cite.cite(run, b["evidence"]),
        }
    c = cycle_cost(ev)
    if c:
        check = check_cadence(ev)
        out["checkpoint"] = {k: v for k, v in c.items() if k != "evidence"}
        out["checkpoint"].update(
            {
                "run": run.id,
                "leg": ev.leg,
                "on": run.gpus,
                "ok": check.ok,
                "verdict": check.detail,
                "evidence": cite.cite(run, c["evidence"]),
            }
        )
    eff = efficiency_plan(cfg, run, ev, p5, cite, c)
    if eff:
        out["efficiency"] = eff
    return out


def efficiency_plan(
    cfg: Config, run: RunData, ev: LegEvents, p5: Proof | None, cite: Evidence, checkpoint: dict[str, Any] | None
) -> dict[str, Any] | None:
    """MFU, GPU idle and why, and the run's ETA/GPU-hours at the measured and a reachable MFU."""
    from launcher.efficiency import describe, describe_idle, efficiency, idle_breakdown, levers, what_if

    gpu_n = (int(run.row["gpu_count"] or 0) * int(run.row["nodes"] or 1)) if run.on_gpu else 0
    e = efficiency(ev, run.row["gpu_name"] if run.on_gpu else None, gpu_n)
    if e is None:
        return None
    out: dict[str, Any] = {
        "run": run.id,
        "leg": ev.leg,
        "on": run.gpus,
        "summary": describe(e),
        **{
            k: e.get(k)
            for k in (
                "flops_per_token",
                "formula_flops_per_token",
                "flop_s",
                "mfu",
                "mfu_note",
                "dtype",
                "gpu",
                "peak_flop_s",
                "compiled",
            )
        },
        "evidence": cite.cite(run, e["evidence"]),
    }
    idle = idle_breakdown(ev)
    if idle:
        out["idle"] = {"share": idle["idle"], "causes": idle["causes"], "summary": describe_idle(idle)}
    rate = sustained(ev)
    tps = rate["tokens_per_step"] if rate else None
    if p5 is not None and tps and gpu_n:
        out["what_if"] = what_if(e, cfg.rungs.run.steps, tps, p5.numbers["eta_s"] / 3600.0, gpu_n)
    out["levers"] = levers(e, ev, checkpoint)
    return out


def run_actuals(run: RunData) -> dict[str, Any]:
    """A finished run beside its plan (the report that let it launch, as the ledger recorded it)."""
    from launcher.ops.watch import rate_now

    row = run.row
    steps = [int(e["step"]) for ev in run.legs for _, e in ev.all("step")]
    rate = rate_now(run.legs)
    gate = row.get("preflight") or {}
    plan = gate.get("plan") or {}
    hours = (row["ended_at"] - row["started_at"]) / 3600.0
    out = {
        "run": run.id,
        "gpus": run.gpus,
        "verdict": row["verdict"],
        "legs": len(row["legs"]),
        "restarts": max(0, len(row["legs"]) - 1),
        "last_step": max(steps, default=0),
        "wall_hours": hours,
        "billed_gpu_hours": row["billed_gpu_hours"],
        "usd": row["cost_usd"],
        "tok_s": rate["tok_s"] if rate else None,
        "preflight": {"gate": gate.get("gate"), "reason": gate.get("reason"), "report": gate.get("report")},
        "plan": {k: plan.get(k) for k in ("tok_s", "eta_hours", "gpu_hours", "usd")},
    }
    return out | goodput_actual(run)


def goodput_actual(run: RunData) -> dict[str, Any]:
    """What the run kept of what it computed: steps kept / steps computed, seconds training /
    seconds billed (the legs' own step times against their ledger spans), per recovery the
    steps lost (the leg's last step past where the next one resumed)."""
    computed = sum(len({int(e["step"]) for _, e in ev.all("step")}) for ev in run.legs)
    kept = max((int(e["step"]) for ev in run.legs for _, e in ev.all("step")), default=0)
    training = sum(float(e.get("step_s") or 0.0) for ev in run.legs for _, e in ev.all("step"))
    billed = sum(
        float(leg["ended_at"]) - float(leg["started_at"])
        for leg in run.row["legs"]
        if leg.get("role") is None and all(isinstance(leg.get(k), (int, float)) for k in ("started_at", "ended_at"))
    )
    lost = []
    for before, after in zip(run.legs, run.legs[1:]):
        resume = after.first("resume")
        last = max((int(e["step"]) for _, e in before.all("step")), default=0)
        lost.append(max(0, last - (int(resume[1]["from_step"]) if resume else 0)))
    return {
        "steps_computed": computed,
        "steps_kept": kept,
        "training_s": round(training, 3),
        "billed_s": round(billed, 3),
        "lost_per_recovery": lost,
    }

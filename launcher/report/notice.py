"""The report's preemption section (issue 33): does the final checkpoint fit each provider's
notice, which checkpoint cadence loses the fewest GPU-hours, and what the preemption drills lost.

Every input is measured by us from the legs' own events and the ledger, except M (the mean time
between interruptions): `spot.mtbf_hours` when configured, else a published figure per provider
(docs/notes-preemption.md, section 3), named as such wherever it is used.

- The final path: from the step event of a leg's last checkpoint to that checkpoint's `verify`
  (snapshot, write, push, verify, and any earlier push still queued), on the leg's clock, plus
  one median step (a notice lands mid-step; the trainer sees it at the step's end).
- C: the mean critical-path seconds per checkpoint (the `save` events). L: the mean seconds from
  a checkpoint's step to its verified mark (what an interruption loses beyond half an interval).
- R: relaunch to first step of a cold-resumed leg (the ledger's leg start to its first step).
- The cadence's arithmetic is launcher.cadence's (Young, Daly, first-order goodput with L).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from launcher.cadence import NOTICE_S, compare, fits_notice, goodput
from launcher.checks.evidence import Kind, LegEvents, find
from launcher.checks.measure import cycle_cost
from launcher.config.schema import Config
from launcher.report.runs import Evidence, RunData

PROVIDERS = {"gcp": "GCP", "azure": "Azure", "aws": "AWS", "k8s": "Kubernetes"}
MTBF_HOURS = {"aws": 3650.0, "gcp": 160.0, "azure": 160.0}
"""Published interruption rates as hours between interruptions of one instance (the most frequent
end of each band): AWS Spot Instance Advisor's >20 %/month band, GCP's 5-15 %/day preemption rate
(its 15 % end), Azure none published (GCP's figure as a placeholder). Optimistic for GPU spot."""
MTBF_SOURCE = {
    "aws": "AWS Spot Instance Advisor's >20 %/month band",
    "gcp": "GCP's published 5-15 %/day preemption rate, 15 % end",
    "azure": "no Azure figure is published: GCP's, as a placeholder",
}


def final_path(ev: LegEvents) -> dict[str, Any] | None:
    """The leg's last checkpoint from its step to verified, and its parts; None without both."""
    saves = ev.all("save")
    if not saves:
        return None
    step = int(saves[-1][1]["step"])

    def of(kind: str) -> tuple[int, dict[str, Any]] | None:
        return next(((n, e) for n, e in ev.all(kind) if e.get("step") == step and e.get("ok", True)), None)

    verify, step_ev, push, written = of("verify"), of("step"), of("push"), of("serialized")
    step_s = [float(e["step_s"]) for _, e in ev.all("step") if e.get("step_s")]
    if verify is None or not step_s:
        return None
    save = saves[-1][1]
    t0 = float(step_ev[1]["t"]) if step_ev else float(save["t"]) - float(save["seconds"])
    seconds = round(float(verify[1]["t"]) - t0, 3)
    one_step = statistics.median(step_s)
    return {
        "step": step,
        "bytes": int(push[1]["bytes"]) if push else int(save.get("bytes", 0)),
        "seconds": seconds,
        "step_s": one_step,
        "needed_s": round(seconds + one_step, 3),
        "parts": {
            "save": float(save["seconds"]),
            "write": float(written[1]["seconds"]) if written else None,
            "push": float(push[1]["seconds"]) if push else None,
            "verify": float(verify[1]["seconds"]),
        },
        "evidence": ev.pointer(step_ev) + ev.pointer(saves[-1]) + ev.pointer(verify),
    }


def _lost_max(interval: int | None, lag: float | None, step_s: float) -> int | None:
    """What a preemption loses when the final checkpoint does not make it: the steps since the
    previous verified one, at most an interval plus those trained while it was pushed and verified."""
    if not interval:
        return None
    return interval + (int(-(-lag // step_s)) if lag and step_s else 0)


def lag_to_verified(ev: LegEvents) -> float | None:
    """Mean seconds from a checkpoint's step to its verified mark, over the leg's checkpoints on
    the cadence (the leg's final one left out, as cycle_cost leaves out its save: it is the
    final path, stated on its own, and what a preemption loses is measured from the one before)."""
    at = {int(e["step"]): float(e["t"]) for _, e in ev.all("step")}
    found = [
        (int(e["step"]), float(e["t"]) - at[int(e["step"])])
        for _, e in ev.all("verify")
        if e.get("ok") and int(e["step"]) in at
    ]
    last = max((int(e["step"]) for _, e in ev.all("save")), default=None)
    lags = [lag for step, lag in found if step != last or len(found) == 1]
    return statistics.mean(lags) if lags else None


def relaunch(runs: list[RunData], prefer: RunData) -> dict[str, Any] | None:
    """R: the ledger's start of a cold-resumed leg to its first step (the measured run's first)."""
    for run in [prefer] + [r for r in runs if r is not prefer]:
        starts = {
            int(leg["leg"]): float(leg["started_at"])
            for leg in run.row["legs"]
            if isinstance(leg.get("started_at"), (int, float))
        }
        for ev in run.legs:
            first = ev.first("step")
            if ev.first("resume") and first and ev.leg in starts:
                return {
                    "run": run.id,
                    "data": run,
                    "leg": ev.leg,
                    "backend": run.row["backend"],
                    "seconds": round(float(first[1]["t"]) - starts[ev.leg], 3),
                    "pointer": ev.pointer(first),
                }
    return None


def mtbf(cfg: Config, run: RunData) -> tuple[float, str, str | None]:
    """M of one instance in hours, where it comes from, and the cloud it is for (None: not known)."""
    clouds = {str((leg.get("placement") or {}).get("cloud", "")).lower() for leg in run.row["legs"]} - {""}
    cloud = next(iter(clouds)) if len(clouds) == 1 else None
    if cfg.spot.mtbf_hours is not None:
        return cfg.spot.mtbf_hours, "spot.mtbf_hours in launcher.yaml", cloud
    key = cloud if cloud in MTBF_HOURS else "gcp"
    where = "" if cloud in MTBF_HOURS else " (no cloud recorded for the measured legs: the most frequent default)"
    return MTBF_HOURS[key], f"{key}: {MTBF_SOURCE[key]}{where}", cloud


def notice_plan(
    cfg: Config, runs: list[RunData], run: RunData, ev: LegEvents, eta_hours: float | None, cite: Evidence
) -> dict[str, Any]:
    """The `notice` (final path vs each provider) and `cadence` (Young vs now) entries of the plan."""
    out: dict[str, Any] = {}
    c = cycle_cost(ev)
    f = final_path(ev)
    interval = c["interval_steps"] if c else None
    lag = lag_to_verified(ev)
    if f:
        fits = []
        for key, label in PROVIDERS.items():
            ok, margin = fits_notice(f["needed_s"], NOTICE_S[key])
            fits.append(
                {
                    "provider": key,
                    "label": label,
                    "notice_s": NOTICE_S[key],
                    "fits": ok and NOTICE_S[key] > 0,
                    "margin_s": round(margin, 3),
                }
            )
        out["notice"] = {k: v for k, v in f.items() if k != "evidence"} | {
            "run": run.id,
            "leg": ev.leg,
            "on": run.gpus,
            "per_provider": fits,
            "interval_steps": interval,
            "lost_steps_max": _lost_max(interval, lag, f["step_s"]),
            "evidence": cite.cite(run, f["evidence"]),
        }
    r = relaunch(runs, run)
    if c and interval and r:
        out["cadence"] = cadence_plan(cfg, run, c, r, lag or 0.0, eta_hours, cite)
    elif c or f:
        why = "no cold resume was measured (R)" if not r else "one checkpoint in the leg: no current cadence"
        out["cadence"] = {"missing": why}
    return out


def cadence_plan(
    cfg: Config, run: RunData, c: dict[str, Any], r: dict[str, Any], lag: float, eta_hours: float | None, cite: Evidence
) -> dict[str, Any]:
    """Young's and Daly's intervals, goodput at the current cadence and at Young's, and what the
    difference bills over the run (rungs.run.steps)."""
    m_hours, m_source, cloud = mtbf(cfg, run)
    nodes = max(1, int(run.row["nodes"] or 1))
    m_s = m_hours * 3600.0 / nodes
    gpus = (int(run.row["gpu_count"] or 0) * nodes) if run.on_gpu else 0
    kept = eta_hours if eta_hours else cfg.rungs.run.steps * c["step_s"] / 3600.0
    tau_now = c["interval_steps"] * c["step_s"]
    price = cfg.prices.get(run.row["gpu_name"]) if gpus else None
    cmp = compare(c["save_s"], r["seconds"], m_s, tau_now, kept, max(gpus, 1), price, lag)
    return {
        "c_s": c["save_s"],
        "r_s": r["seconds"],
        "r_from": f"{r['run']} leg {r['leg']} ({r['backend']})",
        "m_hours_instance": m_hours,
        "m_source": m_source,
        "cloud": cloud,
        "instances": nodes,
        "m_s": m_s,
        "lag_s": lag,
        "interval_steps": c["interval_steps"],
        "step_s": c["step_s"],
        "tau_now_s": tau_now,
        "tau_young_s": cmp.tau_young,
        "tau_daly_s": cmp.tau_daly,
        "young_steps": max(1, round(cmp.tau_young / c["step_s"])),
        "goodput_now": cmp.goodput_now,
        "goodput_young": cmp.goodput_young,
        "goodput_exact_now": goodput(tau_now, c["save_s"], r["seconds"], m_s),
        "goodput_exact_young": goodput(cmp.tau_young, c["save_s"], r["seconds"], m_s),
        "kept_hours": kept,
        "kept_from": "proof 5's ETA" if eta_hours else "the measured leg's median step",
        "gpus": gpus,
        "billed_now": cmp.billed_gpu_hours_now,
        "billed_young": cmp.billed_gpu_hours_young,
        "difference": cmp.gpu_hours_difference,
        "usd": cmp.usd_difference,
        "evidence": {"C": cite.cite(run, c["evidence"][:1]), "R": cite.cite(r["data"], r["pointer"])},
    }


def preempt_drills(runs: list[RunData]) -> list[dict[str, Any]]:
    """Each reported `drill preempt`: its notice check and the work the preemption lost."""
    out = []
    for run in runs:
        checks = run.row.get("checks", [])
        notice, lost = find(checks, Kind.PREEMPT_NOTICE), find(checks, Kind.WORK_LOST)
        if notice and lost:
            facts = lost[0].get("facts") or {}
            out.append(
                {
                    "run": run.id,
                    "notice_ok": bool(notice[0]["ok"]),
                    "notice": notice[0]["detail"],
                    "lost_steps": facts.get("steps"),
                    "lost_seconds": facts.get("seconds"),
                    "resumed_at": facts.get("resumed_at"),
                    "lost": lost[0]["detail"],
                }
            )
    return out


def hang_drills(runs: list[RunData]) -> list[dict[str, Any]]:
    """Each reported `drill hang`: the watchdog's detection (launcher.rungs.drill_hang) and the
    stacks it took, cited in the report's evidence."""
    out = []
    for run in runs:
        checks = run.row.get("checks", [])
        found, lost = find(checks, Kind.HANG_FOUND), find(checks, Kind.WORK_LOST)
        if found:
            facts = found[0].get("facts") or {}
            stacks = facts.get("stacks")
            out.append(
                {
                    "run": run.id,
                    "ok": bool(found[0]["ok"]),
                    "found": found[0]["detail"],
                    "detected_s": facts.get("detected_s"),
                    "p99_step_s": facts.get("p99_step_s"),
                    "limit_s": facts.get("limit_s"),
                    "stacks": f"evidence/{run.id}/{Path(stacks).name}" if stacks else None,
                    "lost": lost[0]["detail"] if lost else None,
                }
            )
    return out

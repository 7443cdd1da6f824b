"""The report's memory section: each GPU rung's predicted peak (the memory guard's, before it
launched) against what its legs measured on the GPU, with the error; MISSING where no leg
measured a GPU. The figures are the runs' recorded `memory_scored` checks
(launcher.checks.memscore), never recomputed from a config."""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import Kind, find
from launcher.checks.memfit import gib
from launcher.checks.memscore import margin
from launcher.report.runs import RunData


def scores(runs: list[RunData]) -> dict[str, Any]:
    """Every run's score, oldest first, and the margin the next guard adds (the largest under-prediction)."""
    rows = []
    for run in sorted(runs, key=lambda r: r.row["started_at"] or 0):
        for c in find(list(run.row.get("checks") or []), Kind.MEMORY_SCORED):
            facts = c.get("facts") or {}
            rows.append({"run": run.id, "rung": run.rung, "on": run.gpus, **facts, "detail": c["detail"]})
    return {"rows": rows, "margin": margin([run.row for run in runs])}


def lines(p: dict[str, Any]) -> list[str]:
    """The section's lines: one table row per GPU rung launched with a prediction."""
    m = p.get("memory_scores") or {"rows": []}
    head = "- **Memory, predicted against measured** (peak per GPU, the largest rank; docs/memory.md)"
    if not m["rows"]:
        return [
            f"{head}: no GPU rung was launched with a prediction, so nothing is predicted or measured here "
            "(`launcher memory --gpus T4:2` predicts without launching)."
        ]
    gpu = any(r.get("allocated") is not None for r in m["rows"])
    margin = (
        f"the largest under-prediction these runs measured on a GPU is {100 * m['margin']:.1f} %, a part of the "
        "guard's allowance from now on"
        if gpu
        else "no leg measured a GPU yet, so the guard's allowance holds no part for the project's own error"
    )
    out = [
        f"{head}: {margin}.",
        "",
        "| run | rung | GPU | predicted | with allowance | measured allocated | measured reserved | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in m["rows"]:
        if r.get("predicted") is None:
            out.append(f"| {r['run']} | {r['rung']} | {r['on']} | none: {r['detail']} | | | | |")
            continue
        measured = "MISSING" if r.get("allocated") is None else gib(r["allocated"])
        reserved = "MISSING" if r.get("reserved") is None else gib(r["reserved"])
        error = "-" if r.get("error") is None else f"{100 * r['error']:+.1f} %"
        out.append(
            f"| {r['run']} | {r['rung']} | {r['on']} | {gib(r['predicted'])} | {gib(r['needed'])} | {measured} | "
            f"{reserved} | {error} |"
        )
    if any(r.get("allocated") is None and r.get("predicted") is not None for r in m["rows"]):
        out += ["", "  MISSING: the rung's legs measured no GPU (a CPU's RSS is not a GPU's peak)."]
    return out + [""]

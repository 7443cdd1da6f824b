"""`launcher status [RUN_ID]`: the check before a kill, in one command.

Everything comes from what the host already has: the ledger, the leg's
host-side log (streamed live by the backend, so it works the same on every
backend), and the checkpoint store. What only the instance knows (disk, RAM,
GPU memory per process) the runtime prints as `health` events; status shows
the newest one with its age. A run that has gone quiet shows as such: the age
of the last event is the first number to read.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from launcher.checks.evidence import LegEvents
from launcher.checks.hours import account
from launcher.checks.measure import describe_breakdown, step_breakdown
from launcher.checks.stragglers import describe_stragglers, stragglers
from launcher.config.schema import Config
from launcher.efficiency import describe as describe_efficiency
from launcher.efficiency import describe_idle, efficiency, idle_breakdown
from launcher.errors import BadInput
from launcher.ledger.db import Ledger
from launcher.ops.reconcile import end_dead_runs, pid_alive
from launcher.storekey import project_key
from runtime import contract
from runtime.events import parse_line

WARNING = re.compile(
    r"warn|error|exception|traceback|fatal|nccl|out of memory|\boom\b|autotun|deprecat|"
    r"nan\b|inf\b|killed|timed? ?out",
    re.IGNORECASE,
)


def pick_run(ledger: Ledger, run_id: str | None) -> dict[str, Any]:
    if run_id is not None:
        found = ledger.runs(run_id=run_id)
        if not found:
            raise BadInput(f"no run {run_id!r} in the ledger", hint="`launcher ledger` lists the runs")
        return found[0]
    runs = ledger.runs(limit=20)
    if not runs:
        raise BadInput("no runs recorded yet: nothing to show", hint="`launcher up static` starts the ladder")
    running = [r for r in runs if r["ended_at"] is None]
    return running[0] if running else runs[0]


def warnings_in(log: Path) -> list[dict[str, Any]]:
    """Every warning/error-looking line that is not an event (but for the runtime's own `log`
    warnings), grouped (digits folded), in order of first sight."""
    groups: dict[str, dict[str, Any]] = {}
    if not log.is_file():
        return []
    with log.open(encoding="utf-8", errors="replace") as fh:
        for n, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line or not WARNING.search(line):
                continue
            event = parse_line(line) if line.startswith("{") else None
            if line.startswith("{") and not (event and event["event"] == "log" and event.get("level") == "warning"):
                continue
            key = re.sub(r"\d+", "#", line)[:160]
            g = groups.setdefault(key, {"first_line": n, "count": 0, "text": line[:300]})
            g["count"] += 1
            g["last_line"] = n
    return list(groups.values())


def checkpoints(run: dict[str, Any], legs: list[LegEvents], step: int | None, key: bytes | None) -> dict[str, Any]:
    from runtime.store import StoreError, open_store

    try:
        scan = open_store(run["store_uri"], f"runs/{run['id']}", key=key).scan()
    except (StoreError, OSError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    listed = scan.checkpoints
    pushed_at = {e["step"]: e["t"] for ev in legs for _, e in ev.all("push") if "t" in e}

    def describe(c: Any) -> dict[str, Any] | None:
        if c is None:
            return None
        t = pushed_at.get(c.step)
        return {
            "name": c.name,
            "step": c.step,
            "state": "verified" if c.verified else "pushed, not verified",
            "bytes": c.manifest.total_bytes,
            "age_steps": None if step is None else step - c.step,
            "age_minutes": None if t is None else round((time.time() - t) / 60.0, 1),
        }

    newest = max(listed, key=lambda c: c.step, default=None)
    verified = max((c for c in listed if c.verified), key=lambda c: c.step, default=None)
    return {
        "count": len(listed),
        "newest": describe(newest),
        "newest_verified": describe(verified),
        "damaged": [{"name": d.name, "step": d.step, "reason": d.reason} for d in scan.damaged],
    }


def _read_run(cfg: Config, run_id: str | None) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """(the run's row, its stop requests, what the quota leaves it): read, then the ledger closed."""
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    if ledger is None:
        raise BadInput(f"no ledger at {cfg.state_path / 'ledger.db'}: nothing has run yet")
    try:
        end_dead_runs(ledger)  # a run whose launcher died shows as ended, not as the live one
        run = pick_run(ledger, run_id)
        left = None
        if run["rung"] == "run":
            from launcher.ops.watch import quota_for_run

            left = quota_for_run(cfg, ledger, run["id"])
        return run, ledger.stops(run["id"]), left
    finally:
        ledger.close()


def status(cfg: Config, run_id: str | None) -> dict[str, Any]:
    run, stops, left = _read_run(cfg, run_id)
    legs = [LegEvents.read(leg["leg"], Path(leg["log_path"])) for leg in run["legs"]]
    out: dict[str, Any] = {
        "run": run["id"],
        "rung": run["rung"],
        "backend": run["backend"],
        "gpus": f"{run['gpu_name']}:{run['gpu_count']}" if run["gpu_count"] else "CPU",
        "state": "running" if run["ended_at"] is None else f"ended: {run['verdict']}",
        "legs": len(run["legs"]),
        "stops": stops,
    }
    if run.get("preflight"):
        out["preflight"] = run["preflight"]
    if not run["legs"]:
        return out
    if run["rung"] == "run":
        from launcher.ops.watch import watch

        out["run_progress"] = watch(run, legs, left, cfg.prices.get(run["gpu_name"]) if run["gpu_name"] else None)
    row, ev = run["legs"][-1], legs[-1]
    out["leg"] = _leg_state(row, ev)
    out["hours"] = account(run, read={ev.leg: ev for ev in legs})
    found = stragglers(ev)
    if found is not None:
        out["stragglers"] = {**found, "summary": describe_stragglers(found)}
    if ev.items:
        n, e = ev.items[-1]
        out["last_event"] = {
            "event": e["event"],
            "line": n,
            "step": e.get("step"),
            "age_s": round(time.time() - e["t"], 1) if "t" in e else None,
        }
    rate = ev.last("rate")
    if rate:
        r = rate[1]
        out["rate"] = {
            "tok_s": r["tok_s"],
            "rel_err": r.get("rel_err"),
            "window": [r["window_first"], r["window_last"]],
            "eta_s": r.get("eta_s"),
            "eta_to_step": r.get("total_steps"),
        }
    out["checkpoints"] = checkpoints(run, legs, out["leg"]["step"], project_key(cfg.state_path, create=False))
    out.update(_measures(run, ev))
    out["warnings"] = warnings_in(Path(row["log_path"]))
    out["damaged_lines"] = ev.damaged()
    return out


def _leg_state(row: dict[str, Any], ev: LegEvents) -> dict[str, Any]:
    """The newest leg: where it runs, whether it is alive, its step of how many."""
    start = ev.first("start")
    last_step = ev.last("step")
    leg_running = row["ended_at"] is None
    return {
        "leg": row["leg"],
        "instance": row["instance"],
        "log": row["log_path"],
        "state": "running"
        if leg_running
        else f"ended: exit {row['exit_code']}" + (f" ({row['end_reason']})" if row["end_reason"] else ""),
        "process_alive": pid_alive(row["pid"])
        if leg_running and row["backend"] == "local" and row.get("pid")
        else None,
        "step": int(last_step[1]["step"]) if last_step else None,
        "leg_max_steps": int(row["env"].get(contract.MAX_STEPS, 0)) or None,
        "total_steps": start[1].get("total_steps") if start else None,
        "device": start[1].get("device") if start else None,
        "nodes": [
            {
                **node,
                "step": _node_step(ev, node["node"]),
                "alive": pid_alive(node["pid"]) if leg_running and node.get("pid") else None,
            }
            for node in row.get("nodes") or []
        ],
    }


def _node_step(ev: LegEvents, node: int) -> int | None:
    """The newest step a rank on `node` printed (a node that fell behind or went silent shows)."""
    steps = [int(e["step"]) for _, e in ev.all("step", rank=None) if e.get("node") == node]
    return max(steps) if steps else None


def _measures(run: dict[str, Any], ev: LegEvents) -> dict[str, Any]:
    """What the newest leg measured besides its rate: the instance's health, the step
    breakdown, FLOPs and MFU, and the GPU's idle share (each only where the leg printed it)."""
    out: dict[str, Any] = {}
    health = ev.last("health")
    if health:
        h = dict(health[1])
        h["age_s"] = round(time.time() - h["t"], 1) if "t" in h else None
        out["health"] = {k: v for k, v in h.items() if k not in ("event", "rank", "t")}
    breakdown = step_breakdown(ev)
    if breakdown:
        out["breakdown"] = {
            "summary": describe_breakdown(breakdown),
            "largest": breakdown["largest"],
            "shares": breakdown["shares"],
            "per_step_s": breakdown["per_step_s"],
        }
    on_gpu = bool(run.get("gpu_name")) and int(run.get("gpu_count") or 0) > 0
    eff = efficiency(
        ev,
        run.get("gpu_name") if on_gpu else None,
        int(run.get("gpu_count") or 0) * int(run.get("nodes") or 1) if on_gpu else 0,
    )
    if eff:
        out["efficiency"] = {
            "summary": describe_efficiency(eff),
            "mfu": eff.get("mfu"),
            "mfu_note": eff.get("mfu_note"),
            "flop_s": eff.get("flop_s"),
            "flops_per_token": eff["flops_per_token"],
        }
    idle = idle_breakdown(ev)
    if idle:
        out["gpu_idle"] = {"share": idle["idle"], "causes": idle["causes"], "summary": describe_idle(idle)}
    return out

"""Recorded legs replayed through the watchdog's policy (launcher.checks.watchdog): how close each came
to being called a suspect, from its own events' times.

    python scripts/watchdog_replay.py FOLDER [FOLDER ...] [--multiple 10 --floor 15 ...]

Every `leg-*.log` under the folders (copies in reports' evidence skipped) is read as the launcher
reads a live leg: each rank's events in order, each judged just before its next event arrives,
which is where a gap is longest. A rank's start-up is timed from the leg's `started_at` in the
project's ledger where one is found (else it is not judged); the silence after a leg's last
event is not judged (the leg ended: it exited, or a drill froze and killed it). Prints the legs
read, the suspects (a false alarm each, on legs that were not hung), and the closest calls.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.checks.watchdog import Policy, Watchdog  # noqa: E402
from runtime.events import parse_line  # noqa: E402

SYNTHETIC_BEFORE = 1.5e9
"""Event times before 2017: a log a unit test wrote with made-up times, not one a leg printed."""


def started_at(log: Path) -> float | None:
    """The leg's start in its project's ledger (PROJECT/.launcher/runs/RUN/leg-N[-straight].log)."""
    run, state = log.parent, log.parent.parent.parent
    leg = log.stem.split("-")[1]
    if not (state / "ledger.db").exists() or not leg.isdigit():
        return None
    role = "straight" if log.stem.endswith("straight") else None
    db = sqlite3.connect(f"file:{state / 'ledger.db'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT started_at FROM legs WHERE run_id=? AND leg=? AND role IS ?", (run.name, int(leg), role)
        ).fetchall()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    try:
        return float(rows[0][0]) if rows else None
    except (TypeError, ValueError):  # a doctored ledger (tests/legs/test_hardening.py)
        return None


def replay(log: Path, policy: Policy) -> tuple[float, str]:
    """The leg's closest call (silence / limit, at most) and where it was."""
    events = [e for e in map(parse_line, log.read_text(errors="replace").splitlines()) if e and "t" in e]
    if events and not isinstance(events[0]["t"], (int, float)) or events and events[0]["t"] < SYNTHETIC_BEFORE:
        return -1.0, "written by a test, not a leg"  # unit tests' logs with made-up times
    began = started_at(log)
    watchdog = Watchdog(policy, began if began is not None else (events[0]["t"] if events else 0.0))
    worst, where = 0.0, ""
    for event in events:
        rank = event.get("rank", 0)
        rhythm = watchdog.ranks.get(rank)
        if rhythm is not None or began is not None:
            limit = rhythm.limit(policy) if rhythm is not None else policy.first_step_s
            last = rhythm.last_t if rhythm is not None and rhythm.last_t is not None else watchdog.began
            if limit is not None and (event["t"] - last) / limit > worst:
                worst = (event["t"] - last) / limit
                step = rhythm.last_step if rhythm is not None else None
                where = f"rank {rank}: {event['t'] - last:.2f} s of {limit:.2f} before `{event['event']}` (after step {step})"
        watchdog.hear(float(event["t"]), event)
    return worst, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    defaults = Policy()
    parser.add_argument("--multiple", type=float, default=defaults.multiple)
    parser.add_argument("--floor", type=float, default=defaults.floor_s)
    parser.add_argument("--first-step", type=float, default=defaults.first_step_s)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    policy = Policy(multiple=args.multiple, floor_s=args.floor, first_step_s=args.first_step)
    logs = sorted(p for folder in args.folders for p in folder.rglob("leg-*.log") if "evidence" not in p.parts)
    results = sorted(((*replay(log, policy), log) for log in logs), key=lambda r: -r[0])
    synthetic = [r for r in results if r[0] < 0]
    results = [r for r in results if r[0] >= 0]
    suspects = [r for r in results if r[0] > 1.0]
    timed = sum(1 for log in logs if started_at(log) is not None)
    if args.json:
        print(
            json.dumps(
                {
                    "legs": len(results),
                    "skipped": len(synthetic),
                    "start_timed": timed,
                    "suspects": len(suspects),
                    "closest": [{"ratio": round(r, 3), "where": w, "log": str(p)} for r, w, p in results[: args.top]],
                }
            )
        )
        return
    print(f"{policy.describe()}")
    print(
        f"{len(results)} legs replayed ({timed} with their start from the ledger; {len(synthetic)} logs written"
        f" by unit tests skipped): {len(suspects)} suspects"
    )
    for ratio, where, log in results[: args.top]:
        print(f"  {ratio:5.2f}  {where}  {log}")


if __name__ == "__main__":
    main()

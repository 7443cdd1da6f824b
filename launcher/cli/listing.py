"""`launcher ledger`: recorded runs and legs, newest first.

Kept apart from the typer app so `launcher.entry` can run it without importing
typer (see there): it is the command people run in a loop.
"""

from __future__ import annotations

from pathlib import Path

from launcher.errors import BadInput


def show_ledger(config: Path, run_id: str | None, limit: int, json_out: bool) -> None:
    """Print the newest `limit` runs (or one run) as a table, or as JSON."""
    from launcher.config.load import load_config
    from launcher.ledger.db import Ledger
    from launcher.ops.reconcile import end_dead_runs

    cfg = load_config(config)
    db = Ledger.open_existing(cfg.state_path / "ledger.db")
    runs = []
    if db is not None:
        try:
            end_dead_runs(db)  # a run whose launcher died reads as ended, not as running
            runs = db.runs(limit=None if run_id else limit, run_id=run_id)
        finally:
            db.close()
    if run_id and not runs:
        raise BadInput(f"no run {run_id!r} in the ledger", hint="`launcher ledger` lists the runs")
    from launcher.checks.hours import account, describe_hours

    if json_out:
        from launcher.cli.render import print_json

        print_json([{**run, "hours": account(run)} for run in runs])  # where the billed time went
        return
    from launcher.cli.render import console, print_ledger

    if not runs:
        console.print(f"no runs recorded yet (ledger: {cfg.state_path / 'ledger.db'})")
    else:
        print_ledger(console, runs)
    if run_id:
        console.print(f"hours: {describe_hours(account(runs[0]))}", markup=False)

"""What the commands share: the options every project command takes, the config load, and how
a rung's or a drill's outcome is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer

CONFIG = typer.Option(Path("launcher.yaml"), "--config", "-c", help="Path to launcher.yaml.")
JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")
VERBOSE = typer.Option(False, "--verbose", "-v", help="Every event of every leg, and every check with its evidence.")
GPUS = typer.Option(None, "--gpus", help="Accelerators, SkyPilot style: T4:2.")
OVERDRAFT = typer.Option(False, "--allow-overdraft", help="Launch over quota (recorded).")


def load(config: Path) -> Any:
    """The project's config (launcher.config.schema.Config, imported only when a command runs)."""
    from launcher.config.load import load_config

    return load_config(config)


def outcome_json(outcome: Any, **extra: Any) -> dict[str, Any]:
    """A rung's or a drill's outcome as `--json` prints it."""
    return {
        "run_id": outcome.run_id,
        **extra,
        "ok": outcome.ok,
        "seconds": round(outcome.seconds, 3),
        "checks": [c.to_json() for c in outcome.checks],
    }


def leg_view(verbose: bool, json_out: bool) -> Any:
    """The live view of a rung's legs (launcher.cli.live.LegView): on stderr when stdout is JSON."""
    from launcher.cli.live import LegView
    from launcher.cli.render import console, err_console

    return LegView(err_console if json_out else console, verbose)


def show_outcome(outcome: Any, title: str, verbose: bool, json_out: bool, answer: str | None, **extra: Any) -> NoReturn:
    """A rung's or a drill's checks (or its JSON with `extra`), its answer line, and its exit code."""
    from launcher.cli.render import console, print_checks, print_json

    if json_out:
        print_json(outcome_json(outcome, **extra))
    else:
        print_checks(console, f"{title}: run {outcome.run_id}", outcome.checks, verbose)
        if answer:
            console.print(answer)
    raise typer.Exit(outcome.exit_code)

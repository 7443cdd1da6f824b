"""What the commands share: the options every project command takes, the config load, and how
a rung's or a drill's outcome is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from typer._click.types import ParamType  # the click typer vendors (pinned version)

from launcher.config.parse import plain_float, plain_int


class WholeNumber(ParamType):
    """Every integer flag's parser: plain ASCII decimal (launcher.config.parse.PLAIN_INT says
    why: click's int() takes '٣' as 3), within low..high where given."""

    name = "integer"

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            number = value if isinstance(value, int) else plain_int(value)  # an int: the default
        except ValueError as err:
            self.fail(str(err), param, ctx)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            self.fail(f"{number} is not in the range {self.low}..{self.high}", param, ctx)
        return number


class Number(ParamType):
    """Every float flag's parser: the same digits, a point, an exponent (PLAIN_FLOAT)."""

    name = "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            return value if isinstance(value, float) else plain_float(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


class RunId(ParamType):
    """A RUN_ID argument: never empty or blank, which would read as "no run id" (every run)."""

    name = "run_id"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        if not value.strip():
            self.fail(f"{value!r} is not a run id (`launcher ledger` lists them; leave it out for all)", param, ctx)
        return value


WHOLE = WholeNumber()
NUMBER = Number()
RUN_ID = RunId()
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

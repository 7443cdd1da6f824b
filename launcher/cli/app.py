"""The `launcher` command: parses, calls one function, renders, maps errors to exit codes.

Exit codes (docs/design.md): 0 ok, 1 the rung ran and its answer is "no",
2 bad input, 3 refused by a guard, 70 internal error (a bug: please report it).
Errors print one line and the next command to run; LAUNCHER_DEBUG=1 adds the
traceback. Heavy imports (torch never, skypilot/docker lazily) stay out of
`launcher --help` and `launcher ledger`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from launcher.cli import climb, records
from launcher.cli.options import CONFIG, JSON, NUMBER, RUN_ID, WHOLE, WholeNumber, load
from launcher.errors import BadInput, Exit, guarded, print_error

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Walk a GPU training run up the preflight ladder, record every leg, then run it.",
)


def _version(value: bool) -> None:
    if value:
        from launcher import __version__

        typer.echo(f"preflight launcher {__version__}")
        raise typer.Exit(Exit.OK)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Walk a GPU training run up the preflight ladder, record every leg, then run it."""


@app.command()
def init(
    directory: Path = typer.Argument(Path("."), help="Project dir to write into (created if missing)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing launcher.yaml/train.py."),
) -> None:
    """Write a commented starter launcher.yaml and the reference trainer (train.py)."""
    from launcher.cli.init import init_project
    from launcher.cli.render import console

    written = init_project(directory, force=force)
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"next: cd {directory} && launcher review && launcher up static")


@app.command()
def review(config: Path = CONFIG, json_out: bool = JSON) -> None:
    """Record the sha256 of the reviewed files: the bytes every leg will run."""
    from launcher.cli.render import console, print_json
    from launcher.ledger.db import Ledger
    from launcher.manifest import hash_reviewed, record_review

    cfg = load(config)
    files = hash_reviewed(cfg)  # a bad glob is refused before the ledger is made
    ledger = Ledger(cfg.state_path / "ledger.db")
    try:
        rec = record_review(cfg, ledger, files)
    finally:
        ledger.close()
    if json_out:
        print_json({"review_id": rec.id, "digest": rec.digest, "files": rec.files})
        return
    for path, sha in rec.files.items():
        console.print(f"{sha}  {path}")
    console.print(f"review #{rec.id}: {len(rec.files)} files, digest {rec.digest[:16]}")


app.command()(climb.up)
app.add_typer(climb.drill_app, name="drill")


@app.command()
def spend(
    gpus: Optional[str] = typer.Option("T4:1", "--gpus", help="GPUs for the next-rung arithmetic."),
    nodes: int = typer.Option(1, "--nodes", click_type=WHOLE),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """GPU-hours and USD used / reserved / remaining this period, by rung, and what each rung would cost."""
    from launcher.cli.render import console, print_json, print_spend
    from launcher.config.schema import parse_gpus
    from launcher.ledger.db import Ledger
    from launcher.ops.spend import summary
    from launcher.up import check_nodes

    check_nodes(nodes)
    cfg = load(config)
    spec = parse_gpus(gpus)
    # Reading never makes a ledger: with none yet, the arithmetic runs on an empty one in memory.
    ledger_db = Ledger.open_existing(cfg.state_path / "ledger.db") or Ledger(Path(":memory:"))
    try:
        data = summary(cfg, ledger_db, spec, nodes)
    finally:
        ledger_db.close()
    if json_out:
        print_json(data)
    else:
        print_spend(console, data)


@app.command()
def memory(
    gpus: str = typer.Option("T4:1", "--gpus", help="The GPUs each node would get, e.g. T4:2."),
    nodes: int = typer.Option(1, "--nodes", click_type=WHOLE),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Will it fit? Each rank's peak GPU memory, predicted on this CPU from the trainer's own script
    (exit 3 where a rank would not fit)."""
    from launcher.cli.render import console, print_json
    from launcher.ops.memory import ask
    from launcher.up import check_nodes

    check_nodes(nodes)
    decision = ask(load(config), gpus, nodes)
    if json_out:
        print_json(decision.to_json())
    else:
        for line in decision.lines():
            console.print(line, markup=False, highlight=False)
    if decision.worst is not None:
        raise typer.Exit(Exit.REFUSED)


@app.command()
def ledger(
    run_id: Optional[str] = typer.Argument(None, click_type=RUN_ID, help="Show one run."),
    limit: int = typer.Option(20, "--limit", click_type=WholeNumber(1, 100_000), help="Newest N runs."),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Show recorded runs and legs: command lines, file hashes, exit codes, GPU-hours."""
    from launcher.cli.listing import show_ledger

    show_ledger(config, run_id, limit, json_out)


@app.command()
def status(
    run_id: Optional[str] = typer.Argument(
        None, click_type=RUN_ID, help="The run (default: the newest running one, else the newest)."
    ),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Where a run stands: step, rate and ETA, newest checkpoint, headroom, warnings, step-time breakdown."""
    from launcher.cli.render import console, print_json, print_status
    from launcher.ops.status import status as read_status

    data = read_status(load(config), run_id)
    if json_out:
        print_json(data)
    else:
        print_status(console, data)


@app.command()
def stop(
    run_id: str = typer.Argument(..., click_type=RUN_ID, help="The run to stop."),
    timeout: float = typer.Option(
        300.0, "--timeout", click_type=NUMBER, help="Seconds to wait for the final checkpoint before killing the leg."
    ),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Stop a run gracefully: SIGTERM, final checkpoint verified and loadable, teardown; kill on timeout."""
    from launcher.cli.render import console, err_console, print_json
    from launcher.ops.stop import stop as do_stop

    out = err_console if json_out else console
    result = do_stop(load(config), run_id, timeout, lambda line: out.print(line))
    if json_out:
        print_json(result)
    else:
        mark = "[green]clean[/green]" if result.get("clean") else "[yellow]not clean[/yellow]"
        console.print(f"stop {run_id}: {result['outcome']} ({mark}) - {result.get('detail', '')}")
    raise typer.Exit(Exit.OK if result.get("clean") or result["outcome"] == "no leg running" else Exit.NO)


app.command()(records.report)
app.add_typer(records.image_app, name="image")


def main(argv: list[str] | None = None) -> int:
    """Run the app, turn every failure into one line and an exit code."""
    code = guarded(lambda: _run(argv))
    if argv is None:
        sys.exit(code)
    return code


def _run(argv: list[str] | None) -> int:
    from typer._click import exceptions as click_exc  # the click typer vendors (pinned version)

    try:
        result = app(args=argv, prog_name="launcher", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except typer.Exit as done:
        return done.exit_code
    except click_exc.NoArgsIsHelpError:
        return BadInput.exit_code  # the help is already printed
    except click_exc.ClickException as err:
        print_error(err.format_message(), "add --help for usage")
        return BadInput.exit_code if isinstance(err, click_exc.UsageError) else err.exit_code
    except typer.Abort:
        raise KeyboardInterrupt from None


if __name__ == "__main__":
    main()

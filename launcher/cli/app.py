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


CONFIG = typer.Option(Path("launcher.yaml"), "--config", "-c", help="Path to launcher.yaml.")
JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")
VERBOSE = typer.Option(False, "--verbose", "-v", help="Every event of every leg, and every check with its evidence.")


def _load(config: Path):  # noqa: ANN202 - Config, imported lazily
    from launcher.config.schema import load_config

    return load_config(config)


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

    cfg = _load(config)
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


@app.command()
def up(
    rung: str = typer.Argument(..., help="static | rehearsal | smoke | probe | run"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Accelerators, SkyPilot style: T4:2."),
    backend: str = typer.Option("local", "--backend", help="local | docker | sky"),
    nodes: int = typer.Option(1, "--nodes", help="Nodes per leg (sky backend)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would launch and the quota arithmetic."),
    allow_overdraft: bool = typer.Option(False, "--allow-overdraft", help="Launch over quota (recorded)."),
    cpu: bool = typer.Option(
        False,
        "--cpu",
        help="Run a GPU rung's legs on the CPU: a dress rehearsal of "
        "the rung (no GPU checks; the report counts none of it as the target's).",
    ),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps for this rung, overriding the config."),
    retry_until_up: bool = typer.Option(
        False,
        "--retry-until-up",
        help="sky: when no cloud has capacity, keep retrying (SkyPilot's retry_until_up) instead of exiting 3.",
    ),
    skip_preflight: Optional[str] = typer.Option(
        None,
        "--skip-preflight",
        metavar="REASON",
        help="run: launch without a passing report; the reason is recorded in the ledger, status and later reports.",
    ),
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Run one rung of the ladder on fresh instances and record it in the ledger."""
    from launcher.cli.live import LegView
    from launcher.cli.render import console, err_console, print_checks, print_json
    from launcher.up import dry_run as describe_dry_run
    from launcher.up import up as run_up

    cfg = _load(config)
    if dry_run:
        text, refusal, plan = describe_dry_run(
            cfg,
            rung,
            backend,
            gpus,
            nodes,
            cpu=cpu,
            steps=steps,
            allow_overdraft=allow_overdraft,
            skip_preflight=skip_preflight,
        )
        if json_out:
            print_json(
                {
                    "dry_run": True,
                    "text": text,
                    "would_launch": refusal is None,
                    "refusal": refusal.message if refusal else None,
                    "plan": plan,
                }
            )
        else:
            sys.stdout.write(text + "\n")
        if refusal is not None:
            raise refusal  # the exit code the real launch would end in
        return
    with LegView(err_console if json_out else console, verbose) as view:
        outcome = run_up(
            cfg,
            config,
            rung,
            backend,
            gpus,
            view,
            nodes,
            allow_overdraft,
            cpu=cpu,
            steps=steps,
            retry_until_up=retry_until_up,
            skip_preflight=skip_preflight,
        )
    if json_out:
        print_json(
            {
                "run_id": outcome.run_id,
                "rung": outcome.rung,
                "ok": outcome.ok,
                "seconds": round(outcome.seconds, 3),
                "checks": [c.to_json() for c in outcome.checks],
            }
        )
    else:
        print_checks(console, f"rung {outcome.rung}: run {outcome.run_id}", outcome.checks, verbose)
        verdict = "[green]yes[/green]" if outcome.ok else "[red]no[/red]"
        console.print(
            f"answer: {verdict}  ({outcome.seconds:.1f} s; `launcher ledger {outcome.run_id}` for the record)"
        )
    raise typer.Exit(outcome.exit_code)


drill_app = typer.Typer(help="Kill-and-relaunch drills.", no_args_is_help=True)
app.add_typer(drill_app, name="drill")


@drill_app.command("cold-resume")
def drill_cold_resume(
    backend: str = typer.Option("local", "--backend", help="local | docker | sky"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Accelerators, SkyPilot style: T4:2."),
    kills: int = typer.Option(2, "--kills", help="Kills (= sequential resumes)."),
    at: str = typer.Option(
        "auto",
        "--at",
        help="auto (after an LR change, a SIGTERM after an epoch boundary) | "
        "after-push | mid-save | mid-push | mid-verify | mid-step | random | node-lost",
    ),
    kills_at: Optional[str] = typer.Option(None, "--kills-at", help="Kill when rank 0 prints these steps: 7,15."),
    nodes: int = typer.Option(
        1,
        "--nodes",
        help="Nodes per leg (local, docker: each runs the rung's run: "
        "script; --at node-lost loses the last one mid-push).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for --at random."),
    allow_overdraft: bool = typer.Option(False, "--allow-overdraft", help="Launch over quota (recorded)."),
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Kill the instance at a chosen moment, relaunch on an empty disk, check the resume; N times."""
    from launcher.cli.live import LegView
    from launcher.cli.render import console, err_console, print_checks, print_json
    from launcher.up import drill as run_drill

    cfg = _load(config)
    with LegView(err_console if json_out else console, verbose) as view:
        outcome = run_drill(cfg, config, backend, gpus, kills, at, view, seed, allow_overdraft, kills_at, nodes)
    if json_out:
        print_json(
            {
                "run_id": outcome.run_id,
                "ok": outcome.ok,
                "seconds": round(outcome.seconds, 3),
                "checks": [c.to_json() for c in outcome.checks],
            }
        )
    else:
        print_checks(console, f"drill cold-resume: run {outcome.run_id}", outcome.checks, verbose)
        failed = [c.name for c in outcome.checks if not c.ok]
        console.print("answer: [green]yes[/green]" if not failed else f"answer: [red]no[/red] ({'; '.join(failed)})")
    raise typer.Exit(outcome.exit_code)


@drill_app.command("preempt")
def drill_preempt(
    notice: str = typer.Option(
        ...,
        "--notice",
        help="Seconds from SIGTERM to the kill, or aws | gcp | azure | k8s "
        "(110, 25, 25, 0: launcher/cadence.py says why).",
    ),
    at_step: Optional[int] = typer.Option(None, "--at-step", help="The step the notice comes at (default: half way)."),
    backend: str = typer.Option("local", "--backend", help="local | docker"),
    allow_overdraft: bool = typer.Option(False, "--allow-overdraft", help="Launch over quota (recorded)."),
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """A spot preemption: SIGTERM at a step, the kill N seconds later; then a fresh leg resumes."""
    from launcher.cli.live import LegView
    from launcher.cli.render import console, err_console, print_checks, print_json
    from launcher.up import preempt

    cfg = _load(config)
    with LegView(err_console if json_out else console, verbose) as view:
        outcome = preempt(cfg, config, backend, notice, at_step, view, allow_overdraft)
    if json_out:
        print_json(
            {
                "run_id": outcome.run_id,
                "ok": outcome.ok,
                "seconds": round(outcome.seconds, 3),
                "checks": [c.to_json() for c in outcome.checks],
            }
        )
    else:
        print_checks(console, f"drill preempt: run {outcome.run_id}", outcome.checks, verbose)
    raise typer.Exit(outcome.exit_code)


@app.command()
def spend(
    gpus: Optional[str] = typer.Option("T4:1", "--gpus", help="GPUs for the next-rung arithmetic."),
    nodes: int = typer.Option(1, "--nodes"),
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
    cfg = _load(config)
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
def ledger(
    run_id: Optional[str] = typer.Argument(None, help="Show one run."),
    limit: int = typer.Option(20, "--limit", min=1, max=100_000, help="Newest N runs."),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Show recorded runs and legs: command lines, file hashes, exit codes, GPU-hours."""
    from launcher.cli.listing import show_ledger

    show_ledger(config, run_id, limit, json_out)


@app.command()
def status(
    run_id: Optional[str] = typer.Argument(None, help="The run (default: the newest running one, else the newest)."),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Where a run stands: step, rate and ETA, newest checkpoint, headroom, warnings, step-time breakdown."""
    from launcher.cli.render import console, print_json, print_status
    from launcher.ops.status import status as read_status

    data = read_status(_load(config), run_id)
    if json_out:
        print_json(data)
    else:
        print_status(console, data)


@app.command()
def stop(
    run_id: str = typer.Argument(..., help="The run to stop."),
    timeout: float = typer.Option(
        300.0, "--timeout", help="Seconds to wait for the final checkpoint before killing the leg."
    ),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Stop a run gracefully: SIGTERM, final checkpoint verified and loadable, teardown; kill on timeout."""
    from launcher.cli.render import console, err_console, print_json
    from launcher.ops.stop import stop as do_stop

    out = err_console if json_out else console
    result = do_stop(_load(config), run_id, timeout, lambda line: out.print(line))
    if json_out:
        print_json(result)
    else:
        mark = "[green]clean[/green]" if result.get("clean") else "[yellow]not clean[/yellow]"
        console.print(f"stop {run_id}: {result['outcome']} ({mark}) - {result.get('detail', '')}")
    raise typer.Exit(Exit.OK if result.get("clean") or result["outcome"] == "no leg running" else Exit.NO)


@app.command()
def report(
    run_ids: Optional[list[str]] = typer.Argument(
        None, help="Runs to report (default: the newest run of each rung on the newest reviewed files)."
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        help="Folder to write (default: <state_dir>/reports/preflight-<UTC time>); must not exist or be empty.",
    ),
    check_dir: Optional[Path] = typer.Option(
        None,
        "--check",
        help="Re-verify a report folder's signature instead (exit 1 if any file was edited, added or removed).",
    ),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Write the signed preflight report: the eight proofs with evidence, the plan numbers, plots.
    Exits 1 when a proof FAILs (the folder is written and signed either way)."""
    from launcher.cli.render import console, print_json

    if check_dir is not None:
        from launcher.report import check

        if run_ids or out:
            raise BadInput("--check DIR takes no run ids and no --out")
        problems = check(check_dir)
        if json_out:
            print_json({"folder": str(check_dir), "intact": not problems, "problems": problems})
        elif problems:
            console.print(f"[red]report {check_dir} was changed after it was signed[/red]")
            for line in problems:
                console.print(f"  {line}")
        else:
            console.print(f"report {check_dir}: intact (every file matches signature.json)")
        raise typer.Exit(Exit.NO if problems else Exit.OK)
    from launcher.report import build

    cfg = _load(config)
    folder, data = build(cfg, list(run_ids or []), out)
    failed = [p["number"] for p in data["proofs"] if p["status"] == "FAIL"]
    if json_out:
        print_json({"folder": str(folder), **data})
    else:
        from launcher.cli.render import print_report

        print_report(console, folder, data)
    if failed:  # the folder is written and signed either way: it is the evidence of the failure
        raise typer.Exit(Exit.NO)


image_app = typer.Typer(help="Build and push the leg image (docker and sky backends).", no_args_is_help=True)
app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(
    base: Optional[str] = typer.Option(None, "--base", help="Base image (default: digest-pinned)."),
    gpu: bool = typer.Option(False, "--gpu", help="CUDA torch base + docker/gpu.lock."),
    sky: Optional[bool] = typer.Option(
        None, "--sky/--no-sky", help="Bake in what SkyPilot installs on each fresh node (default: with --gpu)."
    ),
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Build the image from the reviewed files; record its id and baked hashes in the ledger."""
    from launcher import image
    from launcher.cli.render import console, err_console, print_json
    from launcher.ledger.db import Ledger

    cfg = _load(config)
    say = (err_console if json_out else console).print
    ledger = Ledger(cfg.state_path / "ledger.db")
    try:
        built = image.build(cfg, ledger, base or cfg.image.base, gpu, say, sky=sky)
    finally:
        ledger.close()
    if json_out:
        print_json({"tag": built.tag, "image_id": built.image_id, "seconds": round(built.seconds, 1)})
    else:
        console.print(f"built {built.tag} = {built.image_id} in {built.seconds:.0f} s")


@image_app.command("push")
def image_push(
    repository: Optional[str] = typer.Option(None, "--repository", help="Overrides image.repository."),
    config: Path = CONFIG,
) -> None:
    """Tag and push the image built from the reviewed files; record repo@sha256 for the sky backend."""
    from launcher import image
    from launcher.cli.render import console
    from launcher.ledger.db import Ledger

    cfg = _load(config)
    repo = repository or cfg.image.repository
    if repo is None:
        raise BadInput(
            "no registry repository to push to", hint="set image.repository in launcher.yaml or pass --repository"
        )
    ledger = Ledger(cfg.state_path / "ledger.db")
    try:
        ref = image.push(cfg, ledger, repo, console.print)
    finally:
        ledger.close()
    console.print(f"pushed {ref}")


@image_app.command("list")
def image_list(config: Path = CONFIG, json_out: bool = JSON) -> None:
    """Images built for this project, newest first."""
    from launcher.cli.render import console, print_images, print_json
    from launcher.ledger.db import Ledger

    cfg = _load(config)
    db = Ledger.open_existing(cfg.state_path / "ledger.db")
    rows = [] if db is None else db.images()
    if db is not None:
        db.close()
    if json_out:
        print_json(rows)
    else:
        print_images(console, rows)


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

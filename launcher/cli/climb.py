"""The commands that launch legs: `launcher up RUNG` and the drills (`launcher drill ...`).
Registered on the app by launcher.cli.app."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from launcher.cli.options import CONFIG, GPUS, JSON, OVERDRAFT, VERBOSE, WHOLE, leg_view, load, show_outcome

CPU = typer.Option(
    False,
    "--cpu",
    help="Run a GPU rung's legs on the CPU: a dress rehearsal of "
    "the rung (no GPU checks; the report counts none of it as the target's).",
)
RETRY_UNTIL_UP = typer.Option(
    False,
    "--retry-until-up",
    help="sky: when no cloud has capacity, keep retrying (SkyPilot's retry_until_up) instead of exiting 3.",
)
SKIP_PREFLIGHT = typer.Option(
    None,
    "--skip-preflight",
    metavar="REASON",
    help="run: launch without a passing report; the reason is recorded in the ledger, status and later reports.",
)


def up(
    rung: str = typer.Argument(..., help="static | rehearsal | smoke | probe | run"),
    gpus: Optional[str] = GPUS,
    backend: str = typer.Option("local", "--backend", help="local | docker | sky"),
    nodes: int = typer.Option(1, "--nodes", click_type=WHOLE, help="Nodes per leg (sky backend)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would launch and the quota arithmetic."),
    allow_overdraft: bool = OVERDRAFT,
    cpu: bool = CPU,
    steps: Optional[int] = typer.Option(
        None, "--steps", click_type=WHOLE, help="Steps for this rung, overriding the config."
    ),
    retry_until_up: bool = RETRY_UNTIL_UP,
    skip_preflight: Optional[str] = SKIP_PREFLIGHT,
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Run one rung of the ladder on fresh instances and record it in the ledger."""
    from launcher.up import up as run_up

    cfg = load(config)
    if dry_run:
        _show_dry_run(cfg, rung, backend, gpus, nodes, cpu, steps, allow_overdraft, skip_preflight, json_out)
        return
    with leg_view(verbose, json_out) as view:
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
    verdict = "[green]yes[/green]" if outcome.ok else "[red]no[/red]"
    answer = f"answer: {verdict}  ({outcome.seconds:.1f} s; `launcher ledger {outcome.run_id}` for the record)"
    show_outcome(outcome, f"rung {outcome.rung}", verbose, json_out, answer, rung=outcome.rung)


def _show_dry_run(
    cfg: Any,
    rung: str,
    backend: str,
    gpus: str | None,
    nodes: int,
    cpu: bool,
    steps: int | None,
    allow_overdraft: bool,
    skip_preflight: str | None,
    json_out: bool,
) -> None:
    """`launcher up --dry-run`: the very plan the launch would execute, shown; raises the refusal
    the launch would end in (its exit code)."""
    from launcher.cli.dryrun import describe
    from launcher.cli.render import print_json
    from launcher.up import dry_run

    made = dry_run(
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
    try:
        text, refusal, plan = describe(made), made.refusal(dry_run=True), made.to_json()
    finally:
        made.close()
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


drill_app = typer.Typer(help="Kill-and-relaunch drills.", no_args_is_help=True)


@drill_app.command("cold-resume")
def drill_cold_resume(
    backend: str = typer.Option("local", "--backend", help="local | docker | sky"),
    gpus: Optional[str] = GPUS,
    kills: Optional[int] = typer.Option(
        None,
        "--kills",
        click_type=WHOLE,
        help="Kills (= sequential resumes); default 2, or one per moment of an --at list.",
    ),
    at: str = typer.Option(
        "auto",
        "--at",
        help="auto (after an LR change, a SIGTERM after an epoch boundary) | "
        "after-push | mid-save | mid-push | mid-verify | mid-step | random | node-lost | "
        "mid-epoch | epoch-end | mid-epoch-1 (a SIGTERM placed from the straight run's epochs); "
        "or a comma list, one moment per kill: mid-epoch,epoch-end,mid-epoch-1.",
    ),
    kills_at: Optional[str] = typer.Option(None, "--kills-at", help="Kill when rank 0 prints these steps: 7,15."),
    nodes: int = typer.Option(
        1,
        "--nodes",
        click_type=WHOLE,
        help="Nodes per leg (local, docker: each runs the rung's run: "
        "script; --at node-lost loses the last one mid-push).",
    ),
    seed: int = typer.Option(0, "--seed", click_type=WHOLE, help="Seed for --at random."),
    allow_overdraft: bool = OVERDRAFT,
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """Kill the instance at a chosen moment, relaunch on an empty disk, check the resume; N times."""
    from launcher.cli.drills import drill as run_drill

    cfg = load(config)
    with leg_view(verbose, json_out) as view:
        outcome = run_drill(cfg, config, backend, gpus, kills, at, view, seed, allow_overdraft, kills_at, nodes)
    failed = [c.name for c in outcome.checks if not c.ok]
    answer = "answer: [green]yes[/green]" if not failed else f"answer: [red]no[/red] ({'; '.join(failed)})"
    show_outcome(outcome, "drill cold-resume", verbose, json_out, answer)


@drill_app.command("preempt")
def drill_preempt(
    notice: str = typer.Option(
        ...,
        "--notice",
        help="Seconds from SIGTERM to the kill, or aws | gcp | azure | k8s "
        "(110, 25, 25, 0: launcher/cadence.py says why).",
    ),
    at_step: Optional[int] = typer.Option(
        None, "--at-step", click_type=WHOLE, help="The step the notice comes at (default: half way)."
    ),
    backend: str = typer.Option("local", "--backend", help="local | docker"),
    allow_overdraft: bool = OVERDRAFT,
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """A spot preemption: SIGTERM at a step, the kill N seconds later; then a fresh leg resumes."""
    from launcher.cli.drills import preempt

    cfg = load(config)
    with leg_view(verbose, json_out) as view:
        outcome = preempt(cfg, config, backend, notice, at_step, view, allow_overdraft)
    show_outcome(outcome, "drill preempt", verbose, json_out, None)


@drill_app.command("hang")
def drill_hang(
    rank: int = typer.Option(1, "--rank", click_type=WHOLE, help="The rank to stop (its RANK; default 1)."),
    at_step: Optional[int] = typer.Option(
        None, "--at-step", click_type=WHOLE, help="The step it stops at (default: half way)."
    ),
    how: str = typer.Option(
        "stop",
        "--how",
        help="stop: SIGSTOP to the rank | collective: the rank blocks in a receive no rank sends "
        "(the runtime's Session does it: LAUNCHER_DRILL_HANG).",
    ),
    backend: str = typer.Option("local", "--backend", help="local | docker"),
    nodes: int = typer.Option(1, "--nodes", click_type=WHOLE, help="Nodes per leg (local, docker)."),
    allow_overdraft: bool = OVERDRAFT,
    verbose: bool = VERBOSE,
    config: Path = CONFIG,
    json_out: bool = JSON,
) -> None:
    """A hung rank: SIGSTOP to one rank at a step; the watchdog must find it and end the leg, then a fresh leg resumes."""
    from launcher.cli.drills import hang

    cfg = load(config)
    with leg_view(verbose, json_out) as view:
        outcome = hang(cfg, config, backend, rank, at_step, nodes, view, allow_overdraft, how)
    show_outcome(outcome, "drill hang", verbose, json_out, None)

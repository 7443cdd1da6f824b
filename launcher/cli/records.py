"""The commands that write or build records: `launcher report` and `launcher image ...`.
Registered on the app by launcher.cli.app."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from launcher.cli.options import CONFIG, JSON, RUN_ID, load
from launcher.errors import BadInput, Exit


def report(
    run_ids: Optional[list[str]] = typer.Argument(
        None,
        click_type=RUN_ID,
        help="Runs to report (default: the newest run of each rung on the newest reviewed files).",
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

    cfg = load(config)
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

    cfg = load(config)
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

    cfg = load(config)
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

    cfg = load(config)
    db = Ledger.open_existing(cfg.state_path / "ledger.db")
    rows = [] if db is None else db.images()
    if db is not None:
        db.close()
    if json_out:
        print_json(rows)
    else:
        print_images(console, rows)

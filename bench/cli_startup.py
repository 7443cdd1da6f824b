"""Wall time of host commands that must not pay for torch/skypilot, against the
baselines they beat: the same command with torch imported eagerly (what the CLI
would cost if launcher/ imported torch at module level), `launcher ledger`
parsed by the typer app instead of launcher.entry's fast path, and bare Python.

    .venv/bin/python bench/cli_startup.py [--runs 15]

Prints a markdown table (median and min of N runs each, one process per run).
Commands run with Python's bytecode cache on, as on a user's machine (some
sandboxes set PYTHONDONTWRITEBYTECODE=1, which recompiles the launcher's own
modules on every start; it is removed here, and the first run warms the cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = Path(sys.executable).with_name("launcher")


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], cwd: Path, runs: int, code: int = 0) -> tuple[float, float]:
    """Median and min wall time of `argv`, which must exit `code` every time."""
    samples = []
    for i in range(runs + 1):  # the first run warms the bytecode cache and is not counted
        began = time.perf_counter()
        rc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV).returncode
        if rc != code:
            raise SystemExit(f"{argv}: exit {rc}, expected {code}")
        if i:
            samples.append(time.perf_counter() - began)
    return statistics.median(samples), min(samples)


def eager(args: list[str]) -> list[str]:
    code = f"import torch, sys; from launcher.cli.app import main; main({args!r})"
    return [sys.executable, "-c", code]


def typer_path(args: list[str]) -> list[str]:
    return [sys.executable, "-c", f"from launcher.cli.app import main; main({args!r})"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=15)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "proj"
        for args in (["init", str(project)], ["review"], ["up", "static"]):
            subprocess.run(
                [str(LAUNCHER), *args], cwd=project if args[0] != "init" else tmp, stdout=subprocess.DEVNULL, check=True
            )
        up_probe = [str(LAUNCHER), "up", "probe", "--gpus", "T4:2"]
        cases: list[tuple] = [
            ("python -c pass (floor)", [sys.executable, "-c", "pass"]),
            ("launcher --help", [str(LAUNCHER), "--help"]),
            ("baseline: --help with torch imported eagerly", eager(["--help"])),
            ("launcher ledger", [str(LAUNCHER), "ledger"]),
            ("baseline: ledger parsed by the typer app (no fast path)", typer_path(["ledger"])),
            ("baseline: ledger with torch imported eagerly", eager(["ledger"])),
            ("launcher ledger --json", [str(LAUNCHER), "ledger", "--json"]),
            # the headline command on a host without two T4s: refused by the plan's gpus guard (exit 3)
            ("launcher up probe --gpus T4:2 (refused: no such GPUs here, exit 3)", up_probe, 3),
            ("launcher up probe --gpus T4:2 --dry-run (the same refusal)", [*up_probe, "--dry-run"], 3),
            (
                "launcher up rehearsal --dry-run (a plan without the gpus guard)",
                [str(LAUNCHER), "up", "rehearsal", "--dry-run"],
            ),
        ]
        print(f"| command | median s | min s |  ({ns.runs} runs each, {sys.platform}, Python {sys.version.split()[0]})")
        print("|---|---|---|")
        for label, argv, *code in cases:
            med, best = timed(argv, project, ns.runs, *code)
            print(f"| {label} | {med:.3f} | {best:.3f} |")


if __name__ == "__main__":
    main()

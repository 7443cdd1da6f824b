"""`pip install preflight-launcher` is the CLI and the torch-free wire, no torch: torch is the
[torch] extra (pyproject.toml), which only a trainer run in the launcher's own interpreter needs.
Proved in a fresh venv, from a copy of the tree (the build writes nothing into the checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXTRA_HINT = "pip install 'preflight-launcher[torch]'"


def copy_tree(dest: Path) -> None:
    """The files git knows of (tracked, or new and not ignored): no venv, no build output."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():  # a tracked file deleted in the work tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)


def test_a_plain_install_runs_the_cli_without_torch(tmp_path: Path) -> None:
    began = time.monotonic()
    src, venv, work = tmp_path / "src", tmp_path / "venv", tmp_path / "work"
    copy_tree(src)
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_ = venv / "bin"
    pip = subprocess.run(
        [str(bin_ / "python"), "-m", "pip", "install", "-q", str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    def run(*argv: str, cwd: Path = work) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)

    probe = run(str(bin_ / "python"), "-c", "import launcher; print(launcher.__file__); import torch")
    assert probe.returncode == 1 and "No module named 'torch'" in probe.stderr, probe.stderr
    assert probe.stdout.startswith(str(venv)), probe.stdout  # the installed copy, not the checkout

    launcher = str(bin_ / "launcher")
    project = work / "proj"
    for argv, cwd in (
        (["--help"], work),
        (["init", str(project)], work),
        (["review"], project),
        (["up", "static", "--dry-run"], project),
        (["ledger"], project),
    ):
        done = run(launcher, *argv, cwd=cwd)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)

    # The legs do need torch where they run in this interpreter: the answer says how to get it.
    for rung in ("static", "rehearsal"):
        done = run(launcher, "up", rung, cwd=project)
        assert done.returncode == 1 and EXTRA_HINT in done.stdout, (rung, done.stdout, done.stderr)
    print(f"fresh venv, install and commands: {time.monotonic() - began:.1f} s")

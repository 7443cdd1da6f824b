"""Setup the tests of tests/legs share, made once per test worker: a project after `launcher up
static`, and one after `launcher up rehearsal`. The tests that take them only read them (the
command's output, the ledger, the logs, status, report); a test that changes one works on a
`clone` of it (tests/helpers.py)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SECRET, Done, Rehearsed, run_cli


def _copy(reviewed_project: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    root = tmp_path_factory.mktemp(name) / "proj"
    shutil.copytree(reviewed_project, root, symlinks=True)
    return root


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR for the shared setup's legs (see the `leg_tmp` fixture: a DataLoader
    worker's socket path must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="leg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def after_static(reviewed_project: Path, tmp_path_factory: pytest.TempPathFactory, short_tmp: Path) -> Done:
    """A reviewed project after one `launcher up static --json` (the ledger's only run)."""
    root = _copy(reviewed_project, tmp_path_factory, "static")
    res = run_cli(["up", "static", "--json"], cwd=root, env={"TMPDIR": str(short_tmp)})
    assert res.code == 0, res.out + res.err
    return Done(root, res)


@pytest.fixture(scope="session")
def rehearsed(reviewed_project: Path, tmp_path_factory: pytest.TempPathFactory, short_tmp: Path) -> Rehearsed:
    """A reviewed project after one passing `launcher up rehearsal --json` of the reference
    trainer (about 20 s of legs, once per worker), its dry run shown first."""
    root = _copy(reviewed_project, tmp_path_factory, "rehearsed")
    env = {"TMPDIR": str(short_tmp)}
    dry = run_cli(["up", "rehearsal", "--dry-run", "--json"], cwd=root, env=env)
    assert dry.code == 0, dry.err
    shown_at = time.time()
    res = run_cli(["up", "rehearsal", "--json"], cwd=root, env={**env, "HF_TOKEN": SECRET})
    assert res.code == 0, res.out + res.err
    return Rehearsed(root, res, dry, shown_at)

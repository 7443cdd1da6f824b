"""Shared fixtures: a fresh project made by `launcher init`, and a CLI runner.

The CLI runs as a subprocess (the real console script), so exit codes,
stdout/stderr and imports are exactly what a user gets.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

LAUNCHER = Path(sys.executable).with_name("launcher")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> Result:
    full_env = dict(os.environ)
    full_env.pop("LAUNCHER_DEBUG", None)
    full_env.update(env or {})
    proc = subprocess.run([str(LAUNCHER), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def leg_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Legs' fresh dirs go under this test's tmp (TMPDIR is what mkdtemp uses)."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    return path


@pytest.fixture
def project(tmp_path: Path, leg_tmp: Path) -> Path:
    """A project written by `launcher init`, reviewed."""
    root = tmp_path / "proj"
    res = run_cli(["init", str(root)], cwd=tmp_path)
    assert res.code == 0, res.err
    res = run_cli(["review"], cwd=root)
    assert res.code == 0, res.err
    return root


def run_rows(project: Path) -> int:
    """How many runs the project's ledger holds (0 when there is no ledger)."""
    db = project / ".launcher" / "ledger.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def assert_one_line_error(res: Result, code: int, *needles: str) -> None:
    """Exit `code`, an `error:` line naming the needles, and never a traceback."""
    assert res.code == code, (res.code, res.out, res.err)
    assert "Traceback" not in res.err + res.out
    first = res.err.strip().splitlines()[0]
    assert first.startswith("error: "), res.err
    for needle in needles:
        assert needle in first, (needle, first)


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A loopback Hub (tests/hub_server.py) for the real huggingface_hub client."""
    from huggingface_hub import constants

    from hub_server import HubServer

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # uploads go through LFS, not xet
    with HubServer(token="hf_good") as server:
        yield server


def hub_store(server, namespace: str = "runs/r1", *, token: str = "hf_good", timeout_s: float = 10.0,  # noqa: ANN001
              repo: str = "tester/ckpts", key: bytes | None = None):
    """A HubStore on the loopback server, with retries short enough for tests."""
    from runtime.store.hub import HubStore
    from runtime.store.retry import RetryPolicy

    return HubStore(f"hf://{repo}", namespace, token=token, endpoint=server.url, timeout_s=timeout_s,
                    retry=RetryPolicy(attempts=4, base_s=0.01, max_backoff_s=0.05, deadline_s=10), key=key)


SKY_IMAGE_REF = "localhost:5000/preflight/demo@sha256:" + "ab" * 32
"""A pushed image the sky tests' ledgers record (no registry is contacted)."""


@pytest.fixture
def sky_project(project: Path, hub_server, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    """The project with a hub store and a (recorded) pushed image of its reviewed files."""
    data = yaml.safe_load((project / "launcher.yaml").read_text())
    data["store"] = "hf://tester/ckpts"
    (project / "launcher.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    from launcher.config import load_config
    from launcher.ledger import Ledger
    from launcher.manifest import files_digest

    cfg = load_config(project / "launcher.yaml")
    ledger = Ledger(cfg.state_path / "ledger.db")
    files = ledger.latest_review().files
    row = ledger.record_image({"tag": "t", "image_id": "sha256:" + "0" * 64, "base": "b", "lock": "cpu.lock",
                               "files_digest": files_digest(files), "files": files, "runtime_digest": "r",
                               "built_at": 0.0, "seconds": 0.0})
    ledger.set_pushed(row, SKY_IMAGE_REF)
    ledger.close()
    return cfg



def pytest_configure(config: pytest.Config) -> None:
    """SkyPilot's own API server for the whole session (tests/sky_server.py), started before
    any test module imports `sky`: the client reads SKY_RUNTIME_DIR (where the vendored
    catalog is) at import, and a client that finds no server starts one of its own in the
    real HOME. Every test and every launcher subprocess talks to this one."""
    import shutil
    import tempfile

    from tests import sky_server

    home = Path(tempfile.mkdtemp(prefix="preflight-skyhome-"))
    try:
        server = sky_server.start(home)
    except Exception:
        shutil.rmtree(home, ignore_errors=True)
        raise
    os.environ.update(server.env)
    config.stash[_SKY_SERVER] = server
    sky_server.SESSION.append(server)


def sky_server_of():  # noqa: ANN201 - tests.sky_server.SkyServer
    """The session's SkyPilot API server (to switch which clouds it has enabled)."""
    from tests.sky_server import SESSION

    return SESSION[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    server = config.stash.get(_SKY_SERVER, None)
    if server is not None:
        server.stop()
        shutil.rmtree(server.home, ignore_errors=True)


_SKY_SERVER = pytest.StashKey()

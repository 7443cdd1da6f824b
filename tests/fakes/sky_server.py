"""SkyPilot's own API server, offline, for the real-SkyPilot test tier.

No cloud and no internet here, so the server gets what it would otherwise
download or detect: a minimal slice of the public catalog (vendored under
tests/assets/sky-catalog, see its SOURCE.md) and one cloud (GCP) marked enabled
in its cache, as `sky check` would leave it. Everything else is SkyPilot's own
code: the request API, the task parser, the optimizer's pick and its prices,
its exceptions. The server runs under a HOME (and SKY_RUNTIME_DIR) of its own,
on a free port, and is stopped at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CATALOG = Path(__file__).parent.parent / "assets" / "sky-catalog" / "v8"
ENABLED_CLOUD = "GCP"
SESSION: list["SkyServer"] = []
"""The test session's server (conftest starts it before any test module imports sky)."""


# Run against the new server: wait for its own on-boot `sky check` (which finds no credentials here
# and would overwrite what we set), then print SkyPilot's answer to "which clouds may this workspace
# use" (cached beside the enabled ones: a mismatch makes SkyPilot check again).
SETTLE = """
import json, sky
from sky.check import _get_workspace_allowed_clouds as allowed
from sky.server import constants
try:
    sky.get(constants.ON_BOOT_CHECK_REQUEST_ID)
except Exception:
    pass
print(json.dumps(allowed('default')))
"""


@dataclass
class SkyServer:
    home: Path
    port: int
    _allowed: list[str] | None = None
    base_env: dict[str, str] | None = None
    """The environment the server starts under, where not the process's own at the time: one
    started in the background takes a copy first, so that a test's monkeypatched variables
    (a TMPDIR of its own, deleted after it) never reach the server."""

    @property
    def env(self) -> dict[str, str]:
        """What a client (and the server) needs to find this server and its catalog."""
        return {"SKYPILOT_API_SERVER_LOCAL_PORT": str(self.port), "SKY_RUNTIME_DIR": str(self.home)}

    def stop(self) -> None:
        subprocess.run(
            [_sky_cli(), "api", "stop"], env=self._server_env(), capture_output=True, timeout=60, check=False
        )

    def _server_env(self) -> dict[str, str]:
        return {**(os.environ if self.base_env is None else self.base_env), **self.env, "HOME": str(self.home)}

    def set_enabled(self, clouds: list[str]) -> None:
        """SkyPilot's cache of `sky check`'s answer (what the optimizer may choose from), with
        the allowed clouds it was computed under (else SkyPilot re-runs the check, which
        finds no credentials here and empties it)."""
        if self._allowed is None:
            res = subprocess.run(
                [sys.executable, "-c", SETTLE],
                env=self._server_env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            self._allowed = json.loads(res.stdout.strip().splitlines()[-1])
        db = sqlite3.connect(self.home / ".sky" / "state.db", timeout=30)
        try:
            with db:
                for key, value in (
                    ("allowed_clouds_default", self._allowed),
                    ("enabled_clouds_default_compute", clouds),
                ):
                    db.execute("INSERT OR REPLACE INTO config (key, value) VALUES (?, ?)", (key, json.dumps(value)))
        finally:
            db.close()


def _sky_cli() -> str:
    return str(Path(sys.executable).parent / "sky")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_catalog(home: Path) -> None:
    """The vendored catalog where SkyPilot reads it; no .meta md5, so SkyPilot treats it as
    a local catalog and never tries to refresh it from the network."""
    target = home / ".sky" / "catalogs" / "v8"
    for src in CATALOG.rglob("*.csv"):
        dst = target / src.relative_to(CATALOG)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def plan(home: Path) -> SkyServer:
    """The server `start` will run under `home`, on a free port, not started yet: its `env` is
    known (and may be set) before anything imports `sky`."""
    return SkyServer(home, free_port())


def start(home: Path, timeout_s: float = 120.0, server: SkyServer | None = None) -> SkyServer:
    """`sky api start` under `home` (on `server`'s port where given), with the catalog and GCP
    enabled; raises if it does not come up."""
    if shutil.which("rsync") is None:
        raise RuntimeError("SkyPilot's API server host needs rsync (the Makefile installs it)")
    home.mkdir(parents=True, exist_ok=True)
    install_catalog(home)
    server = server or plan(home)
    res = subprocess.run(
        [_sky_cli(), "api", "start", "--port", str(server.port)],
        env=server._server_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"sky api start failed: {res.stdout[-2000:]} {res.stderr[-2000:]}")
    deadline = time.time() + timeout_s
    while not (home / ".sky" / "state.db").exists() and time.time() < deadline:
        time.sleep(0.2)
    server.set_enabled([ENABLED_CLOUD])
    return server

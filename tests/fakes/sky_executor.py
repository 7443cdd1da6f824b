"""The executor of the sky stand-in (sky_standin.py), as SkyPilot's API server has executor processes.

Workers and controllers are forked from an executor: a process that has imported SkyPilot once,
as the API server's executor processes have, so a request does not pay SkyPilot's import (about
2 s of CPU here) again. There is one per SkyPilot home (SKY_RUNTIME_DIR: one per test worker; the
state dir where that is unset), started by the first client, gone with that directory or after
EXECUTOR_IDLE_S without a call. It claims its socket before it imports anything, so a request
made while it imports waits for it rather than importing SkyPilot a second time in a fresh
interpreter; a fresh interpreter (the payload on its stdin) is left for an executor that cannot
be started or dies before it answers. Each child starts a session of its own and takes its
caller's environment, working directory and output file, as a fresh interpreter would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().with_name("sky_standin.py")
"""The stand-in's entry point: `python SCRIPT ROLE PATH` runs a role in a fresh interpreter."""

EXECUTOR_IDLE_S = 120.0
"""An executor with no request for this long (or whose directory is gone) exits."""
EXECUTOR_START_S = 15.0
"""How long a client waits for a new executor to claim its socket before it runs a fresh interpreter."""
EXECUTOR_ANSWER_S = 120.0
"""How long a client waits for the pid of its child: an executor still importing SkyPilot answers
once it has (seconds under load)."""
_EXECUTOR_IMPORTS = (
    "sky",
    "sky.jobs",
    "sky.execution",
    "sky.exceptions",
    "sky.task",
    "sky.sky_logging",
    "sky.jobs.state",
    "sky.jobs.utils",
    "sky.jobs.client.sdk",
    "sky.client.sdk",
    "sky.server.requests.payloads",
    "sky.schemas.api.responses",
    "sky.skylet.constants",
    "sky.utils.dag_utils",
    "sky.utils.common_utils",
    "sky.utils.status_lib",
    "sky.utils.cluster_utils",
    "sky.utils.yaml_utils",
)
"""What a worker or a controller imports: loaded once by the executor, before it forks any."""


def _executor_home(root: Path) -> Path:
    """The directory an executor serves and lives with: the SkyPilot home of this test worker
    (every state dir under it shares one SkyPilot import), else the state dir itself."""
    home = os.environ.get("SKY_RUNTIME_DIR")
    return Path(home) if home and Path(home).is_dir() else root


def _executor_address(home: Path) -> str:
    """An abstract unix socket (no path-length limit, gone with its process), one per directory."""
    import hashlib

    return "\0preflight-standin-" + hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:24]


def _executor_call(root: Path, header: dict[str, Any], data: bytes) -> int | None:
    """Ask the executor to fork `header["role"]`; the child's pid, or None if no executor took
    the call (none could be started, or it died first: it closes without a word and forks
    nothing). A call it took but did not answer in time is an error, never a None: the child
    may be running, and a fresh interpreter would run the request twice."""
    import socket

    home = _executor_home(root)
    sock = _executor_connect(home)
    if sock is None:
        return None
    try:
        sock.settimeout(EXECUTOR_ANSWER_S)
        try:
            blob = json.dumps(header).encode()
            sock.sendall(len(blob).to_bytes(8, "big") + blob + len(data).to_bytes(8, "big") + data)
        except OSError:
            return None
        answer = b""
        while not answer.endswith(b"\n"):
            try:
                chunk = sock.recv(64)
            except socket.timeout as exc:
                raise RuntimeError(
                    f"stand-in: the executor of {home} took a {header['role']} call and did not "
                    f"answer in {EXECUTOR_ANSWER_S:.0f} s"
                ) from exc
            if not chunk:
                return None
            answer += chunk
        return int(answer)
    finally:
        sock.close()


def _executor_connect(home: Path) -> Any:
    """A socket connected to the executor of `home`, starting one if none listens; None if
    none has claimed its socket within EXECUTOR_START_S."""
    deadline = time.monotonic() + EXECUTOR_START_S
    started = False
    while True:
        sock = _executor_socket(home)
        if sock is not None:
            return sock
        if time.monotonic() > deadline:
            return None
        if not started:
            _start_executor(home)
            started = True
        time.sleep(0.05)


def _ensure_executor(root: Path) -> None:
    """Start the executor now (if none listens), so that it imports while the caller goes on."""
    home = _executor_home(root)
    sock = _executor_socket(home)
    if sock is None:
        _start_executor(home)
    else:
        sock.close()


def _executor_socket(home: Path) -> Any:
    """A socket connected to the executor of `home` if one has claimed its name, else None."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_executor_address(home))
        return sock
    except OSError:
        sock.close()
        return None


def _start_executor(home: Path) -> None:
    """Start an executor for `home`, detached. Two started at once are harmless: the socket's
    name is claimed once, and the one that cannot bind it exits."""
    with (home / "standin-executor.out").open("ab") as out:
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "executor", str(home)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=home,
            start_new_session=True,
        )


def _spawn(
    root: Path, role: str, path: Path, cwd: Path, out: Path, data: bytes
) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Start `sky_standin.py ROLE PATH` detached (a session of its own), stdout and stderr
    appended to `out`, `data` its payload: forked from the state dir's executor, which has
    SkyPilot imported already (as the API server's executor processes have), else a fresh
    interpreter with the payload on its stdin. Its pid, and the Popen when we are its parent."""
    header = {"role": role, "path": str(path), "cwd": str(cwd), "out": str(out), "env": dict(os.environ)}
    pid = _executor_call(root, header, data)
    if pid is not None:
        return pid, None
    with out.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), role, str(path)],
            stdin=subprocess.PIPE,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a child that died at once says so where it is read
        proc.stdin.write(data)
        proc.stdin.close()
    return proc.pid, proc


def _read_exact(conn: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise EOFError("the client hung up")
        buf += chunk
    return buf


def run_executor(root: Path) -> None:
    """Import what workers and controllers need, then fork one per call: the child starts a
    session of its own, takes the caller's environment, working directory and output file, and
    runs the role exactly as `sky_standin.py ROLE PATH` would, with the payload handed over."""
    import importlib
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_executor_address(root))  # claimed first: a second executor started beside it exits here
    except OSError:
        return
    listener.listen(64)  # callers connect now and wait while SkyPilot is imported
    for name in _EXECUTOR_IMPORTS:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children: no zombies
    listener.settimeout(1.0)
    idle_since = time.monotonic()
    while root.is_dir() and time.monotonic() - idle_since < EXECUTOR_IDLE_S:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        with conn:
            conn.settimeout(30)
            try:
                header = json.loads(_read_exact(conn, int.from_bytes(_read_exact(conn, 8), "big")))
                data = _read_exact(conn, int.from_bytes(_read_exact(conn, 8), "big"))
            except (OSError, EOFError, ValueError):
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _executor_child(header, data)
            with contextlib.suppress(OSError):
                conn.sendall(f"{pid}\n".encode())
        idle_since = time.monotonic()


def _executor_child(header: dict[str, Any], data: bytes) -> None:
    """In the forked child: never returns."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        out = os.open(header["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        os.chdir(header["cwd"])
        os.environ.clear()
        os.environ.update(header["env"])
        path = Path(header["path"])
        sys.argv = [str(SCRIPT), header["role"], str(path)]
        # Imported here, not at the top: the roles import this module to spawn (both are loaded by now).
        from tests.fakes.sky_clusters import serve_request
        from tests.fakes.sky_controller import run_controller

        if header["role"] == "serve-request":
            serve_request(path, data)
        else:
            run_controller(path, data)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a fresh interpreter
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

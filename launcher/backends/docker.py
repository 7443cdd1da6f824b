"""Docker backend: every leg is a NEW container from the pinned image.

No container is reused and no volume holds the instance's disk: the trainer's
writes land in the container's own layer, gone when it is removed. The store is
reached the way a cloud instance would reach it: a `file://` store's directory
is bind-mounted at the same path (standing in for a network filesystem or
bucket), a `hf://` store over the network. Secrets are passed as `-e NAME` with
the value only in the docker CLI's environment, so no argv, log or ledger row
holds it. `kill` = `docker kill` + `docker rm`: a lost instance; a leash
(launcher.backends.leash) removes the container if the launcher itself dies.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping
from urllib.parse import unquote, urlparse

import launcher.backends.leash as leash
from launcher.backends.base import Backend, LegHandle, LegResult, LegSpec, LineSink, pump_lines
from launcher.image import docker, docker_cli


def container_name(spec: LegSpec) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"preflight-{spec.run_id}-leg{spec.leg}")[:120]


def store_path(env: dict[str, str]) -> Path | None:
    """The folder of a file:// store (None for a store reached over the network)."""
    uri = env.get("LAUNCHER_STORE", "")
    return Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else None


def store_mounts(env: dict[str, str]) -> list[str]:
    """A file:// store is mounted at its own path, so LAUNCHER_STORE means the same inside."""
    path = store_path(env)
    return [] if path is None else ["-v", f"{path}:{path}"]


def run_argv(spec: LegSpec, image: str, network: str, program: str | None = None) -> list[str]:
    """The `docker run` argv for a leg (secret names only, never their values); `program`: the
    docker CLI's path (default: found now, bad input where there is none)."""
    argv = [program or docker_cli(), "run", "--name", container_name(spec), "--network", network, "--init"]
    if spec.gpus is not None:
        argv += ["--gpus", "all"]
    for key, value in spec.env.items():
        argv += ["-e", f"{key}={value}"]
    for key in spec.secrets:
        argv += ["-e", key]
    return argv + store_mounts(dict(spec.env)) + [image, *spec.command]


@dataclass
class _DockerHandle(LegHandle):
    proc: subprocess.Popen[str] | None = None
    pump: threading.Thread | None = None
    log: IO[str] | None = None
    leash: subprocess.Popen[bytes] | None = None

    def ledger_fields(self) -> dict[str, Any]:
        return {**super().ledger_fields(), "pid": self.proc.pid if self.proc is not None else None}


class DockerBackend(Backend):
    """Legs as fresh containers of one image on the local engine."""

    name = "docker"
    can_freeze = True
    can_terminate = True

    def __init__(self, image: str, network: str = "host") -> None:
        self.image = image
        self.network = network

    def launch(self, spec: LegSpec, on_line: LineSink | None = None,
               on_instance: Callable[[LegHandle], None] | None = None) -> LegHandle:
        name = container_name(spec)
        docker("rm", "-f", name, check=False)  # a leftover of a crashed launcher must not be reused
        store = store_path(dict(spec.env))
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)  # made here, at launch: a dry run creates nothing
        argv = run_argv(spec, self.image, self.network)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = spec.log_path.open("w", encoding="utf-8")
        env = {**os.environ, **spec.secrets}
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace",
                                start_new_session=True)
        handle = _DockerHandle(spec, name, time.time(), tuple(argv), proc=proc, log=log,
                               leash=leash.start(leash.leg_token(spec.run_id, spec.leg), None, container=name,
                                                 docker=docker_cli()))
        handle.pump = threading.Thread(target=pump_lines, args=(proc.stdout, log, on_line), daemon=True)
        handle.pump.start()
        if on_instance is not None:
            on_instance(handle)
        return handle

    def _finish(self, handle: _DockerHandle, rc: int | None, killed: bool, reason: str) -> LegResult:
        leash.release(handle.leash)
        handle.leash = None
        if handle.pump is not None:
            handle.pump.join(timeout=30)
        if handle.log is not None and not handle.log.closed:
            handle.log.close()
        docker("rm", "-f", handle.instance, check=False)  # the instance and its disk are gone
        left = None
        if killed:  # the container held every process of the leg: gone with it, or still listed
            listed = docker("ps", "-aq", "--filter", f"name=^/{handle.instance}$", check=False)
            left = len((listed.stdout or "").split())
        return LegResult(rc, handle.started_at, time.time(), killed, reason, survivors=left)

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        assert isinstance(handle, _DockerHandle) and handle.proc is not None
        try:
            rc = handle.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._finish(handle, rc, False, "exited")

    def freeze(self, handle: LegHandle) -> None:
        """Pause every process of the container (cgroup freezer): it stops at this instant."""
        docker("pause", handle.instance, check=False)

    def thaw(self, handle: LegHandle) -> None:
        docker("unpause", handle.instance, check=False)

    def terminate(self, handle: LegHandle) -> None:
        """SIGTERM to the container's main process: the trainer's graceful stop."""
        docker("kill", "--signal", "TERM", handle.instance, check=False)

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        assert isinstance(handle, _DockerHandle) and handle.proc is not None
        docker("kill", handle.instance, check=False)
        try:
            handle.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            handle.proc.kill()
            handle.proc.wait()
        # `docker run` returns 137 for a SIGKILLed container; the ledger says -9 like a local kill.
        return self._finish(handle, -9, True, reason)

    @classmethod
    def check_signal(cls, run: Mapping[str, Any], leg: Mapping[str, Any] | None) -> None:
        """Any docker leg can be signalled: its container is named in the ledger."""

    @classmethod
    def signal_leg(cls, leg: Mapping[str, Any], sig: int) -> None:
        """`docker kill --signal TERM|KILL` to the container the ledger row names."""
        name = "TERM" if sig == signal.SIGTERM else "KILL"
        subprocess.run([docker_cli(), "kill", "--signal", name, leg["instance"]], capture_output=True, check=False)

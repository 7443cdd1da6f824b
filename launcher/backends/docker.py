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
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import unquote, urlparse

import launcher.backends.leash as leash
from launcher.backends.base import Backend, CannotDo, LegHandle, LegResult, LegSpec, LineSink
from launcher.backends.nodes import (
    NodeLaunch,
    ProcessHandle,
    close,
    node_env,
    start_cluster,
    start_process,
    task_id,
    wait_cluster,
)
from launcher.config.schema import Config
from launcher.errors import LauncherError
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
class _DockerHandle(ProcessHandle):
    """A leg held by its container, which `instance` names; on a leg of several nodes, `instance`
    names the leg's own network, with a container for each node on it."""

    @property
    def containers(self) -> list[str]:
        return [n.instance for n in self.cluster.nodes] if self.cluster is not None else [self.instance]


class DockerBackend(Backend):
    """Legs as fresh containers of one image on the local engine."""

    name = "docker"
    can_freeze = True
    can_terminate = True
    can_lose_node = True
    can_look = True

    def __init__(self, image: str, network: str = "host", cfg: Config | None = None, nodes: int = 1) -> None:
        self.image = image
        self.network = network
        self.cfg, self.nodes = cfg, nodes
        """A leg of several `nodes`: a container each, running the rung's `run:` script."""

    def launch(
        self, spec: LegSpec, on_line: LineSink | None = None, on_instance: Callable[[LegHandle], None] | None = None
    ) -> LegHandle:
        if self.nodes > 1:
            return self._launch_nodes(spec, on_line, on_instance)
        name = container_name(spec)
        docker("rm", "-f", name, check=False)  # a leftover of a crashed launcher must not be reused
        store = store_path(dict(spec.env))
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)  # made here, at launch: a dry run creates nothing
        argv = run_argv(spec, self.image, self.network)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = spec.log_path.open("w", encoding="utf-8")
        proc = start_process(argv, {**os.environ, **spec.secrets})
        handle = _DockerHandle(
            spec,
            name,
            time.time(),
            tuple(argv),
            proc=proc,
            log=log,
            leashes=[leash.start(leash.leg_token(spec.run_id, spec.leg), None, container=name, docker=docker_cli())],
        )
        handle.follow(on_line)
        if on_instance is not None:
            on_instance(handle)
        return handle

    def _launch_nodes(
        self, spec: LegSpec, on_line: LineSink | None, on_instance: Callable[[LegHandle], None] | None
    ) -> LegHandle:
        """A container per node, on a bridge network made for the leg (each at an address known
        before any starts: SKYPILOT_NODE_IPS), each running the rung's `run:` script with
        SkyPilot's node variables (launcher.backends.nodes)."""
        assert self.cfg is not None, "a leg of several nodes needs the config (make_backend gives it)"
        names = [f"{container_name(spec)}-node{rank}"[:120] for rank in range(self.nodes)]
        for name in names:
            docker("rm", "-f", name, check=False)  # a leftover of a crashed launcher must not be reused
        store = store_path(dict(spec.env))
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)
        network, ips = make_network(container_name(spec), self.nodes)
        program = docker_cli()

        def launches(script: str, envs: dict[str, str]) -> list[NodeLaunch]:
            made = []
            for rank, (name, ip) in enumerate(zip(names, ips)):
                argv = [program, "run", "--name", name, "--network", network, "--ip", ip, "--init"]
                argv += ["--gpus", "all"] if spec.gpus is not None else []
                for key, value in {
                    **envs,
                    **node_env(rank, ips, spec.gpus.count if spec.gpus else 0, task_id(spec)),
                }.items():
                    argv += ["-e", f"{key}={value}"]
                for key in spec.secrets:
                    argv += ["-e", key]  # the value only in the docker CLI's environment
                argv += store_mounts(dict(spec.env)) + [self.image, "bash", "-c", script]
                made.append(NodeLaunch(argv, {**os.environ, **spec.secrets}, None, name))
            return made

        try:
            cluster = start_cluster(self.cfg, spec, on_line, launches)
        except BaseException:
            remove_network(network, names)
            raise
        handle = _DockerHandle(spec, network, time.time(), cluster.head.argv, proc=cluster.head.proc, cluster=cluster)
        handle.leashes = [
            leash.start(leash.leg_token(spec.run_id, spec.leg), None, container=name, docker=program) for name in names
        ]
        if on_instance is not None:
            on_instance(handle)
        return handle

    def _finish(
        self, handle: _DockerHandle, rc: int | None, killed: bool, reason: str, count: bool = False
    ) -> LegResult:
        handle.let_go()
        docker("rm", "-f", *handle.containers, check=False)  # the instances and their disks are gone
        if handle.cluster is not None:
            remove_network(handle.instance, [])
        left = None
        if killed or count:  # the containers held every process of the leg: gone with them, or still listed
            left = sum(
                len((docker("ps", "-aq", "--filter", f"name=^/{name}$", check=False).stdout or "").split())
                for name in handle.containers
            )
        return LegResult(
            rc,
            handle.started_at,
            time.time(),
            killed,
            reason,
            survivors=left,
            nodes=handle.cluster.records() if handle.cluster is not None else None,
        )

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        assert isinstance(handle, _DockerHandle) and handle.proc is not None
        if handle.cluster is not None:
            ended = wait_cluster(
                handle.cluster,
                timeout,
                lambda: handle.stopping,
                lambda: docker("kill", *handle.containers, check=False),
            )
            return None if ended is None else self._finish(handle, ended[0], False, ended[1], count=True)
        try:
            rc = handle.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._finish(handle, rc, False, "exited")

    def pids(self, handle: LegHandle) -> list[int]:
        """The container(s)' processes as this host numbers them (`docker top`): the engine runs
        here, so /proc and py-spy reach them as they reach a local leg's."""
        assert isinstance(handle, _DockerHandle)
        return container_pids(handle.containers)

    def freeze(self, handle: LegHandle) -> None:
        """Pause every process of the container(s) (cgroup freezer): it stops at this instant."""
        assert isinstance(handle, _DockerHandle)
        docker("pause", *handle.containers, check=False)

    def thaw(self, handle: LegHandle) -> None:
        assert isinstance(handle, _DockerHandle)
        docker("unpause", *handle.containers, check=False)

    def lose_node(self, handle: LegHandle, node: int) -> None:
        """`docker kill` of node `node`'s container alone: a machine of the cluster lost."""
        assert isinstance(handle, _DockerHandle)
        if handle.cluster is None:
            raise CannotDo("a leg of one node has no node to lose alone")
        docker("kill", handle.cluster.nodes[node].instance, check=False)

    def terminate(self, handle: LegHandle) -> None:
        """SIGTERM to each container's main process: the trainer's graceful stop."""
        assert isinstance(handle, _DockerHandle)
        handle.stopping = True
        docker("kill", "--signal", "TERM", *handle.containers, check=False)

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        assert isinstance(handle, _DockerHandle) and handle.proc is not None
        docker("kill", *handle.containers, check=False)
        procs = [n.proc for n in handle.cluster.nodes if n.proc is not None] if handle.cluster else [handle.proc]
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if handle.cluster is not None:
            close(handle.cluster, lambda node: node.proc.wait() if node.proc is not None else None)
        # `docker run` returns 137 for a SIGKILLed container; the ledger says -9 like a local kill.
        return self._finish(handle, -9, True, reason)

    @classmethod
    def check_signal(cls, run: Mapping[str, Any], leg: Mapping[str, Any] | None) -> None:
        """Any docker leg can be signalled: its container is named in the ledger."""

    @classmethod
    def signal_leg(cls, leg: Mapping[str, Any], sig: int) -> None:
        """`docker kill --signal TERM|KILL` to the container the ledger row names (each node's,
        for a leg of several)."""
        name = "TERM" if sig == signal.SIGTERM else "KILL"
        containers = [n["instance"] for n in leg.get("nodes") or []] or [leg["instance"]]
        subprocess.run([docker_cli(), "kill", "--signal", name, *containers], capture_output=True, check=False)


NETWORK_TRIES = 8


def make_network(name: str, nodes: int) -> tuple[str, list[str]]:
    """A bridge network of the leg's own and an address for each node in it, head first: a
    /24 picked at random in 10.200.0.0/13 (another one on a clash with a network that exists)."""
    rng = random.Random()
    last = ""
    for _ in range(NETWORK_TRIES):
        base = f"10.{rng.randrange(200, 208)}.{rng.randrange(0, 256)}"
        docker("network", "rm", name, check=False)
        made = docker("network", "create", "--driver", "bridge", "--subnet", f"{base}.0/24", name, check=False)
        if made.returncode == 0:
            return name, [f"{base}.{10 + rank}" for rank in range(nodes)]
        last = (made.stderr or made.stdout or "").strip()
    raise LauncherError(f"docker could not make a network for the leg's {nodes} nodes: {last}")


def remove_network(network: str, containers: list[str]) -> None:
    if containers:
        docker("rm", "-f", *containers, check=False)
    docker("network", "rm", network, check=False)


def container_pids(containers: list[str]) -> list[int]:
    """The host's pids of every process of these containers (`docker top`; none for one gone)."""
    found: list[int] = []
    for container in containers:
        listed = docker("top", container, "-eo", "pid", check=False)
        if listed.returncode == 0:
            found += [int(word) for word in listed.stdout.split() if word.isdigit()]
    return found

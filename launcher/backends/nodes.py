"""Legs held by processes this launcher starts on this host (the local and docker backends):
the process, the handle both backends keep of it, and a leg of several nodes on one host, each
node running the `run:` script SkyPilot would run.

SkyPilot runs a task's `run:` script once on every node of the cluster, with the
node's own environment: `SKYPILOT_NODE_RANK`, `SKYPILOT_NODE_IPS` (every node's
address, one a line, the head first), `SKYPILOT_NUM_NODES`,
`SKYPILOT_NUM_GPUS_PER_NODE` and `SKYPILOT_TASK_ID`, beside the task's `envs:`.
Here each node is a fresh empty folder on this host (the local backend; its
address the loopback one), running the very script the sky backend renders for
the rung (launcher.backends.sky.task.leg_script: the same bytes, whose sha256 the
ledger records) under `bash`, with that environment. The script starts torchrun
across the nodes (a static rendezvous at the head's address); on a CPU leg the
ranks talk gloo. The nodes share this host's ports, so the leg's rendezvous port
is a free one (PREFLIGHT_MASTER_PORT, which the templates read) rather than 29500.

The leg is the cluster: it ends when every node has ended, and a node that ends
with a failure ends it (the others are torn down, as SkyPilot's job ends when a
node's `run` fails). Each node's lines go to the leg's log prefixed `(node R) `,
and to a log of the node's own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import launcher.backends.leash as leash
from launcher.backends.base import LegHandle, LegSpec, LineSink, pump_lines
from launcher.backends.sky.task import HARD_CAP_GRACE_S, leg_script, script_sha256, task_envs
from launcher.config.schema import Config

LOOPBACK = "127.0.0.1"
NODE_VARS = (
    "SKYPILOT_NODE_RANK",
    "SKYPILOT_NODE_IPS",
    "SKYPILOT_NUM_NODES",
    "SKYPILOT_NUM_GPUS_PER_NODE",
    "SKYPILOT_TASK_ID",
)
"""What SkyPilot sets on every node beside the task's envs (its docs: environment variables)."""


def node_env(rank: int, ips: list[str], gpus_per_node: int, task_id: str) -> dict[str, str]:
    """SkyPilot's variables for node `rank` of a cluster whose nodes have addresses `ips` (head first)."""
    return {
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(ips),
        "SKYPILOT_NUM_NODES": str(len(ips)),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus_per_node),
        "SKYPILOT_TASK_ID": task_id,
    }


def task_id(spec: LegSpec) -> str:
    return f"preflight-{spec.run_id}-leg{spec.leg}"


def free_port() -> int:
    """A TCP port nothing on this host listens on now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def start_process(argv: list[str], env: Mapping[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """A leg's process, or one node's: in a session of its own, its stdout and stderr one stream
    of text lines (bytes that are not UTF-8 replaced)."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
        start_new_session=True,
    )


@dataclass(frozen=True)
class NodeLaunch:
    """How one node is started: the argv (`bash -c SCRIPT` here; `docker run ... bash -c SCRIPT`
    on the docker backend), its environment, its working folder, and what holds it."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    instance: str


@dataclass
class Node:
    """One node of a leg: its rank, what holds it (a folder, a container), its process, its log."""

    rank: int
    instance: str
    log_path: Path
    argv: tuple[str, ...] = ()
    proc: subprocess.Popen[str] | None = None
    pump: threading.Thread | None = None
    log: IO[str] | None = None
    exit_code: int | None = None

    def record(self) -> dict[str, Any]:
        """The node as the ledger's leg row lists it."""
        return {
            "node": self.rank,
            "instance": self.instance,
            "pid": self.proc.pid if self.proc else None,
            "exit_code": self.exit_code,
            "log": str(self.log_path),
        }


@dataclass
class Cluster:
    """The nodes of one leg, and the lock their lines reach the leg's log under."""

    nodes: list[Node]
    script: str
    log: IO[str]
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def records(self) -> list[dict[str, Any]]:
        return [n.record() for n in self.nodes]


@dataclass
class ProcessHandle(LegHandle):
    """A leg held by processes this launcher started (local: the trainer's; docker: `docker run`'s):
    the leg's process, the thread pumping its lines to its log, the leashes that end the leg if the
    launcher dies (launcher.backends.leash), and its nodes when it has several."""

    proc: subprocess.Popen[str] | None = None
    """The leg's process; on a leg of several nodes, the head node's."""
    pump: threading.Thread | None = None
    log: IO[str] | None = None
    leashes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cluster: Cluster | None = None
    """The nodes of a leg of several (start_cluster); None for one."""
    stopping: bool = False
    """SIGTERM was sent: every node is waited for, a failing one does not tear the others down."""

    def ledger_fields(self) -> dict[str, Any]:
        fields = {**super().ledger_fields(), "pid": self.proc.pid if self.proc is not None else None}
        if self.cluster is not None:
            fields.update(run_sha256=script_sha256(self.cluster.script), nodes=self.cluster.records())
        return fields

    def follow(self, on_line: LineSink | None) -> None:
        """The leg's lines to its log (and to `on_line`), from a thread of their own."""
        assert self.proc is not None and self.log is not None
        self.pump = threading.Thread(target=pump_lines, args=(self.proc.stdout, self.log, on_line), daemon=True)
        self.pump.start()

    def let_go(self) -> None:
        """The leg is over: every leash released (it kills whatever the leg left running, and
        exits), the leg's lines drained into its log, the log closed."""
        for held in self.leashes:
            leash.release(held)
        self.leashes = []
        if self.pump is not None:
            self.pump.join(timeout=30)
        if self.log is not None and not self.log.closed:
            self.log.close()


def start_cluster(
    cfg: Config, spec: LegSpec, on_line: LineSink | None, launches: Callable[[str, dict[str, str]], list[NodeLaunch]]
) -> Cluster:
    """A leg of several nodes started: the rung's `run:` script and the task's envs rendered as the
    sky backend renders them (launcher.backends.sky.task; the hard cap a grace past the leg's
    deadline), each node's launch made of them by the backend (`launches(script, envs)`), and
    every node started, head first (start_nodes)."""
    script = leg_script(cfg, spec.rung)
    deadline = float(spec.env.get("LAUNCHER_DEADLINE", "0") or 0)
    envs = task_envs(cfg, spec.rung, spec.env, deadline + HARD_CAP_GRACE_S if deadline else None)
    return start_nodes(spec, script, launches(script, envs), on_line)


def start_nodes(spec: LegSpec, script: str, launches: list[NodeLaunch], on_line: LineSink | None) -> Cluster:
    """Start every node (head first), each in a session of its own; its lines to the leg's log
    (prefixed) and to the node's own."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster([], script, spec.log_path.open("w", encoding="utf-8"))
    for rank, launch in enumerate(launches):
        log_path = spec.log_path.with_name(f"{spec.log_path.stem}.node-{rank}.log")
        node = Node(rank, launch.instance, log_path, tuple(launch.argv))
        node.log = node.log_path.open("w", encoding="utf-8")
        node.proc = start_process(launch.argv, launch.env, launch.cwd)
        node.pump = threading.Thread(target=_pump, args=(cluster, node, on_line), daemon=True)
        node.pump.start()
        cluster.nodes.append(node)
    return cluster


def local_launches(
    script: str,
    envs: Mapping[str, str],
    base_env: Mapping[str, str],
    workdirs: list[Path],
    gpus_per_node: int,
    spec: LegSpec,
) -> list[NodeLaunch]:
    """The local backend's nodes: `bash -c SCRIPT` in each fresh folder, on loopback. `envs`: the
    task's envs (leg environment and secrets included); `base_env`: the process environment
    beneath them (PATH, the leg's token)."""
    ips = [LOOPBACK] * len(workdirs)
    return [
        NodeLaunch(
            ["bash", "-c", script],
            {
                **base_env,
                **envs,
                **node_env(rank, ips, gpus_per_node, task_id(spec)),
                "LAUNCHER_APP_DIR": str(workdir),
                leash.NODE_TOKEN_ENV: node_token(leash.leg_token(spec.run_id, spec.leg), rank),
            },
            workdir,
            str(workdir),
        )
        for rank, workdir in enumerate(workdirs)
    ]


def node_token(leg: str, rank: int) -> str:
    """The token every process of node `rank` of a local leg carries, beside the leg's."""
    return f"{leg}:node{rank}"


def _pump(cluster: Cluster, node: Node, on_line: LineSink | None) -> None:
    """Node `node`'s output, line by line, to its own log and to the leg's (prefixed, whole lines)."""
    assert node.proc is not None and node.proc.stdout is not None and node.log is not None
    prefix = f"(node {node.rank}) "
    for line in node.proc.stdout:
        node.log.write(line)
        node.log.flush()
        shown = prefix + line
        with cluster.lock:
            cluster.log.write(shown)
            cluster.log.flush()
        if on_line is not None:
            on_line(shown)


def poll(cluster: Cluster) -> tuple[bool, Node | None]:
    """(every node ended, the first node that ended with a failure, if any)."""
    failed = None
    for node in cluster.nodes:
        if node.proc is not None and node.exit_code is None:
            node.exit_code = node.proc.poll()
        if node.exit_code not in (None, 0) and failed is None:
            failed = node
    return all(n.exit_code is not None for n in cluster.nodes), failed


def leg_exit(cluster: Cluster) -> tuple[int | None, str]:
    """The leg's exit code and how it ended, from its nodes': the first failure's, else 0."""
    failed = next((n for n in cluster.nodes if n.exit_code not in (None, 0)), None)
    if failed is None:
        return 0, "exited"
    return failed.exit_code, f"node {failed.rank} exited {failed.exit_code}"


def wait_cluster(
    cluster: Cluster, timeout: float | None, stopping: Callable[[], bool], teardown: Callable[[], None]
) -> tuple[int | None, str] | None:
    """Wait until every node has ended, or (while no stop was asked) one has failed, then tear
    the rest down; (the leg's exit code, how it ended), or None if `timeout` passed first."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        done, failed = poll(cluster)
        if done or (failed is not None and not stopping()):
            break
        if end is not None and time.monotonic() >= end:
            return None
        time.sleep(0.05)
    if not done:
        assert failed is not None
        teardown()  # a node failed: the cluster's job ends, as SkyPilot ends it
        close(cluster, lambda node: node.proc.wait() if node.proc is not None else None)
        return failed.exit_code, f"node {failed.rank} exited {failed.exit_code}; the other nodes were torn down"
    close(cluster, lambda node: node.proc.wait() if node.proc is not None else None)
    return leg_exit(cluster)


def close(cluster: Cluster, reap: Callable[[Node], int | None]) -> None:
    """Every node's process reaped (`reap` waits for one), its pump drained, the logs closed."""
    for node in cluster.nodes:
        if node.proc is not None and node.exit_code is None:
            node.exit_code = reap(node)
    for node in cluster.nodes:
        if node.pump is not None:
            node.pump.join(timeout=30)
        if node.log is not None and not node.log.closed:
            node.log.close()
    if not cluster.log.closed:
        cluster.log.close()


def path_with(bin_dir: Path) -> str:
    """PATH with the trainer's interpreter's folder first: the script's `torchrun` is the one beside it."""
    return os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])

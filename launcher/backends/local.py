"""Local backend (the embedded default): a leg is a subprocess in a fresh temp dir.

The temp dir is the instance's disk: created empty for each leg, holding only
the staged reviewed files, deleted when the leg ends or is killed. The leg runs
in a session of its own and every process it starts carries its token, so
`kill` takes every one of them (torchrun's workers, which sit in sessions of
their own, included) as a lost instance would; a leash process does the same
if the launcher itself dies (launcher.backends.leash).

The "image" here is the launcher's own environment: a command starting with
`python`/`python3` runs under the launcher's interpreter. A bare `torchrun` (or `accelerate`) is
the one on PATH, as a shell would run it (a trainer's venv, activated), else the one beside the
launcher's interpreter; rung 0 runs in the interpreter that script's `#!` line names, so a leg
sees the same packages as the host checks did.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import launcher.backends.leash as leash
from launcher.backends.base import Backend, CannotDo, LegHandle, LegResult, LegSpec, LineSink
from launcher.backends.leash import LEGS_ROOT, NODE_TOKEN_ENV, TOKEN_ENV, kill_leg, leg_pids, leg_token
from launcher.backends.nodes import (
    NodeLaunch,
    ProcessHandle,
    close,
    free_port,
    local_launches,
    node_token,
    path_with,
    start_cluster,
    start_process,
    wait_cluster,
)
from launcher.config.schema import Config
from launcher.errors import BadInput
from launcher.manifest import stage_files

PYTHON_NAMES = ("python", "python3")
LAUNCH_SCRIPTS = ("torchrun", "accelerate")
"""Console scripts that start the trainer in their own interpreter (the one their `#!` names)."""


def resolve_command(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The argv the local backend executes: `python` bound to this environment; a bare
    `torchrun`/`accelerate` to the one on PATH (the trainer's venv where it is activated: the
    launcher's venv lacked the trainer's modules, "No module named 'datasets'"), else to the
    one beside this interpreter."""
    argv = list(argv)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    elif argv and argv[0] in LAUNCH_SCRIPTS:
        beside = Path(sys.executable).parent / argv[0]
        found = shutil.which(argv[0]) or (str(beside) if beside.exists() else None)
        if found:
            argv[0] = found
    return argv


def trainer_python(command: tuple[str, ...] | list[str]) -> str:
    """The interpreter the trainer runs in on this host: its command's own python (a venv of
    the trainer's), the one `torchrun` or `accelerate` belongs to (each starts the script with
    its own interpreter), else this one. Rung 0 and the launcher's reads of a checkpoint's
    state run there: the launcher itself has no torch."""
    argv = resolve_command(command)
    if argv and Path(argv[0]).name.startswith("python"):
        return argv[0]
    if argv and Path(argv[0]).name in LAUNCH_SCRIPTS:
        return script_python(argv[0]) or sys.executable
    return sys.executable


def script_python(program: str) -> str | None:
    """The interpreter a console script (pip's `accelerate` or `torchrun`, found on PATH when bare) runs in:
    its `#!` line's python, else the `python` beside it; None when neither exists."""
    path = program if os.sep in program else shutil.which(program)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace")
    except OSError:
        return None
    named = first[2:].strip().split(" ")[0] if first.startswith("#!") else ""
    if Path(named).name.startswith("python") and Path(named).is_file():
        return named
    beside = Path(path).parent / "python"
    return str(beside) if beside.is_file() else None


TORCH_EXTRA = "pip install 'preflight-launcher[torch]'"


def no_torch_hint(said: str, python: str | None) -> str:
    """What to do when a trainer run by `python` failed for want of torch, where `python` is this
    interpreter (a local leg or rung 0 of a command whose `python` runs in it here: the CLI installs
    without torch, pyproject.toml's [torch] extra); empty otherwise (a leg in an image, or a
    trainer's venv of its own, is not helped by this install)."""
    if python != sys.executable or "No module named 'torch'" not in said:
        return ""
    if importlib.util.find_spec("torch") is not None:
        return ""
    return f"the launcher's interpreter has no torch, and `python` in trainer.command runs in it here: {TORCH_EXTRA}"


def leg_process_env(spec: LegSpec) -> dict[str, str]:
    """The host environment minus any stale LAUNCHER_* or secret, plus the leg's, plus the
    token that marks every process of this leg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_") and k not in spec.secrets}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec.env)
    env.update(spec.secrets)
    env[TOKEN_ENV] = leg_token(spec.run_id, spec.leg)
    return env


def _stage(spec: LegSpec, workdir: Path) -> None:
    """The leg's reviewed files onto its fresh disk, each checked against its hash on the way."""
    stage_files(
        {rel: f.source for rel, f in spec.files.items()}, {rel: f.sha256 for rel, f in spec.files.items()}, workdir
    )


@dataclass
class _LocalHandle(ProcessHandle):
    workdir: Path | None = None
    """The leg's fresh folder (a leg of several nodes: the folder holding each node's)."""
    early_exit: int | None = None
    """The code of a leg whose program could not be started (127)."""

    @property
    def token(self) -> str:
        return leg_token(self.spec.run_id, self.spec.leg)


class LocalBackend(Backend):
    """Legs as subprocesses in fresh temp dirs on this machine."""

    name = "local"
    can_freeze = True
    can_terminate = True
    can_lose_node = True
    can_look = True

    def __init__(
        self, root: Path | None = None, keep_dirs: bool | None = None, cfg: Config | None = None, nodes: int = 1
    ) -> None:
        self.root = root or Path(tempfile.gettempdir()) / LEGS_ROOT
        self.keep_dirs = bool(os.environ.get("LAUNCHER_KEEP_LEG_DIRS")) if keep_dirs is None else keep_dirs
        self.cfg, self.nodes = cfg, nodes
        """A leg of several `nodes` runs the rung's `run:` script on each (needs the config's templates)."""

    def launch(
        self, spec: LegSpec, on_line: LineSink | None = None, on_instance: Callable[[LegHandle], None] | None = None
    ) -> LegHandle:
        if self.nodes > 1:
            return self._launch_nodes(spec, on_line, on_instance)
        self.root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"{spec.run_id}-leg{spec.leg}-", dir=self.root))
        try:
            _stage(spec, workdir)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = spec.log_path.open("w", encoding="utf-8")
        argv = resolve_command(spec.command)
        handle = _LocalHandle(spec, str(workdir), time.time(), tuple(argv), workdir=workdir, log=log)
        try:
            handle.proc = start_process(argv, leg_process_env(spec), workdir)
        except OSError as err:  # e.g. the program does not exist: the leg ran and failed
            line = f"launcher: cannot start {spec.command[0]!r}: {err.strerror or err}\n"
            log.write(line)
            log.flush()
            if on_line:
                on_line(line)
            handle.early_exit = 127
            if on_instance is not None:
                on_instance(handle)
            return handle
        handle.leashes = [self._leash(handle)]
        handle.follow(on_line)
        if on_instance is not None:
            on_instance(handle)  # a local leg costs nothing before it starts: recorded once it has a pid
        return handle

    def _launch_nodes(
        self, spec: LegSpec, on_line: LineSink | None, on_instance: Callable[[LegHandle], None] | None
    ) -> LegHandle:
        """Each of `nodes` fresh folders (under one leg folder: the leash's) runs the rung's
        `run:` script, as SkyPilot's nodes would (launcher.backends.nodes)."""
        cfg = self.cfg
        assert cfg is not None, "a leg of several nodes needs the config (make_backend gives it)"
        self.root.mkdir(parents=True, exist_ok=True)
        legdir = Path(tempfile.mkdtemp(prefix=f"{spec.run_id}-leg{spec.leg}-", dir=self.root))
        dirs = [legdir / f"node-{rank}" for rank in range(self.nodes)]

        def launches(script: str, envs: dict[str, str]) -> list[NodeLaunch]:
            envs = {**envs, **spec.secrets, "PREFLIGHT_MASTER_PORT": str(free_port())}
            base = {**leg_process_env(spec), "PATH": path_with(Path(trainer_python(cfg.trainer.command)).parent)}
            return local_launches(script, envs, base, dirs, spec.gpus.count if spec.gpus else 0, spec)

        try:
            for workdir in dirs:
                workdir.mkdir()
                _stage(spec, workdir)
            cluster = start_cluster(cfg, spec, on_line, launches)
        except BaseException:
            shutil.rmtree(legdir, ignore_errors=True)
            raise
        handle = _LocalHandle(
            spec, str(legdir), time.time(), cluster.head.argv, workdir=legdir, proc=cluster.head.proc, cluster=cluster
        )
        handle.leashes = [self._leash(handle)]
        if on_instance is not None:
            on_instance(handle)
        return handle

    def _wait_nodes(self, handle: _LocalHandle, timeout: float | None) -> LegResult | None:
        """Every node ended (the leg's code: the first failure's, else 0); or, while no stop was
        asked, a node that failed ends the leg and the others are torn down."""
        assert handle.cluster is not None and handle.proc is not None
        pid = handle.proc.pid
        ended = wait_cluster(handle.cluster, timeout, lambda: handle.stopping, lambda: kill_leg(handle.token, pid))
        if ended is None:
            return None
        return self._finish(handle, ended[0], False, ended[1], (None, len(leg_pids(handle.token))))

    def _leash(self, handle: _LocalHandle) -> subprocess.Popen[bytes]:
        """The watcher that kills the leg if this launcher dies (see launcher.backends.leash)."""
        assert handle.proc is not None
        return leash.start(handle.token, handle.proc.pid, handle.workdir, self.keep_dirs)

    def _finish(
        self,
        handle: _LocalHandle,
        rc: int | None,
        killed: bool,
        reason: str,
        counted: tuple[int | None, int | None] = (None, None),
    ) -> LegResult:
        handle.let_go()  # the leg is over: the leash kills whatever it left running, and exits
        if handle.workdir is not None and (killed or not self.keep_dirs):
            shutil.rmtree(handle.workdir, ignore_errors=True)
        return LegResult(
            rc,
            handle.started_at,
            time.time(),
            killed,
            reason,
            killed_processes=counted[0],
            survivors=counted[1],
            nodes=handle.cluster.records() if handle.cluster else None,
        )

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        assert isinstance(handle, _LocalHandle)
        if handle.cluster is not None:
            return self._wait_nodes(handle, timeout)
        if handle.proc is None:
            return self._finish(handle, handle.early_exit, False, "failed to start")
        try:
            rc = handle.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._finish(handle, rc, False, "exited")

    def pids(self, handle: LegHandle) -> list[int]:
        assert isinstance(handle, _LocalHandle)
        return leg_pids(handle.token, handle.proc.pid if handle.proc is not None else None)

    def freeze(self, handle: LegHandle) -> None:
        """SIGSTOP every process of the leg: it stops at this instant (a drill kills it next)."""
        assert isinstance(handle, _LocalHandle)
        if handle.proc is not None:
            leash.signal_leg(handle.token, handle.proc.pid, signal.SIGSTOP, group_first=True)

    def thaw(self, handle: LegHandle) -> None:
        """SIGCONT every process of a frozen leg: it goes on from where it stood."""
        assert isinstance(handle, _LocalHandle)
        if handle.proc is not None:
            leash.signal_leg(handle.token, handle.proc.pid, signal.SIGCONT, group_first=True)

    def lose_node(self, handle: LegHandle, node: int) -> None:
        """Every process of node `node` dies (found by the node's token), its folder with them."""
        assert isinstance(handle, _LocalHandle)
        if handle.cluster is None:
            raise CannotDo("a leg of one node has no node to lose alone")
        kill_leg(node_token(handle.token, node), None, var=NODE_TOKEN_ENV)
        shutil.rmtree(handle.cluster.nodes[node].instance, ignore_errors=True)

    def terminate(self, handle: LegHandle) -> None:
        """SIGTERM to every process of the leg at once, as a machine shutting down sends it: the
        trainer's graceful stop. Not to the process group alone: torchrun starts each worker in
        a session of its own and forwards the signal only after its own shutdown path (0.2 s
        measured on this machine), and a fast CPU leg ran six more steps, to its step limit,
        before its ranks heard of it."""
        assert isinstance(handle, _LocalHandle)
        handle.stopping = True
        if handle.proc is not None:
            leash.signal_leg(handle.token, handle.proc.pid, signal.SIGTERM, group_first=True)

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        """Every process of the leg dies (torchrun's workers too), then its disk goes."""
        assert isinstance(handle, _LocalHandle)
        rc, counted = handle.early_exit, (0, 0)
        if handle.proc is not None:
            n = kill_leg(handle.token, handle.proc.pid)  # every node's processes carry the leg's token
            rc = handle.proc.wait()
            if handle.cluster is not None:
                close(handle.cluster, lambda node: node.proc.wait() if node.proc is not None else None)
            counted = (n, len(leg_pids(handle.token)))  # what a lost instance leaves: nothing
        return self._finish(handle, rc, True, reason, counted)

    @classmethod
    def check_signal(cls, run: Mapping[str, Any], leg: Mapping[str, Any] | None) -> None:
        """A local leg is signalled by the pid its ledger row holds."""
        if leg is not None and not leg.get("pid"):
            raise BadInput(
                f"leg {leg['leg']} of {leg['run_id']} has no pid in the ledger (recorded by an older launcher)"
            )

    @classmethod
    def signal_leg(cls, leg: Mapping[str, Any], sig: int) -> None:
        """SIGTERM to every process of the leg (torchrun's workers too, as `terminate` does);
        SIGKILL likewise, frozen first so none forks another meanwhile."""
        token = leg_token(leg["run_id"], leg["leg"])
        if sig == signal.SIGKILL:
            kill_leg(token, int(leg["pid"]))
            return
        leash.signal_leg(token, int(leg["pid"]), sig)

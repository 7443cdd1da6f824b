"""What the sky stand-in's parts share (see sky_standin.py): SkyPilot's job exit codes and the
stand-in's constants, files and processes (atomic JSON, /proc bookkeeping, sessions and a node's
processes killed whole, flocks), the layout of `state_dir` on disk, a node's job as a fresh cloud machine runs it (setup,
then run, in a session of its own, with the machine's environment), and where SkyPilot's own
optimizer places a launch. Linux only (/proc).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

# SkyPilot's JobExitCode values (sky.exceptions.JobExitCode), what tail_logs returns.
JOB_SUCCEEDED, JOB_FAILED, JOB_NOT_FINISHED, JOB_NOT_FOUND, JOB_CANCELLED = 0, 100, 101, 102, 103
JOB_ID = 1  # one job per cluster: the task's
# Where the stand-in says its clusters are (the launcher pins later legs to leg 0's placement).
PLACEMENT = {"cloud": "GCP", "region": "us-central1", "zone": None, "instance_type": "standin-n1"}
# What a fresh cloud machine's job inherits from "the machine": nothing else of the caller's.
# OMP_NUM_THREADS: the image's thread setting, here the test session's one thread per process
# (tests/conftest.py), as every local leg has it; with OpenMP's default two threads a leg on a
# loaded 2-core host spin-waits: a rehearsal beside two CPU hogs took 30 s of CPU, not 8.5.
MACHINE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR", "OMP_NUM_THREADS")
CAPACITY_RETRY_S = 5.0
POLL_S = 0.05


# ---------------------------------------------------------------- files and processes


def _write_json(path: Path, data: Any) -> None:
    """Atomically (readers in other processes never see half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:  # one short O_APPEND write: whole lines across processes
        f.write(json.dumps(record, default=str) + "\n")


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> str | None:
    """The process's start time (its identity against pid reuse); None if gone or a zombie."""
    stat = _proc_stat(pid)
    return stat[19] if stat and stat[0] != "Z" else None


def _alive(pid: int, start: str | None) -> bool:
    return start is not None and _start_time(pid) == start


def _kill_session(sid: int, start: str | None) -> None:
    """SIGKILL every live process of session `sid` (the job's bash and all it started).

    A process that called setpgid (GNU timeout does) is still in the session. The
    kernel never reuses a pid that still names a session, so a leader pid with
    another start time means the session is empty already."""
    leader = _start_time(sid)
    if leader is not None and leader != start:
        return
    for _ in range(100):
        members = []
        for entry in os.listdir("/proc"):
            stat = _proc_stat(int(entry)) if entry.isdigit() else None
            if stat and stat[3] == str(sid) and stat[0] != "Z":
                members.append(int(entry))
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)


NODE_ENV = "PREFLIGHT_STANDIN_NODE"
"""Set in the environment of every process a node's job starts (`_spawn_job`): the node's directory.
A deleted machine takes every process on it, whatever session or process group a process made for
itself (torchrun starts each rank in a session of its own: killing the job's session alone left the
ranks training after a down, which then failed on the files they kept writing)."""
NODE_KILL_S = 30.0
"""How long a node's processes may outlive SIGKILL before the stand-in says so (an error, never a leak)."""


def _node_tag(ndir: Path | str) -> str:
    return os.path.realpath(ndir)


def _node_pids(ndir: Path | str, sid: int | None) -> list[int]:
    """Every live process of a node: its job's session (`sid`), and every process whose environment
    names the node (those that left the session, and their children). The launcher's own scan of a
    leg's processes (launcher.backends.leash.leg_pids) with the node's variable: the same rule."""
    from launcher.backends.leash import leg_pids

    return leg_pids(_node_tag(ndir), sid, var=NODE_ENV)


def _kill_node(ndir: Path | str, sid: int | None, start: str | None) -> None:
    """The node's machine is gone: SIGKILL every process of it (`_node_pids`), scanning again until
    none is left (a process may fork between a scan and its kill). RuntimeError if one outlives
    NODE_KILL_S. A session leader pid with another start time means the session is gone already (the
    kernel never reuses a pid that still names a session)."""
    leader = _start_time(sid) if sid else None
    if leader is not None and leader != start:
        sid = None
    deadline = time.monotonic() + NODE_KILL_S
    while pids := _node_pids(ndir, sid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"stand-in: processes {pids} of node {ndir} outlived SIGKILL for {NODE_KILL_S:.0f} s")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)


def _term_node(ndir: Path | str, sid: int) -> int:
    """SIGTERM every live process of the node at once (the run's whole tree, as SkyPilot's graceful
    cancel signals it, not the group leader alone); how many were signalled."""
    members = _node_pids(ndir, sid)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    return len(members)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock, released by the kernel if its holder is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _safe_name(name: Any) -> bool:
    """A name usable as a directory name here (SkyPilot's own names always are)."""
    return isinstance(name, str) and bool(name) and "/" not in name and not name.startswith(".")


# ---------------------------------------------------------------- the on-disk state


class _State:
    """The layout of `state_dir`, shared by clients and workers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clusters = root / "clusters"
        self.requests = root / "requests"
        self.locks = root / "locks"
        self.history = root / "history.jsonl"
        self.calls = root / "calls.jsonl"
        for d in (self.clusters, self.requests, self.locks):
            d.mkdir(parents=True, exist_ok=True)

    def cluster(self, name: str) -> Path | None:
        """The cluster's directory if it exists."""
        path = self.clusters / name
        return path if _safe_name(name) and path.is_dir() else None

    def cluster_lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        return _locked(self.locks / f"{name}.lock")

    def cluster_names(self) -> list[str]:
        return sorted(p.name for p in self.clusters.iterdir() if p.is_dir() and _safe_name(p.name))


def _node_dir(cdir: Path, rank: int) -> Path:
    """Where node `rank` of a cluster keeps its disk and its job's files (the head: the cluster dir)."""
    return cdir if rank == 0 else cdir / "nodes" / str(rank)


def _job_status(cdir: Path) -> tuple[bool, int]:
    """(ended, JobExitCode) of a cluster's job, from every node's files and processes: running
    while any node runs; FAILED if any node's setup or run failed or died without a word."""
    if (cdir / "job.cancelled").exists():
        return True, JOB_CANCELLED
    job = _read_json(cdir / "job.json")
    if job is None:
        return False, JOB_NOT_FINISHED
    failed = False
    for rank, node in enumerate(job.get("nodes") or [job]):
        done = _read_json(_node_dir(cdir, rank) / "job.exit")
        if done is None and _alive(node["pgid"], node["start"]):
            return False, JOB_NOT_FINISHED
        done = done or _read_json(_node_dir(cdir, rank) / "job.exit")  # it may have just finished
        failed = failed or done is None or done["setup_failed"] or done["exit"] != 0  # None: FAILED_DRIVER
    return True, JOB_FAILED if failed else JOB_SUCCEEDED


# ---------------------------------------------------------------- a node's job, as a fresh cloud machine runs it


def _redacted_yaml(dag_yaml: str) -> str:
    """The task YAML as SkyPilot shows it back: secret values redacted."""
    from sky.utils import yaml_utils

    from sky import task as task_lib

    configs = yaml_utils.read_yaml_all_str(dag_yaml)
    for config in configs:
        if isinstance(config, dict):
            config.pop("_user_specified_yaml", None)  # the YAML as given, secrets and all
            task_lib.redact_task_yaml_dict(config)
    return yaml_utils.dump_yaml_str(configs)


def _gpus_per_node(accelerators: dict[str, Any] | None) -> int:
    return int(math.ceil(sum(float(n) for n in accelerators.values()))) if accelerators else 0


def _accelerators_str(accelerators: dict[str, Any] | None) -> str | None:
    return ", ".join(f"{k}:{v}" for k, v in accelerators.items()) if accelerators else None


def _job_script(cdir: Path, has_setup: bool) -> str:
    """Job 1: setup, then — only if setup exited 0 — run; its status to job.exit."""
    q = {k: shlex.quote(str(cdir / k)) for k in ("setup.sh", "run.sh", "job.exit", ".job.exit.tmp")}
    setup = (
        (
            f"bash {q['setup.sh']}\nrc=$?\n"
            'if [ "$rc" -ne 0 ]; then\n'
            f'  echo "stand-in: job {JOB_ID}\'s setup failed with return code $rc; run skipped"\n'
            '  finish "$rc" true\n  exit "$rc"\nfi\n'
        )
        if has_setup
        else ""
    )
    return (
        "# stand-in: the cluster's one job\n"
        "finish() {\n"
        f'  printf \'{{"exit": %d, "setup_failed": %s, "ended_at": %d}}\\n\' "$1" "$2" "$(date +%s)" '
        f"> {q['.job.exit.tmp']} && mv -f {q['.job.exit.tmp']} {q['job.exit']}\n"
        "}\n"
        f"{setup}"
        f"bash {q['run.sh']}\nrc=$?\n"
        f'[ "$rc" -eq 0 ] || echo "stand-in: job {JOB_ID} failed with return code $rc"\n'
        'finish "$rc" false\nexit "$rc"\n'
    )


def _spawn_job(
    task: Any,
    cdir: Path,
    accelerators: dict[str, Any] | None,
    cluster_env: dict[str, str],
    *,
    has_setup: bool,
    log_path: Path,
    append: bool = False,
    extra_env: dict[str, str] | None = None,
    node: tuple[int, int] = (0, 1),
) -> subprocess.Popen[bytes]:
    """Start a node's job (setup, then run) in `cdir`: bash in a session of its own, with the
    environment a fresh cloud machine gives it (see sky_standin.py's docstring), output to `log_path`.
    `node`: (rank, nodes); every node of a cluster is this host (127.0.0.1), and a worker's lines
    carry SkyPilot's `(worker<i>, rank=<i>, pid=…, ip=…)` prefix, as `sky logs` shows them."""
    rank, nodes = node
    if has_setup:
        (cdir / "setup.sh").write_text(str(task.setup))
    (cdir / "run.sh").write_text(str(task.run or ""))
    script = _job_script(cdir, has_setup)
    if rank:
        script = f'exec > >(exec sed -u "s/^/(worker{rank}, rank={rank}, pid=$$, ip=127.0.0.1) /") 2>&1\n' + script
    (cdir / "job.sh").write_text(script)
    env = {k: os.environ[k] for k in MACHINE_ENV if k in os.environ}
    env.update(cluster_env)
    env.update({k: str(v) for k, v in (task.envs or {}).items()})
    env.update({k: v.get_secret_value() for k, v in (task.secrets or {}).items()})
    env.update(
        {
            "HOME": str(cdir / "home"),
            "SKYPILOT_NUM_NODES": str(nodes),
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * nodes),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(_gpus_per_node(accelerators)),
            "LAUNCHER_APP_DIR": str(cdir / "app"),
        }
    )
    env.update(extra_env or {})
    env[NODE_ENV] = _node_tag(cdir)  # every process of this node, whatever session it makes (`_kill_node`)
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(
            ["bash", str(cdir / "job.sh")],
            cwd=cdir / "home",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# ---------------------------------------------------------------- where SkyPilot's optimizer places a launch


def optimizer_placement(task: Any) -> dict[str, Any]:
    """Where a real launch of this task would land: the pick of SkyPilot's own optimizer
    (the API server the test session runs, on the vendored catalog), read from its table
    as the launcher reads it. A launch SkyPilot could not plan fails here as it would for
    real (no catalog: CloudError; no cloud: NoCloudAccessError)."""
    pick = _optimizer_pick(task)
    return {"cloud": pick.cloud, "region": pick.region, "zone": None, "instance_type": pick.instance_type}


def _optimizer_pick(task: Any) -> Any:
    """SkyPilot's optimizer's chosen row for the task (launcher.backends.sky.backend.Pick: cloud, region,
    instance_type, accelerators, use_spot, ...); its errors as SkyPilot raises them. Read as the
    launcher reads it (launcher.backends.sky.api.optimizer_pick): the optimize request's stream can
    end before its table reached the log on a loaded machine, and a single read then found only
    "Considered resources (1 node):" (a session-16 CI run: a stand-in launch failed so, under load)."""
    import sky as real_sky
    from launcher.backends.sky.api import optimizer_pick

    return optimizer_pick(real_sky, task)


def _placement_of(meta: dict[str, Any]) -> dict[str, Any]:
    handle = meta.get("handle") or {}
    return {k: handle.get(k, PLACEMENT[k]) for k in PLACEMENT}


# ---------------------------------------------------------------- the jobs controller's name


def controller_name() -> str:
    """SkyPilot's own name for this user's jobs controller (sky-jobs-controller-<user hash>)."""
    from sky.utils import common

    return common.JOB_CONTROLLER_NAME

"""A STRICT stand-in for the `sky` module (SkyPilot 0.14.1's client SDK) — no cloud.

No cloud is reachable from the build machine, so the sky backend is tested
against this. The project rule: a stand-in may never be more lenient than the
thing it stands in for. So:

- Every SDK function has the real one's call signature: the arguments are bound
  against `inspect.signature(real sky.<name>)` first, so an argument the real SDK
  rejects raises TypeError here too. `Task`, `Dag`, `Resources`, `ClusterStatus`
  and `exceptions` ARE SkyPilot's; every error raised is SkyPilot's own class
  (ClusterDoesNotExist, NoCloudAccessError, ResourcesUnavailableError, the
  managed-secret RuntimeError of `sky.execution._resolve_managed_secrets`, ...).
- `launch` serializes the task exactly as the real client does
  (`convert_entrypoint_to_dag`, the autostop override, `dump_dag_to_yaml_str`),
  and the request is executed by a DETACHED worker process (its own session),
  as the API server executes requests independently of its client: a client
  killed mid-request leaves the request running. Every other request (`down`,
  `status`, `cancel`, `cost_report`, `api_cancel`) runs in a worker too, so its
  effect lands some time after the call returns, as it does for real. The worker
  loads the DAG with the server's loader (`dag_utils.load_dag_from_yaml_str`)
  and resolves secrets with SkyPilot's own code.
- All state is on disk under `state_dir`, so a later process (a launcher run
  after the first was `kill -9`ed) sees the same clusters and requests.
- A "cluster" is `state_dir/clusters/<name>/`: a copy of `app_dir` as `app/`
  (the image's `/app`), a fresh `home/` (its own disk: nothing survives a leg),
  `meta.json`. Its one job runs the task's real `setup` and then, only if setup
  exited 0, its `run`, with bash, in its own session, detached from everything:
  `down`/`cancel` SIGKILL every process of that session (a `timeout` in `run`
  makes its own process group, so killing the group alone would miss it).
- The job's environment is NOT the caller's: it is what a fresh cloud machine
  gives a job — PATH (with this Python's bin dir first, standing for the
  image's), locale, HOME=<cluster>/home — plus the task's envs, its secrets'
  values, SkyPilot's SKYPILOT_* node variables and LAUNCHER_APP_DIR. A variable
  the launcher forgot to pass does not leak in from the test process. What a
  cloud machine would reach by itself (the hub a test stands up in place of
  huggingface.co: HF_ENDPOINT, ...) is given explicitly as `cluster_env`.

Managed jobs (`fake.jobs`: `launch`, `queue_v2`, `queue`, `cancel`, `tail_logs`, each bound
against the real `sky.jobs.<name>`, and the real client's request body built to validate the
arguments; `calls` records them as ("jobs.launch", job name), ("jobs.cancel", "1,2" / name /
"all"), ("jobs.tail_logs", job id or name), ("jobs.queue_v2", None), ...):
- `jobs.launch` does what the real client does (`convert_entrypoint_to_dag`, the job name,
  SkyPilot's own `sdk.validate` against the session's API server — a bad job_recovery strategy
  is its ValueError, raised by the call — then `dump_dag_to_yaml_str`). The worker does the
  server's part with SkyPilot's code (`maybe_infer_and_fill_dag_and_task_names`,
  `fill_default_config_in_dag_for_job_launch`: differing job_recovery across the candidates is
  its ValueError from `get`), allocates the job id (1, 2, ... under a lock) and starts the job's
  controller, a detached process (its own session): a killed client leaves the job running.
  `get` yields `([job_id], None)`: there is no controller cluster, so no controller handle.
  Several candidate resources (`ordered`, `any_of`, an accelerator list) are accepted here:
  SkyPilot's optimizer (the session's API server) picks once per job, and every attempt runs on
  that pick (`ordered`: the first launchable entry, e.g. spot before on-demand; `any_of`: the
  cheapest). The pick's cloud and region are the job's; zone is None.
- The controller runs the job PENDING -> STARTING -> RUNNING. Each attempt is a FRESH cluster
  directory (`jobs/<id>/attempts/<n>/`: fresh `home/`, fresh copy of the image the job was
  submitted with) running setup then run exactly as a plain cluster's job, with the same
  environment rules plus the controller's SKYPILOT_TASK_ID / SKYPILOT_TASK_IDS (the same for
  every attempt), SKYPILOT_MANAGED_JOB_ID, SKYPILOT_JOB_RANK=0, SKYPILOT_NUM_JOBS=1 and
  SKYPILOT_CLUSTER_INFO; the task's envs are those of the submit, for every attempt. Every
  attempt appends to ONE log (`jobs/<id>/job.log`, what `tail_logs` streams), in order, with a
  `stand-in: ...` line between attempts saying why the job recovered. An ended attempt's
  cluster is torn down: what still runs in its session is killed, its home/ and app/ removed.
- `preempt_job(state_dir, job_id)` (or `python tests/fakes/sky_standin.py preempt <state_dir> <id>`)
  loses the current attempt's instance: every process of its session SIGKILLed. The controller
  sees the cluster gone: RECOVERING, then a new attempt; unlimited, as for real.
  `recovery_count` counts every recovery and restart, once the job is RUNNING again.
- A user failure (run or setup exits non-zero; the job's bash killed by anything but
  `preempt_job` is SkyPilot's FAILED_DRIVER) restarts the job on a fresh attempt while restarts
  <= job_recovery.max_restarts_on_errors (default 0); an exit code in recover_on_exit_codes
  restarts without counting. Otherwise FAILED (setup: FAILED_SETUP), with SkyPilot's
  failure_reason ("Job exited with exit code N (user program failure). To see the details,
  run: sky jobs logs --controller <id>"). Exit 0: SUCCEEDED.
- What SkyPilot's controller retries forever stays STARTING (or RECOVERING) in backoff here too,
  retried every CAPACITY_RETRY_S: a secret without a value (SkyPilot's own RuntimeError, in
  `jobs/<id>/controller.log`), no capacity (`capacity=True`). A launch the optimizer refuses
  (e.g. an accelerator no catalog has) is FAILED_PRECHECKS. `no_cloud=True`: `jobs.launch`
  fails with NoCloudAccessError (the jobs controller itself cannot be launched). A controller
  that dies makes its job FAILED_CONTROLLER (its cluster torn down) when next looked at.
- `jobs.cancel` (exactly one of job_ids / name / all(_users), SkyPilot's ValueError otherwise;
  a terminal job is skipped, a PENDING one cancelled at once) writes a signal file that the
  controller polls every JOBS_CANCEL_POLL_S (0.5 s; real: 15 s): CANCELLING, then the attempt is
  SIGKILLed with its cluster (no signal first), CANCELLED. graceful=True: SIGTERM to every process of
  the job's session at once (the run's tree, as SkyPilot signals it), then up to graceful_timeout
  (None: GRACEFUL_CANCEL_TIMEOUT_S, 30 s as SkyPilot) for the session to exit, then the kill.
- `jobs.queue_v2` yields `(records, total, status_counts, total_no_filter)`: SkyPilot's own
  ManagedJobRecord through its own encoder/JSON/decoder, status the real ManagedJobStatus,
  newest first. `fields` as the real server honours it: unrequested fields are None (job_id,
  task_id, status always sent), fields=None sends all, an unknown field is SkyPilot's
  ValueError. Filled: job_id, task_id=0, job_name, task_name, status, schedule_state,
  recovery_count, submitted_at, start_at, end_at, last_recovered_at (-1 before the start),
  job_duration (the sum of the attempts' run times), failure_reason, details, resources
  (SkyPilot's string), cluster_resources(_full), cloud / region / zone / infra (the live
  cluster's, then the cached ones or '-'), workspace, user_name / user_hash, user_yaml
  (secrets redacted), priority, current_cluster_name. `jobs.queue` (v1, deprecated, logs the
  warning) gives a list with the default fields.
- `jobs.tail_logs` is not a request (as for real): it streams the one log from the start to
  output_stream (stdout if None), following across recoveries until the job is terminal, and
  returns the JobExitCode (0 SUCCEEDED, 100 any FAILED_*, 103 CANCELLED, 102 not found);
  follow=False writes what is there and returns None.
- `job_record(state_dir, job_id)` is the record on disk (`jobs/<id>/job.json`) with
  `attempts` (each one's launched/started/ended times, use_spot, outcome, exit code) and
  job_duration, for tests and billing checks; `shutdown_jobs(state_dir)` kills every
  controller and attempt (test cleanup).
- Refused (NotImplementedError): pools, num_jobs other than None/1, job groups and pipelines
  (explicit job_group, or launching from inside a job group), more than one node,
  `_need_confirmation`, workdir / file_mounts / storage / volumes, `queue_v2(sort_by=,
  sort_order=, infra_match=)`, `cancel(pool=, task=)`, `tail_logs(controller=True,
  tail_offset=, task=, preload_content=False)`. Not emulated: a recovery lands on the same
  placement (SkyPilot's EAGER_NEXT_REGION may move it to another region); the controller does
  not restart itself (emergency recovery); job clusters are not in `status()` nor
  `cost_report()` (their attempts' times are in the job's record); `jobs.wait` and
  `download_logs` are absent.

Several nodes (a plain `launch`): each node is a process group of its own (its own session, its own
`nodes/<i>/` disk; the head is the cluster dir) started together with SkyPilot's node variables
(SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS: every node is 127.0.0.1), all writing
the one job log, a worker's lines prefixed `(worker<i>, rank=<i>, pid=…, ip=…)`; the job ends when
every node has, FAILED if any failed; `down` / `cancel` kill every node's session.

What it cannot emulate, and so refuses (NotImplementedError) rather than fake:
a managed job of more than one node, several candidate resources (for a plain `launch`), `workdir` / `file_mounts` /
storage or volume mounts, `resize`, SkyPilot's internal `_...` launch arguments,
streaming a server-side `log_path`, `tail_logs(preload_content=False)`.
What it does not do (stricter than SkyPilot, or simply absent): it never reuses
a cluster (launching onto an existing name is a RuntimeError: every leg gets a
fresh one); autostop/autodown is recorded but never fires (only `down` ends a
cluster); resources are not checked against SkyPilot's catalogs (that needs
the network; `launcher.backends.skytask` checks accelerator names itself); there are no
prices (`cost_report` has no `total_cost`); there is one job per cluster (id 1).
`api_cancel` kills a request's worker: a cancelled launch that had already
claimed its cluster leaves it behind (INIT, or UP with its job running if the
job had started), as a real cancelled launch can — `down` removes it.
Process bookkeeping reads /proc: Linux only.

Workers and controllers are forked from an executor: a process that has imported SkyPilot once,
as the API server's executor processes have, so a request does not pay SkyPilot's import (about
2 s of CPU here) again. There is one per SkyPilot home (SKY_RUNTIME_DIR: one per test worker; the
state dir where that is unset), started by the first client, gone with that directory or after
EXECUTOR_IDLE_S without a call. It claims its socket before it imports anything, so a request
made while it imports waits for it rather than importing SkyPilot a second time in a fresh
interpreter; a fresh interpreter (the payload on its stdin) is left for an executor that cannot
be started or dies before it answers. Each child starts a session of its own and takes its
caller's environment, working directory and output file, as a fresh interpreter would.

Run as a script: `python tests/fakes/sky_standin.py serve-request <dir>` is the worker,
`job-controller <job dir>` a managed job's controller, `executor <dir>` the executor,
`preempt <state_dir> <job_id>` preempts a
managed job; `python -m tests.fakes.sky_standin launcher <args...>` runs the real launcher CLI with
this stand-in installed from the environment (see `install_from_env`).
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import getpass
import inspect
import json
import math
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

# SkyPilot's JobExitCode values (sky.exceptions.JobExitCode), what tail_logs returns.
JOB_SUCCEEDED, JOB_FAILED, JOB_NOT_FINISHED, JOB_NOT_FOUND, JOB_CANCELLED = 0, 100, 101, 102, 103
JOB_ID = 1  # one job per cluster: the task's
REQUEST_NAMES = {"jobs_launch": "jobs.launch", "jobs_queue": "jobs.queue_v2", "jobs_cancel": "jobs.cancel"}
"""The stand-in's request kinds by SkyPilot's request names (`sky.<name>` in api_status); the others match."""
# Where the stand-in says its clusters are (the launcher pins later legs to leg 0's placement).
PLACEMENT = {"cloud": "GCP", "region": "us-central1", "zone": None, "instance_type": "standin-n1"}
# What a fresh cloud machine's job inherits from "the machine": nothing else of the caller's.
# OMP_NUM_THREADS: the image's thread setting, here the test session's one thread per process
# (tests/conftest.py), as every local leg has it; with OpenMP's default two threads a leg on a
# loaded 2-core host spin-waits: a rehearsal beside two CPU hogs took 30 s of CPU, not 8.5.
MACHINE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR", "OMP_NUM_THREADS")
CAPACITY_RETRY_S = 5.0
POLL_S = 0.05
# Launch arguments the real client forwards but this stand-in cannot honour.
_UNEMULATED_LAUNCH_ARGS = ("clone_disk_from", "resize", "_need_confirmation", "_is_launched_by_jobs_controller",
                           "_is_launched_by_sky_serve_controller", "_disable_controller_check",
                           "_file_mounts_blob_id", "_extra_launch_context", "_include_credentials")
_SDK_CALLS = ("launch", "down", "status", "cancel", "tail_logs", "stream_and_get", "get", "api_cancel", "api_status",
              "cost_report")


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


def _term_session(sid: int) -> int:
    """SIGTERM every live process of session `sid` at once (the run's whole tree, as SkyPilot's
    graceful cancel signals it, not the group leader alone); how many were signalled."""
    members = []
    for entry in os.listdir("/proc"):
        stat = _proc_stat(int(entry)) if entry.isdigit() else None
        if stat and stat[3] == str(sid) and stat[0] != "Z":
            members.append(int(entry))
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


# ---------------------------------------------------------------- the client

class StrictSky:
    """The `sky` module as the sky backend uses it, against local "clusters"."""

    def __init__(self, state_dir: Path, app_dir: Path, *, no_cloud: bool = False, capacity: bool = False,
                 credentials: bool = False, cluster_env: dict[str, str] | None = None, pending_s: float = 0.0,
                 controller_up_s: float = 0.0) -> None:
        """`cluster_env`: what the cloud machine itself provides a job (e.g. HF_ENDPOINT
        of the hub a test stands up in place of huggingface.co). Never for secrets:
        those travel in the task, as the launcher must send them."""
        import sky as real_sky

        self._real = real_sky
        self.Task = real_sky.Task
        self.Dag = real_sky.Dag
        self.Resources = real_sky.Resources
        self.ClusterStatus = real_sky.ClusterStatus
        self.exceptions = real_sky.exceptions
        self.state_dir, self.app_dir = Path(state_dir), Path(app_dir)
        self.no_cloud, self.capacity = no_cloud, capacity
        self.credentials = credentials
        """The enabled cloud's credentials are refused at provisioning: SkyPilot 0.14.1 then raises
        ResourcesUnavailableError with a CloudUserIdentityError in its failover_history, and under
        retry_until_up it keeps retrying (seen against the real client, issue 29)."""
        self.cluster_env = dict(cluster_env or {})
        self.pending_s = pending_s
        """Every `launch` request waits this long PENDING in the API server's queue before it starts
        (a busy server, a long queue): no cluster record exists meanwhile."""
        self.controller_up_s = controller_up_s
        """How long bringing up the jobs controller takes (SkyPilot 0.14.1: minutes), on the first
        `jobs.launch` and after the controller autostopped (`stop_controller`)."""
        self._state = _State(self.state_dir)
        _ensure_executor(self._state.root)
        self._workers: dict[str, subprocess.Popen[bytes]] = {}
        self._real_requests: set[str] = set()
        self.jobs = _StrictJobs(self)

    # -- bookkeeping

    def _bind(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The real SDK function's arguments for this call, defaults applied (TypeError as it would)."""
        bound = inspect.signature(getattr(self._real, name)).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def _record(self, call: str, cluster: str | None) -> None:
        _append_jsonl(self._state.calls, {"pid": os.getpid(), "call": call, "cluster": cluster})

    @property
    def calls(self) -> list[tuple[str, str | None]]:
        """Every SDK call made against this state_dir, by any process, in order."""
        try:
            lines = self._state.calls.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [(r["call"], r["cluster"]) for r in map(json.loads, filter(None, lines))]

    def clusters_of(self, call: str) -> list[str | None]:
        return [cluster for name, cluster in self.calls if name == call]

    # -- requests

    def wait_requests_ended(self, kind: str, cluster: str, timeout_s: float = 60.0) -> int:
        """Wait until no `kind` request for `cluster` has a live worker (each one finished,
        failed or was cancelled): after that, nothing can act for them. How many there were."""
        deadline = time.monotonic() + timeout_s
        while True:
            mine = [d for d in self._state.requests.iterdir()
                    if {"kind": kind, "cluster": cluster}.items() <= (_read_json(d / "request.json") or {}).items()]
            workers = [_read_json(d / "worker.json") or {} for d in mine]
            live = [d.name for d, w in zip(mine, workers) if _alive(w.get("pid", 0), w.get("start"))]  # a zombie is gone
            if not live:
                return len(mine)
            if time.monotonic() > deadline:
                raise TimeoutError(f"stand-in: {kind} requests for {cluster} still running: {live}")
            time.sleep(POLL_S)

    def _submit(self, kind: str, cluster: str | None, args: dict[str, Any], secret_payload: Any = None) -> str:
        """Hand a request to a detached worker; its id. `secret_payload` goes over a
        pipe, never to disk (the task carries secret values)."""
        rid = str(uuid.uuid4())
        rdir = self._state.requests / rid
        rdir.mkdir()
        _write_json(rdir / "request.json", {"id": rid, "kind": kind, "cluster": cluster, "args": args,
                                             "submitted_at": time.time(), "client_pid": os.getpid()})
        (rdir / "request.log").touch()
        pid, proc = _spawn(self._state.root, "serve-request", rdir, self._state.root, rdir / "worker.out",
                           pickle.dumps(secret_payload))
        _write_json(rdir / "worker.json", {"pid": pid, "start": _start_time(pid)})
        if proc is not None:
            self._workers[rid] = proc
        return rid

    def _resolve(self, request_id: str | None) -> Path:
        """A request's directory from its id, a unique prefix of it, or None (the latest)."""
        if request_id is None:
            dirs = [d for d in self._state.requests.iterdir() if (d / "request.json").exists()]
            if not dirs:
                raise self.exceptions.ClientError("Failed to stream logs: no request was submitted")
            return max(dirs, key=lambda d: _read_json(d / "request.json")["submitted_at"])
        if not isinstance(request_id, str) or not request_id or "/" in request_id:
            raise self.exceptions.ClientError(f"Failed to stream logs: invalid request id {request_id!r}")
        matches = [d for d in self._state.requests.iterdir() if d.name.startswith(request_id)]
        if len(matches) != 1:
            raise RuntimeError(f"Failed to get request {request_id}: 404 "
                               f"{'ambiguous' if matches else 'no such'} request id")
        return matches[0]

    def _outcome(self, rdir: Path) -> tuple[str, Any] | None:
        """('ok', value) / ('error', exception) / ('cancelled', None), or None while it runs."""
        if (rdir / "cancelled").exists():
            return "cancelled", None
        path = rdir / "result.pkl"
        if path.exists():
            return pickle.loads(path.read_bytes())
        proc = self._workers.get(rdir.name)
        if proc is not None:
            proc.poll()  # reap our own child, so that /proc does not show a zombie as running
        worker = _read_json(rdir / "worker.json") or {}
        if worker.get("pid") and _alive(worker["pid"], worker.get("start")):
            return None
        if path.exists():
            return pickle.loads(path.read_bytes())
        if (rdir / "cancelled").exists():
            return "cancelled", None
        return "error", RuntimeError(f"stand-in: the worker of request {rdir.name} died without a result "
                                     f"(see {rdir / 'worker.out'})")

    def _finish(self, rdir: Path, outcome: tuple[str, Any]) -> Any:
        self._workers.pop(rdir.name, None)
        kind, value = outcome
        if kind == "ok":
            return value
        if kind == "cancelled":
            name = _read_json(rdir / "request.json")["kind"]
            raise self.exceptions.RequestCancelled(
                f"Current {name!r} request ({rdir.name}) is cancelled by another process.")
        raise value

    def _request_label(self, rdir: Path) -> str:
        req = _read_json(rdir / "request.json") or {}
        return f"{req.get('kind')}:{req.get('cluster')}"

    def stream_and_get(self, *args: Any, **kwargs: Any) -> Any:
        """Stream a request's log to `output_stream` (stdout if None) until it ends; its result."""
        a = self._bind("stream_and_get", args, kwargs)
        if str(a["request_id"]) in self._real_requests:
            return self._real.stream_and_get(a["request_id"], tail=a["tail"], follow=a["follow"],
                                             output_stream=a["output_stream"])
        if a["log_path"] is not None:
            raise NotImplementedError("stand-in: streaming a server-side log_path is not emulated")
        rdir = self._resolve(a["request_id"])
        self._record("stream_and_get", self._request_label(rdir))
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with (rdir / "request.log").open("rb") as log:
            if a["tail"] is not None and a["tail"] > 0:
                lines = decoder.decode(log.read()).splitlines(keepends=True)
                out.write("".join(lines[-a["tail"]:]))
            while True:
                outcome = self._outcome(rdir)
                chunk = log.read()
                if chunk:
                    out.write(decoder.decode(chunk))
                if not a["follow"]:
                    return None
                if outcome is not None:
                    out.write(decoder.decode(log.read(), final=True))
                    return self._finish(rdir, outcome)
                time.sleep(POLL_S)

    def optimize(self, *args: Any, **kwargs: Any) -> Any:
        """SkyPilot's own optimizer (its API server, its catalog): pricing needs no live
        cluster, so it is not stood in for. The request id is the real server's."""
        rid = self._real.optimize(*args, **kwargs)
        self._real_requests.add(str(rid))
        self._record("optimize", None)
        return rid

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for a request; its result, or raise its exception."""
        a = self._bind("get", args, kwargs)
        if str(a["request_id"]) in self._real_requests:
            return self._real.get(a["request_id"])
        rdir = self._resolve(a["request_id"])
        self._record("get", self._request_label(rdir))
        while (outcome := self._outcome(rdir)) is None:
            time.sleep(POLL_S)
        return self._finish(rdir, outcome)

    # -- the SDK calls that are requests

    def launch(self, *args: Any, **kwargs: Any) -> str:
        """Serialize the task as the real client does; a request id for the launch."""
        a = self._bind("launch", args, kwargs)
        from sky.utils import cluster_utils, dag_utils

        sig = inspect.signature(self._real.launch)
        for name in _UNEMULATED_LAUNCH_ARGS:
            if a[name] != sig.parameters[name].default:
                if name == "clone_disk_from":  # the real client's own refusal
                    raise NotImplementedError("clone_disk_from is not implemented yet. Please contact the "
                                              "SkyPilot team if you need this feature at slack.skypilot.co.")
                raise NotImplementedError(f"stand-in: launch({name}=...) is not emulated")
        cluster = a["cluster_name"] or cluster_utils.generate_cluster_name()
        self._record("launch", cluster)
        dag = dag_utils.convert_entrypoint_to_dag(a["task"])  # a deep copy, as the real client makes
        for task in dag.tasks:
            for resource in task.resources:  # launch's flags override the task's autostop, as for real
                resource.override_autostop_config(down=a["down"], idle_minutes=a["idle_minutes_to_autostop"],
                                                  wait_for=a["wait_for"])
            # The client-side half of sky.validate, then the server's checks that need no network.
            task.expand_and_validate_workdir()
            task.expand_and_validate_file_mounts()
            task.validate_name()
            task.validate_run()
            if task.workdir or task.file_mounts or task.storage_mounts or task.volumes:
                raise NotImplementedError("stand-in: workdir, file_mounts, storage and volume mounts are not "
                                          "emulated (nothing would be uploaded)")
        dag_yaml = dag_utils.dump_dag_to_yaml_str(dag)
        args_on_disk = {"cluster_name": cluster, "retry_until_up": a["retry_until_up"], "dryrun": a["dryrun"],
                        "no_setup": a["no_setup"], "down": a["down"],
                        "idle_minutes_to_autostop": a["idle_minutes_to_autostop"],
                        "backend": getattr(a["backend"], "NAME", None), "fast": a["fast"],
                        "optimize_target": str(a["optimize_target"]), "no_cloud": self.no_cloud,
                        "capacity": self.capacity, "credentials": self.credentials,
                        "pending_s": self.pending_s, "app_dir": str(self.app_dir.resolve())}
        return self._submit("launch", cluster, args_on_disk,
                            secret_payload={"dag_yaml": dag_yaml, "cluster_env": self.cluster_env})

    def down(self, *args: Any, **kwargs: Any) -> str:
        a = self._bind("down", args, kwargs)
        self._record("down", a["cluster_name"])
        return self._submit("down", a["cluster_name"], {k: a[k] for k in ("purge", "graceful", "graceful_timeout")})

    def cancel(self, *args: Any, **kwargs: Any) -> str:
        a = self._bind("cancel", args, kwargs)
        self._record("cancel", a["cluster_name"])
        return self._submit("cancel", a["cluster_name"], {"all": a["all"], "job_ids": a["job_ids"]})

    def status(self, *args: Any, **kwargs: Any) -> str:
        a = self._bind("status", args, kwargs)
        names = a["cluster_names"]
        self._record("status", ",".join(names) if names is not None else None)
        return self._submit("status", None, {"cluster_names": names})

    def cost_report(self, *args: Any, **kwargs: Any) -> str:
        a = self._bind("cost_report", args, kwargs)
        self._record("cost_report", None)
        return self._submit("cost_report", None, {"days": a["days"]})

    def api_cancel(self, *args: Any, **kwargs: Any) -> str:
        a = self._bind("api_cancel", args, kwargs)
        ids = a["request_ids"]
        ids = [ids] if isinstance(ids, str) else ids
        self._record("api_cancel", None)
        return self._submit("api_cancel", None, {"request_ids": ids})

    def api_status(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The API server's requests as SkyPilot's own RequestPayload (not a request itself, as for
        real): by id prefix (any status), else only those still working unless all_status; of one
        cluster (a managed job's requests are the jobs controller's); newest first."""
        a = self._bind("api_status", args, kwargs)
        from sky.server.requests import payloads

        self._record("api_status", a["cluster_name"])
        rows = []
        for rdir in self._state.requests.iterdir():
            req = _read_json(rdir / "request.json")
            if req is None:
                continue
            status = self._request_status(rdir)
            if a["request_ids"] is not None:
                if not any(rdir.name.startswith(str(r)) for r in a["request_ids"]):
                    continue
            elif not a["all_status"] and status in ("SUCCEEDED", "FAILED", "CANCELLED"):
                continue
            if a["cluster_name"] is not None and req.get("cluster") != a["cluster_name"]:
                continue
            rows.append(payloads.RequestPayload(
                request_id=rdir.name, name=f"sky.{REQUEST_NAMES.get(req['kind'], req['kind'])}",
                entrypoint=f"sky.client.sdk.{req['kind']}", request_body=json.dumps(req.get("args") or {}),
                status=status, created_at=req["submitted_at"], user_id="standin", return_value="null", error="null",
                pid=(_read_json(rdir / "worker.json") or {}).get("pid"), schedule_type="long",
                cluster_name=req.get("cluster"), finished_at=None))
        rows.sort(key=lambda r: r.created_at, reverse=True)
        return rows[:a["limit"]] if a["limit"] else rows

    def _request_status(self, rdir: Path) -> str:
        """PENDING (queued), RUNNING, SUCCEEDED, FAILED or CANCELLED, as the API server says."""
        if (rdir / "cancelled").exists():
            return "CANCELLED"
        if (rdir / "result.pkl").exists():
            return "SUCCEEDED" if pickle.loads((rdir / "result.pkl").read_bytes())[0] == "ok" else "FAILED"
        worker = _read_json(rdir / "worker.json") or {}
        if worker.get("pid") and _alive(worker["pid"], worker.get("start")):
            return "PENDING" if (rdir / "pending").exists() else "RUNNING"
        if (rdir / "result.pkl").exists() or (rdir / "cancelled").exists():
            return self._request_status(rdir)
        return "FAILED"  # its worker died without a result

    # -- tail_logs: streamed, as the real one is

    def tail_logs(self, *args: Any, **kwargs: Any) -> int:
        """Stream the job's log from the start, following until it ended; its JobExitCode."""
        a = self._bind("tail_logs", args, kwargs)
        name = a["cluster_name"]
        self._record("tail_logs", name)
        if a["output_stream"] is not None and not a["preload_content"]:
            raise ValueError("output_stream cannot be specified when preload_content is False")
        if not a["preload_content"]:
            raise NotImplementedError("stand-in: tail_logs(preload_content=False) is not emulated")
        cdir = self._state.cluster(name)
        if cdir is None:
            raise self.exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        meta = _read_json(cdir / "meta.json") or {}
        if meta.get("status") != "UP":
            raise self.exceptions.ClusterNotUpError(
                f"Cluster {name!r} is not up (status: INIT): it is still being launched.",
                cluster_status=self.ClusterStatus.INIT)
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        if a["job_id"] not in (None, JOB_ID):
            out.write(f"Job {a['job_id']} not found.\n")
            return JOB_NOT_FOUND
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with (cdir / "job.log").open("rb") as log:
            if a["tail"] > 0:
                lines = decoder.decode(log.read()).splitlines(keepends=True)
                out.write("".join(lines[-a["tail"]:]))
            while True:
                ended, code = _job_status(cdir)
                chunk = log.read()
                if chunk:
                    out.write(decoder.decode(chunk))
                if ended or not a["follow"]:
                    out.write(decoder.decode(log.read(), final=True))
                    return code if ended else JOB_NOT_FINISHED
                if not cdir.is_dir():  # torn down under us: the head node is gone mid-stream
                    raise self.exceptions.CommandError(
                        255, "tail_logs", f"Cluster {name!r} was terminated while its logs were streamed.")
                time.sleep(POLL_S)


# ---------------------------------------------------------------- managed jobs: the client (`sky.jobs`)

# How often a job's controller looks for a cancel signal. SkyPilot's controller polls every 15 s;
# the stand-in polls faster so that tests stay short (the order of events is the same).
JOBS_CANCEL_POLL_S = 0.5
# graceful cancel with graceful_timeout=None: SkyPilot 0.14.1 SIGTERMs every process of the run's
# tree, then SIGKILLs what is left 30 s later; so does the stand-in (it gave 10 s to the job's
# process group alone before issue 29, so a final push saw neither the same signal nor the same time).
GRACEFUL_CANCEL_TIMEOUT_S = 30.0


class _StrictJobs:
    """`sky.jobs` (managed jobs) as the stand-in emulates it: see the module docstring."""

    def __init__(self, owner: StrictSky) -> None:
        import sky.jobs as real_jobs

        self._sky = owner
        self._real = real_jobs
        self.ManagedJobStatus = real_jobs.ManagedJobStatus

    def _bind(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The real `sky.jobs.<name>`'s arguments for this call, defaults applied (TypeError as it would)."""
        bound = inspect.signature(getattr(self._real, name)).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    @staticmethod
    def _body(model: str, /, **fields: Any) -> None:
        """Build the real client's request body: its pydantic validation errors, as for real."""
        from sky.server.requests import payloads

        getattr(payloads, model)(**fields)

    def launch(self, *args: Any, **kwargs: Any) -> str:
        """Submit a managed job; a request id. `get` yields `([job_id], None)`: real SkyPilot gives
        the jobs controller's handle second; the stand-in has no controller cluster, so None."""
        a = self._bind("launch", args, kwargs)
        from sky.client import sdk as client_sdk
        from sky.jobs.client import sdk as jobs_sdk
        from sky.skylet import constants as sky_constants
        from sky.utils import dag_utils

        if a["pool"] is not None:
            raise NotImplementedError("stand-in: jobs.launch(pool=...): pools are not emulated")
        if a["num_jobs"] not in (None, 1):
            raise NotImplementedError(f"stand-in: jobs.launch(num_jobs={a['num_jobs']!r}): only one job per launch "
                                      "is emulated")
        if a["_need_confirmation"]:
            raise NotImplementedError("stand-in: jobs.launch(_need_confirmation=True) is not emulated")
        group = a["job_group"]
        if isinstance(group, jobs_sdk._AutoJobGroup):  # noqa: SLF001 - the real default's own type
            if (os.environ.get(sky_constants.MANAGED_JOB_ID_ENV_VAR, "").isdigit()
                    and os.environ.get(sky_constants.ROOT_JOB_ID_ENV_VAR, "").isdigit()):
                raise NotImplementedError("stand-in: launching from inside a job group attaches the job to it; "
                                          "job groups are not emulated")
        elif group is not None:
            raise NotImplementedError("stand-in: jobs.launch(job_group=...): job groups are not emulated")
        dag = dag_utils.convert_entrypoint_to_dag(a["task"])  # a deep copy, as the real client makes
        if a["name"] is not None:
            dag.name = a["name"]
        if len(dag.tasks) != 1 or getattr(dag, "is_job_group", lambda: False)():
            raise NotImplementedError("stand-in: a managed job of more than one task (pipeline, job group) is "
                                      "not emulated")
        [task] = dag.tasks
        if task.num_nodes > 1:
            raise NotImplementedError(f"stand-in: num_nodes={task.num_nodes}: more than one node is not emulated")
        client_sdk.validate(dag)  # SkyPilot's own: the client's file checks, then the API server's validation
        if task.workdir or task.file_mounts or task.storage_mounts or task.volumes:
            raise NotImplementedError("stand-in: workdir, file_mounts, storage and volume mounts are not "
                                      "emulated (nothing would be uploaded)")
        self._sky._record("jobs.launch", dag.name)
        dag_yaml = dag_utils.dump_dag_to_yaml_str(dag)
        args_on_disk = {"name": a["name"], "num_jobs": a["num_jobs"], "no_cloud": self._sky.no_cloud,
                        "capacity": self._sky.capacity, "app_dir": str(self._sky.app_dir.resolve()),
                        "controller_up_s": self._sky.controller_up_s, "job_name": dag.name}
        return self._sky._submit("jobs_launch", controller_name(), args_on_disk,
                                 secret_payload={"dag_yaml": dag_yaml, "cluster_env": self._sky.cluster_env})

    def queue_v2(self, *args: Any, **kwargs: Any) -> str:
        """A request id; `get` yields `(records, total, status_counts, total_no_filter)` with
        SkyPilot's own ManagedJobRecord, `fields` honoured as the real server does."""
        a = self._bind("queue_v2", args, kwargs)
        for name in ("sort_by", "sort_order", "infra_match"):
            if a[name] is not None:
                raise NotImplementedError(f"stand-in: jobs.queue_v2({name}=...) is not emulated")
        fields = list(a["fields"]) if a["fields"] is not None else None
        self._body("JobsQueueV2Body", refresh=a["refresh"], skip_finished=a["skip_finished"],
                   all_users=a["all_users"], job_ids=a["job_ids"], limit=a["limit"], fields=fields,
                   statuses=a["statuses"], submitted_after=a["submitted_after"],
                   submitted_before=a["submitted_before"], name_match=a["name_match"])
        self._sky._record("jobs.queue_v2", None)
        return self._sky._submit("jobs_queue", controller_name(), {
            "refresh": a["refresh"], "controller_up_s": self._sky.controller_up_s,
            "version": 2, "skip_finished": a["skip_finished"], "job_ids": a["job_ids"], "limit": a["limit"],
            "fields": fields, "statuses": a["statuses"], "submitted_after": a["submitted_after"],
            "submitted_before": a["submitted_before"], "name_match": a["name_match"]})

    def queue(self, *args: Any, **kwargs: Any) -> str:
        """Deprecated v1: `get` yields a list of records with the default fields (version=2: as queue_v2)."""
        a = self._bind("queue", args, kwargs)
        if a["version"] not in (1, 2):
            raise ValueError(f"Invalid queue version: {a['version']}. Must be 1 or 2.")
        if a["version"] == 2:
            return self.queue_v2(refresh=a["refresh"], skip_finished=a["skip_finished"],
                                 all_users=a["all_users"], job_ids=a["job_ids"])
        from sky import sky_logging

        sky_logging.init_logger("sky.jobs.client.sdk").warning(
            "sky.jobs.queue(version=1) is deprecated and will be removed in v0.13. Use "
            "sky.jobs.queue(version=2) or sky.jobs.queue_v2() instead.")
        self._body("JobsQueueBody", refresh=a["refresh"], skip_finished=a["skip_finished"],
                   all_users=a["all_users"], job_ids=a["job_ids"])
        self._sky._record("jobs.queue", None)
        return self._sky._submit("jobs_queue", controller_name(), {
            "refresh": a["refresh"], "controller_up_s": self._sky.controller_up_s, "version": 1, "skip_finished": a["skip_finished"], "job_ids": a["job_ids"], "limit": None,
            "fields": None, "statuses": None, "submitted_after": None, "submitted_before": None,
            "name_match": None})

    def cancel(self, *args: Any, **kwargs: Any) -> str:
        """A request id; the cancel lands when the job's controller next polls (see JOBS_CANCEL_POLL_S)."""
        a = self._bind("cancel", args, kwargs)
        if a["pool"] is not None:
            raise NotImplementedError("stand-in: jobs.cancel(pool=...): pools are not emulated")
        if a["task"] is not None:
            raise NotImplementedError("stand-in: jobs.cancel(task=...): cancelling one task of a job group is "
                                      "not emulated")
        self._body("JobsCancelBody", name=a["name"], job_ids=a["job_ids"], all=a["all"], all_users=a["all_users"],
                   pool=a["pool"], graceful=a["graceful"], graceful_timeout=a["graceful_timeout"], task=a["task"])
        job_ids = None if a["job_ids"] is None else [int(j) for j in a["job_ids"]]
        label = (",".join(map(str, job_ids)) if job_ids else a["name"] if a["name"] is not None
                 else "all" if a["all"] or a["all_users"] else None)
        self._sky._record("jobs.cancel", label)
        return self._sky._submit("jobs_cancel", None, {
            "name": a["name"], "job_ids": job_ids, "all": a["all"], "all_users": a["all_users"], "pool": a["pool"],
            "graceful": a["graceful"], "graceful_timeout": a["graceful_timeout"]})

    def tail_logs(self, *args: Any, **kwargs: Any) -> int | None:
        """Stream the job's one log (every attempt's output, in order) from the start, following
        across recoveries until the job is terminal; its JobExitCode. follow=False: None."""
        a = self._bind("tail_logs", args, kwargs)
        if a["tail"] is not None and a["tail"] <= 0:
            raise ValueError(f"tail must be None or a positive integer, got {a['tail']}.")
        if a["tail_offset"] is not None and a["tail_offset"] < 0:
            raise ValueError(f"tail_offset must be None or a non-negative integer, got {a['tail_offset']}.")
        if a["output_stream"] is not None and not a["preload_content"]:
            raise ValueError("output_stream cannot be specified when preload_content is False")
        self._body("JobsLogsBody", name=a["name"], job_id=a["job_id"], follow=a["follow"], controller=a["controller"],
                   refresh=a["refresh"], tail=a["tail"], tail_offset=a["tail_offset"], task=a["task"])
        self._sky._record("jobs.tail_logs", str(a["job_id"]) if a["job_id"] is not None else a["name"])
        if a["controller"]:
            raise NotImplementedError("stand-in: jobs.tail_logs(controller=True) is not emulated")
        if a["tail_offset"] is not None:
            raise NotImplementedError("stand-in: jobs.tail_logs(tail_offset=...) is not emulated")
        if not a["preload_content"]:
            raise NotImplementedError("stand-in: jobs.tail_logs(preload_content=False) is not emulated")
        if a["task"] is not None:
            raise NotImplementedError("stand-in: jobs.tail_logs(task=...): job groups are not emulated")
        from sky import exceptions
        from sky.jobs.state import ManagedJobStatus

        if a["name"] is not None and a["job_id"] is not None:
            raise ValueError("Cannot specify both name and job_id.")
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        root = self._sky._state.root

        def not_found(message: str) -> int | None:
            out.write(message + "\n")
            return JOB_NOT_FOUND if a["follow"] else None

        job_id = a["job_id"]
        if job_id is None and a["name"] is None:
            ids = _job_ids(root)
            if not ids:
                return not_found("No managed job found.")
            job_id = ids[-1]
        elif job_id is None:
            ids = _nonterminal_job_ids_by_name(root, a["name"])
            if not ids:
                return not_found(f"No running managed job found with name {a['name']!r}.")
            if len(ids) > 1:
                raise ValueError(f"Multiple running jobs found with name {a['name']!r}.")
            [job_id] = ids
        jobdir = _job_dir(root, job_id)
        if jobdir is None:
            return not_found(f"Job {job_id} not found.")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with (jobdir / "job.log").open("rb") as log:
            if a["tail"] is not None:
                lines = decoder.decode(log.read()).splitlines(keepends=True)
                out.write("".join(lines[-a["tail"]:]))
            while True:
                rec = _refresh_dead_controller(jobdir)
                status = ManagedJobStatus(rec["status"])
                chunk = log.read()
                if chunk:
                    out.write(decoder.decode(chunk))
                if not a["follow"]:
                    return None
                if status.is_terminal():  # the controller writes the log before it sets a terminal status
                    out.write(decoder.decode(log.read(), final=True))
                    out.write(f"Managed job finished: {job_id} (status: {status.value}).\n")
                    return int(exceptions.JobExitCode.from_managed_job_status(status))
                time.sleep(POLL_S)


# ---------------------------------------------------------------- the worker (the "API server")

def _redacted_yaml(dag_yaml: str) -> str:
    """The task YAML as SkyPilot shows it back: secret values redacted."""
    from sky import task as task_lib
    from sky.utils import yaml_utils

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
    setup = (f"bash {q['setup.sh']}\nrc=$?\n"
             'if [ "$rc" -ne 0 ]; then\n'
             f'  echo "stand-in: job {JOB_ID}\'s setup failed with return code $rc; run skipped"\n'
             '  finish "$rc" true\n  exit "$rc"\nfi\n') if has_setup else ""
    return ("# stand-in: the cluster's one job\n"
            "finish() {\n"
            f"  printf '{{\"exit\": %d, \"setup_failed\": %s, \"ended_at\": %d}}\\n' \"$1\" \"$2\" \"$(date +%s)\" "
            f"> {q['.job.exit.tmp']} && mv -f {q['.job.exit.tmp']} {q['job.exit']}\n"
            "}\n"
            f"{setup}"
            f"bash {q['run.sh']}\nrc=$?\n"
            f'[ "$rc" -eq 0 ] || echo "stand-in: job {JOB_ID} failed with return code $rc"\n'
            'finish "$rc" false\nexit "$rc"\n')


def _spawn_job(task: Any, cdir: Path, accelerators: dict[str, Any] | None, cluster_env: dict[str, str], *,
               has_setup: bool, log_path: Path, append: bool = False, extra_env: dict[str, str] | None = None,
               node: tuple[int, int] = (0, 1)) -> subprocess.Popen[bytes]:
    """Start a node's job (setup, then run) in `cdir`: bash in a session of its own, with the
    environment a fresh cloud machine gives it (see the module docstring), output to `log_path`.
    `node`: (rank, nodes); every node of a cluster is this host (127.0.0.1), and a worker's lines
    carry SkyPilot's `(worker<i>, rank=<i>, pid=…, ip=…)` prefix, as `sky logs` shows them."""
    rank, nodes = node
    if has_setup:
        (cdir / "setup.sh").write_text(str(task.setup))
    (cdir / "run.sh").write_text(str(task.run or ""))
    script = _job_script(cdir, has_setup)
    if rank:
        script = (f"exec > >(exec sed -u \"s/^/(worker{rank}, rank={rank}, pid=$$, ip=127.0.0.1) /\") 2>&1\n"
                  + script)
    (cdir / "job.sh").write_text(script)
    env = {k: os.environ[k] for k in MACHINE_ENV if k in os.environ}
    env.update(cluster_env)
    env.update({k: str(v) for k, v in (task.envs or {}).items()})
    env.update({k: v.get_secret_value() for k, v in (task.secrets or {}).items()})
    env.update({"HOME": str(cdir / "home"), "SKYPILOT_NUM_NODES": str(nodes), "SKYPILOT_NODE_RANK": str(rank),
                "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * nodes),
                "SKYPILOT_NUM_GPUS_PER_NODE": str(_gpus_per_node(accelerators)),
                "LAUNCHER_APP_DIR": str(cdir / "app")})
    env.update(extra_env or {})
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(["bash", str(cdir / "job.sh")], cwd=cdir / "home", env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


class _Worker:
    """Executes one request, writing its result (or its exception) to the request dir."""

    def __init__(self, rdir: Path) -> None:
        self.rdir = rdir
        self.req = _read_json(rdir / "request.json")
        self.state = _State(rdir.parent.parent)
        self.log = (rdir / "request.log").open("a", encoding="utf-8", buffering=1)

    def say(self, line: str) -> None:
        self.log.write(f"stand-in: {line}\n")

    def serve(self, payload: Any) -> None:
        wait_s = float((self.req.get("args") or {}).get("pending_s") or 0.0)
        if wait_s > 0:  # queued on the API server: PENDING, nothing done yet
            (self.rdir / "pending").touch()
            time.sleep(wait_s)
            (self.rdir / "pending").unlink()
        try:
            outcome: tuple[str, Any] = ("ok", getattr(self, f"_{self.req['kind']}")(payload))
        except BaseException as err:  # noqa: BLE001 - the request's error goes to its client, as for real
            outcome = ("error", err)
        try:
            data = pickle.dumps(outcome)
        except Exception:  # noqa: BLE001 - an unpicklable error: its type and text still reach the client
            err = outcome[1]
            data = pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: {err}")))
        tmp = self.rdir / ".result.pkl.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.rdir / "result.pkl")

    # -- launch

    def _launch(self, payload: dict[str, Any]) -> tuple[int | None, Any]:
        from sky import exceptions, execution
        from sky.utils import common_utils, dag_utils

        args, name = self.req["args"], self.req["cluster"]
        self.say(f"launch request for cluster {name}")
        dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # what the API server does with the body
        if len(dag.tasks) != 1:
            raise NotImplementedError("stand-in: a DAG of more than one task is not emulated")
        [task] = dag.tasks
        execution._resolve_managed_secrets(dag)  # noqa: SLF001 - SkyPilot's own refusal of valueless secrets
        common_utils.check_cluster_name_is_valid(name)
        if len(task.resources) != 1:
            raise NotImplementedError("stand-in: choosing among several candidate resources is not emulated")
        [res] = list(task.resources)
        if args["no_cloud"]:
            raise exceptions.NoCloudAccessError("Cloud access is not set up. Run: sky check")
        placement = optimizer_placement(task)  # SkyPilot plans (its optimizer) before it provisions anything
        if args["dryrun"]:
            self.say("dryrun: nothing provisioned")
            return None, None
        if self.state.cluster(name) is not None:
            raise RuntimeError(f"stand-in: cluster {name!r} already exists: each leg must launch a fresh cluster")
        while args.get("credentials"):
            identity = exceptions.CloudUserIdentityError(
                f"Failed to get {PLACEMENT['cloud']} user identification. Details: the credentials were refused "
                "(stand-in)")
            if not args["retry_until_up"]:
                raise exceptions.ResourcesUnavailableError(
                    f"Failed to provision all possible launchable resources. Relax the task's resource "
                    f"requirements: {task.num_nodes}x {res}", failover_history=[identity])
            self.say(f"credentials refused for {PLACEMENT['cloud']}; retrying in {CAPACITY_RETRY_S:.0f}s "
                     "(retry_until_up)")
            time.sleep(CAPACITY_RETRY_S)
        while args["capacity"]:
            tried = f"{task.num_nodes}x {res}"
            wanted = _accelerators_str(res.accelerators) or "CPU"
            message = ("Failed to provision all possible launchable resources. Relax the task's resource "
                       f"requirements: {tried}\nFailed to acquire resources ({wanted}) in every zone of "
                       f"{PLACEMENT['cloud']} for {{{res}}}.")
            if not args["retry_until_up"]:
                raise exceptions.ResourcesUnavailableError(
                    message + "\nTo keep retrying until the cluster is up, use the `--retry-until-up` flag.")
            self.say(f"no capacity for {tried}; retrying in {CAPACITY_RETRY_S:.0f}s (retry_until_up)")
            time.sleep(CAPACITY_RETRY_S)
        with self.state.cluster_lock(name):
            cdir = self.state.clusters / name
            try:
                cdir.mkdir()
            except FileExistsError:
                raise RuntimeError(f"stand-in: cluster {name!r} already exists: each leg must launch a fresh "
                                   "cluster") from None
            return self._provision(task, res, cdir, payload, placement)

    def _provision(self, task: Any, res: Any, cdir: Path, payload: dict[str, Any],
                   placement: dict[str, Any]) -> tuple[int, Any]:
        args, name = self.req["args"], self.req["cluster"]
        accelerators = dict(res.accelerators) if res.accelerators else None
        autostop = res.autostop_config
        meta = {
            "name": name, "cluster_hash": uuid.uuid4().hex, "request_id": self.rdir.name, "status": "INIT",
            "launched_at": int(time.time()), "num_nodes": task.num_nodes, "accelerators": accelerators,
            "use_spot": bool(res.use_spot),
            "autostop": None if autostop is None else {"idle_minutes": autostop.idle_minutes,
                                                       "down": autostop.down, "enabled": autostop.enabled},
            "launch_args": {k: args[k] for k in ("idle_minutes_to_autostop", "down", "retry_until_up", "no_setup")},
            "requested": {"cloud": str(res.cloud) if res.cloud else None, "region": res.region, "zone": res.zone,
                          "instance_type": res.instance_type, "image_id": res.image_id},
            "task_yaml": _redacted_yaml(payload["dag_yaml"]),
        }
        _write_json(cdir / "meta.json", meta)
        self.say(f"provisioning {name} ({task.num_nodes}x {res}) ...")
        shutil.copytree(args["app_dir"], cdir / "app", symlinks=True)
        (cdir / "home").mkdir()
        handle = SimpleNamespace(
            cluster_name=name, cluster_name_on_cloud=name, head_ip="127.0.0.1", launched_nodes=task.num_nodes,
            launched_resources=SimpleNamespace(**placement, use_spot=bool(res.use_spot), accelerators=accelerators))
        self._start_job(task, cdir, accelerators, payload["cluster_env"])
        meta.update(status="UP", handle={"launched_nodes": task.num_nodes, **placement})
        _write_json(cdir / "meta.json", meta)
        self.say(f"{name} is UP; job {JOB_ID} submitted")
        return JOB_ID, handle

    def _start_job(self, task: Any, cdir: Path, accelerators: dict[str, Any] | None,
                   cluster_env: dict[str, str]) -> None:
        """The job on every node at once: node 0 (the head) in the cluster dir, node i in nodes/<i>/
        (a disk of its own), each with SkyPilot's node variables, all into the one job log."""
        has_setup = bool(task.setup) and not self.req["args"]["no_setup"]
        started = []
        for rank in range(task.num_nodes):
            ndir = _node_dir(cdir, rank)
            if rank:
                ndir.mkdir(parents=True)
                shutil.copytree(cdir / "app", ndir / "app", symlinks=True)
                (ndir / "home").mkdir()
            proc = _spawn_job(task, ndir, accelerators, cluster_env, has_setup=has_setup, log_path=cdir / "job.log",
                              append=True, node=(rank, task.num_nodes))  # O_APPEND: no node writes over another
            started.append({"pgid": proc.pid, "start": _start_time(proc.pid)})
        _write_json(cdir / "job.json", {**started[0], "nodes": started, "started_at": time.time()})

    # -- the other requests

    def _down(self, _payload: Any) -> None:
        name = self.req["cluster"]
        with contextlib.ExitStack() as stack:
            if _safe_name(name):
                stack.enter_context(self.state.cluster_lock(name))  # waits out a launch still provisioning it
            cdir = self.state.cluster(name)
            if cdir is None:
                from sky import exceptions

                raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
            self.say(f"terminating {name} ...")
            job = _read_json(cdir / "job.json")
            if job is not None:
                for node in job.get("nodes") or [job]:
                    _kill_session(node["pgid"], node["start"])
            meta = _read_json(cdir / "meta.json") or {"launched_at": int(cdir.stat().st_mtime), "num_nodes": 1,
                                                      "accelerators": None}
            _append_jsonl(self.state.history, {
                "name": name, "launched_at": meta["launched_at"], "downed_at": time.time(),
                "num_nodes": meta["num_nodes"], "accelerators": meta["accelerators"],
                "cluster_hash": meta.get("cluster_hash")})
            shutil.rmtree(cdir)
            self.say(f"terminated {name}")

    def _cancel(self, _payload: Any) -> None:
        from sky import exceptions

        name, args = self.req["cluster"], self.req["args"]
        cdir = self.state.cluster(name)
        if cdir is None:
            raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if (_read_json(cdir / "meta.json") or {}).get("status") != "UP":
            raise exceptions.ClusterNotUpError(f"Cluster {name!r} is not up (status: INIT).")
        if args["job_ids"] is not None and JOB_ID not in args["job_ids"]:
            self.say(f"no job {args['job_ids']} on {name}")
            return
        ended, _ = _job_status(cdir)
        if ended:
            self.say(f"job {JOB_ID} on {name} already ended")
            return
        job = _read_json(cdir / "job.json")
        for node in job.get("nodes") or [job]:
            _kill_session(node["pgid"], node["start"])
        if not (cdir / "job.exit").exists():  # it had not finished before the kill
            _write_json(cdir / "job.cancelled", {"at": time.time()})
        self.say(f"cancelled job {JOB_ID} on {name}")

    def _status(self, _payload: Any) -> list[Any]:
        from sky.schemas.api.responses import StatusResponse
        from sky.utils import common_utils, status_lib

        wanted = self.req["args"]["cluster_names"]
        records = []
        for name in self.state.cluster_names():
            cdir = self.state.clusters / name
            meta = _read_json(cdir / "meta.json")
            if (wanted is not None and name not in wanted) or meta is None:
                continue
            up = meta["status"] == "UP"
            autostop = meta["autostop"] or {}
            if name == controller_name() and wanted is None:
                continue  # not emulated: the jobs controller in an unnamed status()
            handle = SimpleNamespace(
                cluster_name=name, cluster_name_on_cloud=name, head_ip="127.0.0.1", launched_nodes=meta["num_nodes"],
                launched_resources=SimpleNamespace(**_placement_of(meta), use_spot=meta["use_spot"],
                                                   accelerators=meta["accelerators"])) if up else None
            records.append(StatusResponse(
                name=name, launched_at=meta["launched_at"], handle=handle,
                status=status_lib.ClusterStatus[meta["status"]],
                autostop=autostop.get("idle_minutes", -1) if autostop.get("enabled", True) else -1,
                to_down=bool(autostop.get("down", False)), cluster_hash=meta["cluster_hash"], cluster_ever_up=up,
                user_hash=common_utils.get_user_hash(), user_name=getpass.getuser(), workspace="default",
                is_managed=False, nodes=meta["num_nodes"], cloud=_placement_of(meta)["cloud"], region=_placement_of(meta)["region"],
                accelerators=_accelerators_str(meta["accelerators"]), last_creation_yaml=meta["task_yaml"],
                cluster_name_on_cloud=name))
        return sorted(records, key=lambda r: r.launched_at)

    def _cost_report(self, _payload: Any) -> list[dict[str, Any]]:
        days = self.req["args"]["days"] or 30  # SkyPilot's COST_REPORT_DEFAULT_DAYS
        now, since = time.time(), time.time() - days * 86400
        reports = []
        try:
            downed = [json.loads(line) for line in self.state.history.read_text().splitlines() if line]
        except FileNotFoundError:
            downed = []
        for rec in downed:
            if rec["downed_at"] >= since:
                reports.append({**rec, "status": None, "duration": int(rec["downed_at"] - rec["launched_at"]),
                                "usage_intervals": [(rec["launched_at"], int(rec["downed_at"]))]})
        alive = [m for m in (_read_json(self.state.clusters / n / "meta.json") for n in self.state.cluster_names())
                 if m is not None]
        if alive:
            from sky.utils import status_lib
        for meta in alive:
            name = meta["name"]
            reports.append({"name": name, "launched_at": meta["launched_at"], "downed_at": None,
                            "num_nodes": meta["num_nodes"], "accelerators": meta["accelerators"],
                            "cluster_hash": meta["cluster_hash"], "duration": int(now - meta["launched_at"]),
                            "status": status_lib.ClusterStatus[meta["status"]],
                            "usage_intervals": [(meta["launched_at"], None)]})
        return reports

    def _api_cancel(self, _payload: Any) -> list[str]:
        ids = self.req["args"]["request_ids"]
        targets = ([d for d in self.state.requests.iterdir() if d != self.rdir] if ids is None
                   else [self.state.requests / r for r in ids if _safe_name(r)])
        cancelled = []
        for rdir in targets:
            if not (rdir / "request.json").exists() or (rdir / "result.pkl").exists() or (rdir / "cancelled").exists():
                continue
            worker = _read_json(rdir / "worker.json") or {}
            if worker.get("pid"):
                _kill_session(worker["pid"], worker.get("start"))
            if not (rdir / "result.pkl").exists():  # it had not finished before the kill
                _write_json(rdir / "cancelled", {"at": time.time()})
                cancelled.append(rdir.name)
                self.say(f"cancelled request {rdir.name}")
        return cancelled

    # -- managed jobs (sky.jobs): the API server's half; the job itself runs under its controller

    def _jobs_launch(self, payload: dict[str, Any]) -> tuple[list[int], None]:
        from sky import exceptions
        from sky.backends import backend_utils
        from sky.jobs import utils as managed_job_utils
        from sky.skylet import constants as sky_constants
        from sky.utils import common_utils, dag_utils

        args = self.req["args"]
        self.say("jobs.launch request")
        dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # what the API server does with the body
        if len(dag.tasks) != 1:
            raise NotImplementedError("stand-in: a managed job of more than one task is not emulated")
        [task] = dag.tasks
        resources = list(task.resources)
        for res in resources[1:]:  # the server's own checks (jobs/server/core.py)
            if res.priority != resources[0].priority:
                raise ValueError(f"Task {task.name!r}: All resources must have the same priority. Found priority "
                                 f"{res.priority} but expected {resources[0].priority}.")
        priority = resources[0].priority if resources[0].priority is not None else sky_constants.DEFAULT_PRIORITY
        dag_utils.maybe_infer_and_fill_dag_and_task_names(dag)
        dag_utils.fill_default_config_in_dag_for_job_launch(dag)  # differing job_recovery: SkyPilot's ValueError
        if args["no_cloud"]:  # the jobs controller itself cannot be launched
            raise exceptions.NoCloudAccessError("Cloud access is not set up. Run: sky check")
        self._controller_up(args["controller_up_s"])
        task.update_envs({"SKYPILOT_NUM_JOBS": str(args["num_jobs"] or 1)})
        recovery = list(task.resources)[0].job_recovery
        record = {
            "job_name": dag.name, "task_name": task.name, "status": "PENDING", "schedule_state": "WAITING",
            "submitted_at": None, "start_at": None, "end_at": None, "last_recovered_at": -1, "recovery_count": 0,
            "failure_reason": None, "backoff": None,
            "resources": backend_utils.get_task_resources_str(task, is_managed_job=True),
            "job_recovery": recovery if isinstance(recovery, dict) else {"strategy": recovery},
            "priority": priority, "user_name": getpass.getuser(), "user_hash": common_utils.get_user_hash(),
            "user_yaml": _redacted_yaml(payload["dag_yaml"]), "placement": None, "attempts": [],
            "controller": None, "done": False, "cluster_name": None,
        }
        job_id, jobdir = _new_job(self.state.root, record)
        _update_job(jobdir, cluster_name=managed_job_utils.generate_managed_job_cluster_name(task.name, job_id))
        # The image the job was submitted with: every attempt's /app is a copy of this, never of a later app_dir.
        shutil.copytree(args["app_dir"], jobdir / "image", symlinks=True)
        pid, _ = _spawn(self.state.root, "job-controller", jobdir, jobdir, jobdir / "controller.out",
                        pickle.dumps({"dag_yaml": dag_utils.dump_dag_to_yaml_str(dag),
                                      "cluster_env": payload["cluster_env"],
                                      "app_dir": str(jobdir / "image"), "capacity": args["capacity"]}))
        _update_job(jobdir, controller={"pid": pid, "start": _start_time(pid)})
        self.say(f"Launching managed job {dag.name!r}: job id {job_id}")
        return [job_id], None

    def _controller_up(self, up_s: float) -> None:
        """The jobs controller, as a cluster of this state dir: launched (INIT for `up_s`, then UP)
        where it is not up; a request cancelled meanwhile leaves it INIT, as a cancelled launch
        leaves a cluster."""
        name = controller_name()
        with self.state.cluster_lock(name):
            cdir = self.state.clusters / name
            meta = _read_json(cdir / "meta.json")
            if meta is not None and meta["status"] == "UP":
                return
            self.say(f"Launching the jobs controller {name} ({'restarting it' if meta else 'new'}) ...")
            cdir.mkdir(exist_ok=True)
            meta = meta or {"name": name, "cluster_hash": uuid.uuid4().hex, "request_id": self.rdir.name,
                            "launched_at": int(time.time()), "num_nodes": 1, "accelerators": None,
                            "use_spot": False, "autostop": {"idle_minutes": 10, "down": False, "enabled": True},
                            "launch_args": {}, "requested": {}, "task_yaml": "",
                            "handle": {"launched_nodes": 1, **PLACEMENT, "instance_type": "standin-controller"}}
            meta["status"] = "INIT"
            _write_json(cdir / "meta.json", meta)
            time.sleep(up_s)
            meta["status"] = "UP"
            _write_json(cdir / "meta.json", meta)
            self.say(f"the jobs controller {name} is UP")

    def _controller_is_up(self) -> bool:
        meta = _read_json(self.state.clusters / controller_name() / "meta.json")
        return meta is not None and meta["status"] == "UP"

    def _jobs_queue(self, _payload: Any) -> Any:
        from sky.jobs import constants as managed_job_constants
        from sky.jobs import state as managed_job_state
        from sky.jobs import utils as managed_job_utils
        from sky.schemas.api import responses
        from sky.server.requests.serializers import decoders, encoders

        args = self.req["args"]
        if not self._controller_is_up():  # SkyPilot's answer without a refresh; with one, it starts it
            if not args.get("refresh"):
                from sky import exceptions

                raise exceptions.ClusterNotUpError("No in-progress managed jobs.")
            self._controller_up(args.get("controller_up_s") or 0.0)
        fields = args["fields"]
        if args["version"] == 1:  # the server asks for the default fields (and their dependencies)
            fields = managed_job_utils._update_fields(  # noqa: SLF001 - SkyPilot's own field expansion
                list(managed_job_constants.DEFAULT_MANAGED_JOB_FIELDS))[0]
        elif fields:  # an unknown field is SkyPilot's ValueError('Unknown field: ...')
            for field in managed_job_utils._update_fields(list(fields))[0]:  # noqa: SLF001
                managed_job_state._map_response_field_to_db_column(field)  # noqa: SLF001
        if args["limit"] is not None and args["limit"] < 1:
            raise ValueError(f"Limit must be at least 1, got {args['limit']}")
        now = time.time()
        rows = [_queue_row(rec, now) for rec in (_refresh_dead_controller(d) for d in _job_dirs(self.state.root))
                if rec is not None]
        total_no_filter = len(rows)
        if args["skip_finished"]:
            rows = [r for r in rows if not r["status"].is_terminal()]
        if args["job_ids"] is not None:
            rows = [r for r in rows if r["job_id"] in args["job_ids"]]
        if args["name_match"] is not None:
            rows = [r for r in rows if args["name_match"] in (r["job_name"] or "")]
        for bound, keep in (("submitted_after", lambda t, b: t >= b), ("submitted_before", lambda t, b: t <= b)):
            if args[bound] is not None:  # a job not yet submitted counts as "now", a terminal one as never
                rows = [r for r in rows if (r["submitted_at"] is not None and keep(r["submitted_at"], args[bound]))
                        or (r["submitted_at"] is None and not r["status"].is_terminal() and keep(now, args[bound]))]
        status_counts: dict[str, int] = {}
        for r in rows:
            status_counts[r["status"].value] = status_counts.get(r["status"].value, 0) + 1
        if args["statuses"]:
            rows = [r for r in rows if r["status"].value in args["statuses"]]
        total = len(rows)
        rows.sort(key=lambda r: r["job_id"], reverse=True)  # newest first, as SkyPilot sorts by default
        if args["limit"] is not None:
            rows = rows[:args["limit"]]
        if fields:  # what was not asked for is not sent (job_id, task_id and status always are)
            keep_fields = set(fields) | {"job_id", "task_id", "status"}
            rows = [{k: v for k, v in r.items() if k in keep_fields} for r in rows]
        # Through SkyPilot's own encoder, JSON and decoder, as the records travel for real.
        if args["version"] == 1:
            return decoders.decode_jobs_queue(json.loads(json.dumps(encoders.encode_jobs_queue(rows))))
        records = [responses.ManagedJobRecord(**r) for r in rows]
        wire = encoders.encode_jobs_queue_v2((records, total, status_counts, total_no_filter))
        return decoders.decode_jobs_queue_v2(json.loads(json.dumps(wire)))

    def _jobs_cancel(self, _payload: Any) -> None:
        from sky.jobs.state import ManagedJobStatus

        args = self.req["args"]
        if not self._controller_is_up():
            from sky import exceptions

            raise exceptions.ClusterNotUpError("All managed jobs should have finished.")
        job_ids = list(dict.fromkeys(args["job_ids"] or []))
        name, everything = args["name"], args["all"] or args["all_users"]
        if sum([bool(job_ids), name is not None, args["pool"] is not None, everything]) != 1:
            given = ([f"job_ids={','.join(map(str, job_ids))}"] if job_ids else []) + (
                [f"name={name}"] if name is not None else []) + (
                [f"pool={args['pool']}"] if args["pool"] is not None else []) + (
                ["all"] if args["all"] else []) + (["all_users"] if args["all_users"] else [])
            raise ValueError(f"Can only specify one of JOB_IDS, name, pool, or all/all_users. Provided "
                             f"{' '.join(given)!r}.")
        if everything:
            job_ids = [j for j in _job_ids(self.state.root) if not _terminal(_refresh_dead_controller(
                self.state.root / "jobs" / str(j)))]
            if not job_ids:
                self.say("No job to cancel.")
                return None
        elif name is not None:
            job_ids = _nonterminal_job_ids_by_name(self.state.root, name)
            if not job_ids:
                self.say(f"No running job found with name {name!r}.")
                return None
            if len(job_ids) > 1:
                self.say(f"Multiple running jobs found with name {name!r}.\nJob IDs: {job_ids}")
                raise RuntimeError("Please specify the job ID instead of the job name.")
        cancelled = []
        for job_id in job_ids:
            jobdir = _job_dir(self.state.root, job_id)
            rec = _refresh_dead_controller(jobdir) if jobdir is not None else None
            if rec is None:
                self.say(f"Job {job_id} not found. Skipped.")
                continue
            with _locked(jobdir / ".lock"):
                rec = _read_json(jobdir / "job.json")
                status = ManagedJobStatus(rec["status"])
                if status.is_terminal():
                    self.say(f"Job {job_id} is already in terminal state {status.value}. Skipped.")
                    continue
                if status == ManagedJobStatus.PENDING:  # its controller has not started it: cancelled at once
                    rec.update(status="CANCELLED", end_at=time.time(), schedule_state="DONE")
                    _write_json(jobdir / "job.json", rec)
                else:  # the controller's signal file (SkyPilot's ~/.sky/signals/<job_id>)
                    _write_json(jobdir / "cancel.json", {"graceful": bool(args["graceful"]),
                                                         "graceful_timeout": args["graceful_timeout"],
                                                         "at": time.time()})
            cancelled.append(job_id)
        if not cancelled:
            self.say("No job to cancel.")
        else:
            who = (f"Job with ID {cancelled[0]} is" if len(cancelled) == 1
                   else f"Jobs with IDs {', '.join(map(str, cancelled))} are")
            self.say(f"{who} scheduled to be cancelled.")
        return None


def optimizer_placement(task: Any) -> dict[str, Any]:
    """Where a real launch of this task would land: the pick of SkyPilot's own optimizer
    (the API server the test session runs, on the vendored catalog), read from its table
    as the launcher reads it. A launch SkyPilot could not plan fails here as it would for
    real (no catalog: CloudError; no cloud: NoCloudAccessError)."""
    pick = _optimizer_pick(task)
    return {"cloud": pick.cloud, "region": pick.region, "zone": None, "instance_type": pick.instance_type}


def _optimizer_pick(task: Any) -> Any:
    """SkyPilot's optimizer's chosen row for the task (launcher.backends.sky.Pick: cloud, region,
    instance_type, accelerators, use_spot, ...); its errors as SkyPilot raises them."""
    import io

    import sky as real_sky

    from launcher.backends.skyapi import parse_optimizer_table

    dag = real_sky.Dag()
    dag.add(task)
    table = io.StringIO()
    real_sky.stream_and_get(real_sky.optimize(dag), output_stream=table)
    return parse_optimizer_table(table.getvalue(), int(task.num_nodes or 1))


def _placement_of(meta: dict[str, Any]) -> dict[str, Any]:
    handle = meta.get("handle") or {}
    return {k: handle.get(k, PLACEMENT[k]) for k in PLACEMENT}


def serve_request(rdir: Path, data: bytes | None = None) -> None:
    """The worker's entry point: the request's secret payload arrives on stdin (or from the executor)."""
    payload = pickle.loads(sys.stdin.buffer.read() if data is None else data)
    _Worker(rdir).serve(payload)


# ---------------------------------------------------------------- managed jobs: on-disk state and the controller

def _job_dirs(root: Path) -> list[Path]:
    jobs = root / "jobs"
    if not jobs.is_dir():
        return []
    dirs = [d for d in jobs.iterdir() if d.name.isdigit() and (d / "job.json").exists()]
    return sorted(dirs, key=lambda d: int(d.name))


def _job_ids(root: Path) -> list[int]:
    return [int(d.name) for d in _job_dirs(root)]


def _job_dir(root: Path, job_id: Any) -> Path | None:
    """A job's directory if the job exists."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        return None
    path = root / "jobs" / str(job_id)
    return path if (path / "job.json").exists() else None


def _new_job(root: Path, record: dict[str, Any]) -> tuple[int, Path]:
    """Allocate the next job id (1, 2, ...) under a lock; write the job's first record."""
    with _locked(root / "locks" / "jobs.lock"):
        jobs = root / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        job_id = max((int(d.name) for d in jobs.iterdir() if d.name.isdigit()), default=0) + 1
        jobdir = jobs / str(job_id)
        jobdir.mkdir()
        (jobdir / "job.log").touch()
        _write_json(jobdir / "job.json", {"job_id": job_id, **record})
    return job_id, jobdir


def _update_job(jobdir: Path, mutate: Any = None, **changes: Any) -> dict[str, Any]:
    """Read-modify-write a job's record under its lock; the new record."""
    with _locked(jobdir / ".lock"):
        rec = _read_json(jobdir / "job.json")
        rec.update(changes)
        if mutate is not None:
            mutate(rec)
        _write_json(jobdir / "job.json", rec)
        return rec


def _terminal(rec: dict[str, Any] | None) -> bool:
    from sky.jobs.state import ManagedJobStatus

    return rec is not None and ManagedJobStatus(rec["status"]).is_terminal()


def _nonterminal_job_ids_by_name(root: Path, name: str) -> list[int]:
    ids = []
    for jobdir in _job_dirs(root):
        rec = _refresh_dead_controller(jobdir)
        if rec is not None and rec["job_name"] == name and not _terminal(rec):
            ids.append(rec["job_id"])
    return ids


def _live_attempt(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The attempt whose cluster is up (its job may have ended), if any."""
    attempts = rec.get("attempts") or []
    return attempts[-1] if attempts and attempts[-1].get("ended_at") is None else None


def _refresh_dead_controller(jobdir: Path) -> dict[str, Any] | None:
    """The job's record; a job whose controller died before finishing it becomes FAILED_CONTROLLER
    (its cluster torn down), as SkyPilot's `update_managed_jobs_statuses` makes it."""
    rec = _read_json(jobdir / "job.json")
    if rec is None or rec.get("done") or _terminal(rec) or not rec.get("controller"):
        return rec
    if _alive(rec["controller"]["pid"], rec["controller"]["start"]):
        return rec
    with _locked(jobdir / ".lock"):
        rec = _read_json(jobdir / "job.json")
        if rec.get("done") or _terminal(rec) or _alive(rec["controller"]["pid"], rec["controller"]["start"]):
            return rec
        now = time.time()
        attempt = _live_attempt(rec)
        if attempt is not None:
            if attempt.get("pid"):
                _kill_session(attempt["pid"], attempt["start"])
            attempt.update(ended_at=now, outcome="controller_failed")
        rec.update(status="FAILED_CONTROLLER", end_at=rec.get("end_at") or now, schedule_state="DONE", done=True,
                   failure_reason="Controller process has exited abnormally (Controller process is dead). For "
                                  f"more details, run: sky jobs logs --controller {rec['job_id']}")
        _write_json(jobdir / "job.json", rec)
        return rec


def _job_duration(rec: dict[str, Any], now: float) -> float:
    """The sum of the attempts' run times (provisioning and recovery excluded), as SkyPilot counts it."""
    total = 0.0
    for attempt in rec.get("attempts") or []:
        if attempt.get("started_at") is None:
            continue
        end = attempt.get("ended_at") or rec.get("end_at") or now
        total += max(0.0, end - attempt["started_at"])
    return total


def _queue_row(rec: dict[str, Any], now: float) -> dict[str, Any]:
    """A job's row with every field the stand-in fills (the queue drops what was not asked for)."""
    from sky.jobs.state import ManagedJobStatus
    from sky.utils import infra_utils

    status = ManagedJobStatus(rec["status"])
    placement = rec.get("placement") or {}
    details = None
    if rec.get("backoff") and not status.is_terminal():
        details = "In backoff, waiting for resources"
    if rec.get("failure_reason"):
        details = f"{details} - {rec['failure_reason']}" if details else f"Failure: {rec['failure_reason']}"
    row: dict[str, Any] = {
        "job_id": rec["job_id"], "task_id": 0, "job_name": rec["job_name"], "task_name": rec["task_name"],
        "job_duration": _job_duration(rec, now), "workspace": "default", "status": status,
        "schedule_state": rec["schedule_state"], "resources": rec["resources"],
        "recovery_count": rec["recovery_count"], "details": details, "failure_reason": rec["failure_reason"],
        "user_name": rec["user_name"], "user_hash": rec["user_hash"], "submitted_at": rec["submitted_at"],
        "start_at": rec["start_at"], "end_at": rec["end_at"], "last_recovered_at": rec["last_recovered_at"],
        "user_yaml": rec["user_yaml"], "run_timestamp": rec.get("run_timestamp"), "priority": rec["priority"],
        "pool": None, "current_cluster_name": rec["cluster_name"], "is_job_group": False,
        "controller_pid": (rec.get("controller") or {}).get("pid"),
    }
    cloud, region, zone = placement.get("cloud"), placement.get("region"), placement.get("zone")
    if _live_attempt(rec) is not None and placement:  # read from the live cluster's handle
        acc = _accelerators_str(placement.get("accelerators"))
        shown = (f"1x{'[Spot]' if placement.get('use_spot') else ''}"
                 f"({f'gpus={acc}, ' if acc else ''}{placement.get('instance_type')}, ...)")
        row.update(cluster_resources=shown, cluster_resources_full=shown, cloud=cloud, region=region, zone=zone,
                   infra=infra_utils.InfraInfo(cloud, region, zone).formatted_str(),
                   accelerators=placement.get("accelerators"), cluster_name_on_cloud=rec["cluster_name"],
                   internal_external_ips=[("127.0.0.1", "127.0.0.1")])
    else:  # no cluster: the last cached infra, and the requested resources if it ever launched
        cached = rec["resources"] if cloud else None
        row.update(infra=infra_utils.InfraInfo(cloud, region, zone).formatted_str(), cloud=cloud or "-",
                   region=region or "-", zone=zone or "-", cluster_resources=cached or "-",
                   cluster_resources_full=cached or "-")
    return row


def controller_name() -> str:
    """SkyPilot's own name for this user's jobs controller (sky-jobs-controller-<user hash>)."""
    from sky.utils import common

    return common.JOB_CONTROLLER_NAME


def stop_controller(state_dir: Path) -> None:
    """The jobs controller autostops (SkyPilot: 10 idle minutes after its last job): refused while a
    job is in progress, as SkyPilot's autostop waits for them."""
    root = Path(state_dir)
    live = [d.name for d in _job_dirs(root) if not _terminal(_refresh_dead_controller(d))]
    if live:
        raise RuntimeError(f"stand-in: managed jobs {live} are in progress: the controller does not autostop")
    path = root / "clusters" / controller_name() / "meta.json"
    meta = _read_json(path)
    if meta is None:
        raise RuntimeError("stand-in: there is no jobs controller to stop")
    meta["status"] = "STOPPED"
    _write_json(path, meta)


def job_record(state_dir: Path, job_id: int) -> dict[str, Any] | None:
    """A managed job's record on disk (None if there is no such job), for tests: status (the
    ManagedJobStatus value), recovery_count, failure_reason, placement, `attempts` (each: attempt,
    cluster_dir, launched_at, started_at, ended_at, use_spot, accelerators, outcome — succeeded /
    failed / failed_setup / driver_failed / preempted / cancelled / controller_failed — and
    exit_code), task_id_env (SKYPILOT_TASK_ID), and job_duration (the sum of the attempts' run times)."""
    jobdir = _job_dir(Path(state_dir), job_id)
    rec = _refresh_dead_controller(jobdir) if jobdir is not None else None
    if rec is not None:
        rec["job_duration"] = _job_duration(rec, time.time())
    return rec


def preempt_job(state_dir: Path, job_id: int, timeout_s: float = 30.0, spot_gone: bool = False) -> None:
    """Preempt a managed job: its current attempt's instance is lost (every process of the attempt's
    session is SIGKILLed, no signal first). `spot_gone`: spot has no capacity from now on, so the
    recovery lands on the task's next (on-demand) candidate. Waits up to `timeout_s` for an attempt to be running;
    RuntimeError if the job does not exist, has ended, or none runs by then. The job's controller
    notices and recovers it on a fresh cluster."""
    root = Path(state_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        jobdir = _job_dir(root, int(job_id))
        rec = _refresh_dead_controller(jobdir) if jobdir is not None else None
        if rec is None:
            raise RuntimeError(f"stand-in: no managed job {job_id} under {root}")
        if _terminal(rec):
            raise RuntimeError(f"stand-in: managed job {job_id} has ended ({rec['status']}): nothing to preempt")
        attempt = _live_attempt(rec)
        if attempt is not None and attempt.get("pid") and _alive(attempt["pid"], attempt["start"]):
            if spot_gone:
                (jobdir / "no-spot").write_text(f"{time.time()}\n")
            (Path(attempt["cluster_dir"]) / "preempted").write_text(f"{time.time()}\n")  # the cluster is gone
            _kill_session(attempt["pid"], attempt["start"])
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"stand-in: managed job {job_id} has no running attempt to preempt "
                               f"(status {rec['status']})")
        time.sleep(POLL_S)


def shutdown_jobs(state_dir: Path) -> None:
    """Kill every managed job's controller and attempt under `state_dir` (test cleanup; a job left
    unfinished then reads FAILED_CONTROLLER)."""
    for jobdir in _job_dirs(Path(state_dir)):
        rec = _read_json(jobdir / "job.json") or {}
        if rec.get("controller"):
            _kill_session(rec["controller"]["pid"], rec["controller"]["start"])
        attempt = _live_attempt(rec)
        if attempt is not None and attempt.get("pid"):
            _kill_session(attempt["pid"], attempt["start"])


class _Prechecks(Exception):
    """SkyPilot's ProvisionPrechecksError: the job cannot launch at all (FAILED_PRECHECKS)."""

    def __init__(self, reasons: list[BaseException]) -> None:
        super().__init__(reasons)
        self.reasons = reasons


class _Controller:
    """One managed job's controller: a detached process (its own session) that runs the job's
    attempts, each on a fresh cluster directory, recovering from preemptions and user failures."""

    def __init__(self, jobdir: Path) -> None:
        self.dir = jobdir
        self.job_id = int(jobdir.name)
        self.log = (jobdir / "controller.log").open("a", encoding="utf-8", buffering=1)
        self.placement: dict[str, Any] | None = None
        self.current: dict[str, Any] | None = None  # the running attempt

    def say(self, line: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} stand-in controller: {line}\n")

    def user_log(self, line: str) -> None:
        """A line of the job's own log (between attempts only: no attempt is writing then)."""
        with (self.dir / "job.log").open("a", encoding="utf-8") as log:
            log.write(f"stand-in: {line}\n")

    def update(self, mutate: Any = None, **changes: Any) -> dict[str, Any]:
        return _update_job(self.dir, mutate, **changes)

    def cancel_signal(self) -> dict[str, Any] | None:
        if not self.dir.is_dir():  # the state dir was removed under us (a test's tmp dir): nothing to run for
            if self.current is not None:
                _kill_session(self.current["pid"], self.current["start"])
            os._exit(0)
        return _read_json(self.dir / "cancel.json")

    def finish(self, status: str, failure_reason: str | None = None) -> None:
        now = time.time()

        def mutate(rec: dict[str, Any]) -> None:
            attempt = _live_attempt(rec)
            if attempt is not None:
                attempt.setdefault("outcome", status.lower())
                attempt["ended_at"] = now
            if failure_reason is not None:
                rec["failure_reason"] = failure_reason
            rec.update(status=status, end_at=now, schedule_state="DONE", backoff=None, done=True)

        self.update(mutate)
        self.say(f"job {self.job_id} finished: {status}")

    # -- the job's life

    def run(self, payload: dict[str, Any]) -> None:
        from sky import sky_logging
        from sky.skylet import constants as sky_constants
        from sky.utils import common_utils, dag_utils

        self.payload = payload
        self.dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # as the controller loads the job's DAG
        [self.task] = self.dag.tasks
        run_timestamp = sky_logging.get_run_timestamp()
        task_id_env = common_utils.get_global_job_id(run_timestamp, self.dag.name, str(self.job_id), task_id=0,
                                                     is_managed_job=True)
        # Fixed once for the job's life: every attempt (every recovery) gets the same values.
        self.task.update_envs({sky_constants.TASK_ID_ENV_VAR: task_id_env,
                               sky_constants.TASK_ID_LIST_ENV_VAR: task_id_env,
                               sky_constants.MANAGED_JOB_ID_ENV_VAR: str(self.job_id), "SKYPILOT_JOB_RANK": "0"})
        self.task.envs.pop(sky_constants.ROOT_JOB_ID_ENV_VAR, None)
        recovery = list(self.task.resources)[0].job_recovery
        recovery = dict(recovery) if isinstance(recovery, dict) else {"strategy": recovery}
        max_restarts = int(recovery.get("max_restarts_on_errors") or 0)
        codes = recovery.get("recover_on_exit_codes")
        recover_codes = [codes] if isinstance(codes, int) else [int(c) for c in (codes or [])]
        with _locked(self.dir / ".lock"):
            rec = _read_json(self.dir / "job.json")
            if rec["status"] == "CANCELLED":  # cancelled while PENDING
                rec["done"] = True
                _write_json(self.dir / "job.json", rec)
                return
            rec.update(status="STARTING", schedule_state="LAUNCHING", submitted_at=time.time(),
                       run_timestamp=run_timestamp, task_id_env=task_id_env)
            _write_json(self.dir / "job.json", rec)
        self.say(f"job {self.job_id} ({self.dag.name!r}) starting; SKYPILOT_TASK_ID={task_id_env}")
        restarts = 0
        while True:
            started = self.launch_attempt()
            if started is None:  # cancelled, or it cannot launch at all: the job has ended
                return
            proc, attempt = started
            outcome, code = self.watch(proc, attempt)
            if outcome == "cancelled":
                return
            if outcome == "succeeded":
                self.finish("SUCCEEDED")
                return
            if outcome == "preempted":
                self.recover(f"the job cluster of attempt {attempt['attempt']} was preempted; recovering the job "
                             "on a fresh cluster")
                continue
            # The user's program failed (run or setup exited non-zero, or its driver died).
            exit_codes = [code] if code is not None else None
            matching = [c for c in exit_codes or [] if c in recover_codes]
            if matching:
                self.recover(f"exit code(s) {matching} matched recover_on_exit_codes {recover_codes}; restarting "
                             "the job on a fresh cluster")
                continue
            restarts += 1
            if restarts <= max_restarts:
                desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
                self.recover(f"{desc}. Restarting the job (restart {restarts} of {max_restarts} on errors) on a "
                             "fresh cluster")
                continue
            details = f"To see the details, run: sky jobs logs --controller {self.job_id}"
            if outcome == "driver_failed":
                details = ("The job driver on the remote cluster failed. This can be caused by the job taking too "
                           "much memory or other resources. Try adding more memory, CPU, or disk in your job "
                           f"definition. {details}")
            desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
            self.finish("FAILED_SETUP" if outcome == "failed_setup" else "FAILED",
                        f"{desc} (user program failure). {details}")
            return

    def recover(self, why: str) -> None:
        self.user_log(why)
        self.say(why)
        self.update(status="RECOVERING", schedule_state="LAUNCHING")

    def launch_attempt(self) -> tuple[subprocess.Popen[bytes], dict[str, Any]] | None:
        """Launch the next attempt on a fresh cluster, retrying (forever, as SkyPilot's first launch
        does) what may succeed later; None if the job ended instead (cancelled, FAILED_PRECHECKS)."""
        from sky import exceptions, execution
        from sky.utils import common_utils

        while True:
            signal_ = self.cancel_signal()
            if signal_ is not None:
                self.update(status="CANCELLING")
                self.finish("CANCELLED")
                return None
            try:
                execution._resolve_managed_secrets(self.dag)  # noqa: SLF001 - what the controller's launch does
                if self.payload["capacity"]:
                    wanted = _accelerators_str(self._candidates()[0].accelerators) or "CPU"
                    raise exceptions.ResourcesUnavailableError(
                        f"Failed to acquire resources ({wanted}) in every zone of {PLACEMENT['cloud']}.",
                        failover_history=[exceptions.ResourcesUnavailableError("stand-in: no capacity")])
                if self.placement is None:
                    self.placement = self.optimize()
                elif self.placement["use_spot"] and (self.dir / "no-spot").exists():
                    # Spot has no capacity now: SkyPilot's recovery relaunches the task's resources
                    # in their order, and the next candidate (on-demand) is what launches.
                    self.placement = self.optimize(on_demand_only=True)
            except _Prechecks as err:
                reason = "; ".join(common_utils.format_exception(r, use_bracket=True) for r in err.reasons)
                self.say(f"Provision prechecks failed: {reason}")
                self.finish("FAILED_PRECHECKS", reason)
                return None
            except Exception as err:  # noqa: BLE001 - SkyPilot retries the launch after any other failure
                self.say(f"Failed to launch a cluster with error: {common_utils.format_exception(err)}; retrying "
                         f"in {CAPACITY_RETRY_S:.0f}s")
                self.update(schedule_state="ALIVE_BACKOFF", backoff=common_utils.format_exception(err))
                deadline = time.monotonic() + CAPACITY_RETRY_S
                while time.monotonic() < deadline and self.cancel_signal() is None:
                    time.sleep(JOBS_CANCEL_POLL_S)
                continue
            return self.start_attempt()

    def _candidates(self) -> list[Any]:
        return list(self.task.resources)

    def optimize(self, on_demand_only: bool = False) -> dict[str, Any]:
        """Where the attempts run: SkyPilot's optimizer's pick among the candidates (an `ordered`
        list in order, `any_of` the cheapest), from the session's API server as plain launches;
        `on_demand_only`: among those that are not spot (spot has no capacity)."""
        from sky import exceptions
        from sky.utils import dag_utils

        [task] = dag_utils.load_dag_from_yaml_str(self.payload["dag_yaml"]).tasks  # a fresh copy
        # The controller strips job_recovery before launching (StrategyExecutor.make).
        kept = [r.copy(job_recovery=None) for r in task.resources if not (on_demand_only and r.use_spot)]
        if not kept:
            raise exceptions.ResourcesUnavailableError(
                "Failed to acquire resources: spot has no capacity and the task has no on-demand candidate.",
                failover_history=[exceptions.ResourcesUnavailableError("stand-in: no spot capacity")])
        task.set_resources(type(task.resources)(kept))
        try:
            pick = _optimizer_pick(task)
        except exceptions.ResourcesUnavailableError as err:
            if not any(isinstance(e, exceptions.ResourcesUnavailableError) for e in err.failover_history):
                raise _Prechecks(list(err.failover_history) or [err]) from err
            raise
        except (exceptions.InvalidClusterNameError, exceptions.NoCloudAccessError,
                exceptions.ResourcesMismatchError) as err:
            raise _Prechecks([err]) from err
        candidates = [r for r in self._candidates() if not (on_demand_only and r.use_spot)]
        chosen = next((r for r in candidates if bool(r.use_spot) == pick.use_spot
                       and _accelerators_str(dict(r.accelerators) if r.accelerators else None) == pick.accelerators),
                      None) or next((r for r in candidates if bool(r.use_spot) == pick.use_spot), candidates[0])
        placement = {"cloud": pick.cloud, "region": pick.region, "zone": None, "instance_type": pick.instance_type,
                     "use_spot": bool(chosen.use_spot),
                     "accelerators": dict(chosen.accelerators) if chosen.accelerators else None}
        self.say(f"optimizer's pick: {placement}")
        return placement

    def start_attempt(self) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        assert self.placement is not None
        rec = _read_json(self.dir / "job.json")
        number = len(rec["attempts"]) + 1
        cdir = self.dir / "attempts" / str(number)
        cdir.mkdir(parents=True)
        launched_at = time.time()
        shutil.copytree(self.payload["app_dir"], cdir / "app", symlinks=True)
        (cdir / "home").mkdir()
        cluster = rec["cluster_name"]
        info = {"cluster_name": cluster, "cloud": self.placement["cloud"], "region": self.placement["region"],
                "zone": self.placement["zone"]}
        proc = _spawn_job(self.task, cdir, self.placement["accelerators"], self.payload["cluster_env"],
                          has_setup=bool(self.task.setup), log_path=self.dir / "job.log", append=True,
                          extra_env={"SKYPILOT_CLUSTER_INFO": json.dumps(info)})
        now = time.time()
        attempt = {"attempt": number, "cluster_dir": str(cdir), "cluster_name": cluster, "launched_at": launched_at,
                   "started_at": now, "ended_at": None, "pid": proc.pid, "start": _start_time(proc.pid),
                   "use_spot": self.placement["use_spot"], "accelerators": self.placement["accelerators"]}

        def mutate(rec: dict[str, Any]) -> None:
            if rec["status"] == "RECOVERING":
                rec["recovery_count"] += 1  # counted once the job is running again, as SkyPilot counts it
            if rec["start_at"] is None:
                rec["start_at"] = now
            rec["attempts"].append(attempt)
            rec.update(status="RUNNING", last_recovered_at=now, schedule_state="ALIVE", backoff=None,
                       placement=self.placement)

        self.current = attempt
        self.update(mutate)
        self.say(f"attempt {number} running on a fresh cluster {cdir}")
        return proc, attempt

    def watch(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any]) -> tuple[str, int | None]:
        """Until the attempt's job ends or a cancel arrives: (outcome, exit code)."""
        next_check = 0.0
        while True:
            if time.monotonic() >= next_check:
                signal_ = self.cancel_signal()
                if signal_ is not None:
                    self.cancel(proc, attempt, signal_)
                    return "cancelled", None
                next_check = time.monotonic() + JOBS_CANCEL_POLL_S
            if proc.poll() is not None:
                break
            time.sleep(POLL_S)
        cdir = Path(attempt["cluster_dir"])
        done = _read_json(cdir / "job.exit")
        if done is not None:
            code = int(done["exit"])
            outcome = "succeeded" if code == 0 and not done["setup_failed"] else (
                "failed_setup" if done["setup_failed"] else "failed")
        elif (cdir / "preempted").exists():
            outcome, code = "preempted", None
        else:  # killed without a word: SkyPilot's FAILED_DRIVER
            outcome, code = "driver_failed", None
        self.end_attempt(proc, attempt, outcome, code)
        return outcome, code

    def end_attempt(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any], outcome: str,
                    code: int | None) -> None:
        """The attempt's cluster is torn down: whatever still runs there dies with it, its disk goes."""
        _kill_session(proc.pid, attempt["start"])
        proc.wait()
        self.current = None
        now = time.time()

        def mutate(rec: dict[str, Any]) -> None:
            rec["attempts"][attempt["attempt"] - 1].update(ended_at=now, outcome=outcome, exit_code=code)

        self.update(mutate)
        cdir = Path(attempt["cluster_dir"])
        for disk in ("home", "app"):
            shutil.rmtree(cdir / disk, ignore_errors=True)
        self.say(f"attempt {attempt['attempt']} ended: {outcome} (exit code {code}); its cluster is torn down")

    def cancel(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any], signal_: dict[str, Any]) -> None:
        """Non-graceful: the cluster is torn down with the job on it (no signal first). Graceful: SIGTERM
        to every process of the job's session, then up to graceful_timeout (30 s) for it to exit."""
        self.update(status="CANCELLING")
        self.say(f"cancelling job {self.job_id} (graceful={signal_.get('graceful')})")
        if signal_.get("graceful") and proc.poll() is None:
            _term_session(proc.pid)
            timeout = signal_.get("graceful_timeout")
            deadline = time.monotonic() + (GRACEFUL_CANCEL_TIMEOUT_S if timeout is None else float(timeout))
            while _session_alive(proc.pid) and time.monotonic() < deadline:
                proc.poll()
                time.sleep(POLL_S)
        self.end_attempt(proc, attempt, "cancelled", None)
        self.finish("CANCELLED")


def _session_alive(sid: int) -> bool:
    """Whether any live (non-zombie) process is still in session `sid`."""
    for entry in os.listdir("/proc"):
        stat = _proc_stat(int(entry)) if entry.isdigit() else None
        if stat and stat[3] == str(sid) and stat[0] != "Z":
            return True
    return False


def run_controller(jobdir: Path, data: bytes | None = None) -> None:
    """The job controller's entry point: the job's DAG (secrets and all) arrives on stdin (or from the executor)."""
    payload = pickle.loads(sys.stdin.buffer.read() if data is None else data)
    controller = _Controller(jobdir)
    try:
        controller.run(payload)
    except BaseException:  # noqa: BLE001 - a crashed controller fails its job, as SkyPilot's does
        import traceback

        controller.say(traceback.format_exc())
        rec = _read_json(jobdir / "job.json") or {}
        attempt = _live_attempt(rec)
        if attempt is not None and attempt.get("pid"):
            _kill_session(attempt["pid"], attempt["start"])
        if not _terminal(rec):
            controller.finish("FAILED_CONTROLLER", "Controller process has exited abnormally (stand-in: see "
                                                   f"{jobdir / 'controller.log'}). For more details, run: "
                                                   f"sky jobs logs --controller {jobdir.name}")
        raise


# ---------------------------------------------------------------- the executor: workers forked from a warm process

EXECUTOR_IDLE_S = 120.0
"""An executor with no request for this long (or whose directory is gone) exits."""
EXECUTOR_START_S = 15.0
"""How long a client waits for a new executor to claim its socket before it runs a fresh interpreter."""
EXECUTOR_ANSWER_S = 120.0
"""How long a client waits for the pid of its child: an executor still importing SkyPilot answers
once it has (seconds under load)."""
_EXECUTOR_IMPORTS = ("sky", "sky.jobs", "sky.execution", "sky.exceptions", "sky.task", "sky.sky_logging",
                     "sky.jobs.state", "sky.jobs.utils", "sky.jobs.client.sdk", "sky.client.sdk",
                     "sky.server.requests.payloads", "sky.schemas.api.responses", "sky.skylet.constants",
                     "sky.utils.dag_utils", "sky.utils.common_utils", "sky.utils.status_lib",
                     "sky.utils.cluster_utils", "sky.utils.yaml_utils")
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
                raise RuntimeError(f"stand-in: the executor of {home} took a {header['role']} call and did not "
                                   f"answer in {EXECUTOR_ANSWER_S:.0f} s") from exc
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
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "executor", str(home)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=home,
                         start_new_session=True)


def _spawn(root: Path, role: str, path: Path, cwd: Path, out: Path,
           data: bytes) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Start `sky_standin.py ROLE PATH` detached (a session of its own), stdout and stderr
    appended to `out`, `data` its payload: forked from the state dir's executor, which has
    SkyPilot imported already (as the API server's executor processes have), else a fresh
    interpreter with the payload on its stdin. Its pid, and the Popen when we are its parent."""
    header = {"role": role, "path": str(path), "cwd": str(cwd), "out": str(out), "env": dict(os.environ)}
    pid = _executor_call(root, header, data)
    if pid is not None:
        return pid, None
    with out.open("ab") as sink:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), role, str(path)],
                                stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)
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
        sys.argv = [str(Path(__file__).resolve()), header["role"], str(path)]
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


# ---------------------------------------------------------------- running the real launcher against it

def install_from_env() -> StrictSky | None:
    """With PREFLIGHT_TEST_SKY_STATE set, make the launcher's `sky_module()` return a StrictSky.

    PREFLIGHT_TEST_SKY_APP: the directory standing for the image's /app.
    PREFLIGHT_TEST_SKY_NO_CLOUD=1 / PREFLIGHT_TEST_SKY_CAPACITY=1 / PREFLIGHT_TEST_SKY_CREDENTIALS=1:
    launches fail as with no cloud enabled / no capacity / refused credentials.
    PREFLIGHT_TEST_SKY_PENDING_S / PREFLIGHT_TEST_SKY_CONTROLLER_UP_S: seconds a launch request
    waits queued / the jobs controller takes to come up (StrictSky's pending_s, controller_up_s). PREFLIGHT_TEST_SKY_CLUSTER_ENV: a JSON object, the
    cloud machine's own environment (see StrictSky)."""
    state = os.environ.get("PREFLIGHT_TEST_SKY_STATE")
    if not state:
        return None
    fake = StrictSky(Path(state), Path(os.environ["PREFLIGHT_TEST_SKY_APP"]),
                     no_cloud=os.environ.get("PREFLIGHT_TEST_SKY_NO_CLOUD") == "1",
                     capacity=os.environ.get("PREFLIGHT_TEST_SKY_CAPACITY") == "1",
                     credentials=os.environ.get("PREFLIGHT_TEST_SKY_CREDENTIALS") == "1",
                     pending_s=float(os.environ.get("PREFLIGHT_TEST_SKY_PENDING_S") or 0),
                     controller_up_s=float(os.environ.get("PREFLIGHT_TEST_SKY_CONTROLLER_UP_S") or 0),
                     cluster_env=json.loads(os.environ.get("PREFLIGHT_TEST_SKY_CLUSTER_ENV") or "{}"))
    import launcher.backends.sky as backend_module
    import launcher.backends.skytask as skytask_module

    skytask_module.sky_module = lambda: fake  # type: ignore[assignment]
    backend_module.sky_module = lambda: fake  # type: ignore[assignment]
    return fake


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve-request"] and len(argv) == 2:
        serve_request(Path(argv[1]))
        return 0
    if argv[:1] == ["job-controller"] and len(argv) == 2:
        run_controller(Path(argv[1]))
        return 0
    if argv[:1] == ["executor"] and len(argv) == 2:
        run_executor(Path(argv[1]))
        return 0
    if argv[:1] == ["preempt"] and len(argv) == 3:
        preempt_job(Path(argv[1]), int(argv[2]))
        return 0
    if argv[:1] == ["launcher"]:
        install_from_env()
        from launcher.entry import main as launcher_main

        return launcher_main(argv[1:])
    print("usage: sky_standin.py serve-request <request dir> | job-controller <job dir> | executor <state dir> | "
          "preempt <state dir> <job id> | launcher <args...>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


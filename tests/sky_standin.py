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

What it cannot emulate, and so refuses (NotImplementedError) rather than fake:
more than one node, several candidate resources, `workdir` / `file_mounts` /
storage or volume mounts, `resize`, SkyPilot's internal `_...` launch arguments,
streaming a server-side `log_path`, `tail_logs(preload_content=False)`.
What it does not do (stricter than SkyPilot, or simply absent): it never reuses
a cluster (launching onto an existing name is a RuntimeError: every leg gets a
fresh one); autostop/autodown is recorded but never fires (only `down` ends a
cluster); resources are not checked against SkyPilot's catalogs (that needs
the network; `launcher.skytask` checks accelerator names itself); there are no
prices (`cost_report` has no `total_cost`); there is one job per cluster (id 1).
`api_cancel` kills a request's worker: a cancelled launch that had already
claimed its cluster leaves it behind (INIT, or UP with its job running if the
job had started), as a real cancelled launch can — `down` removes it.
Process bookkeeping reads /proc: Linux only.

Run as a script: `python tests/sky_standin.py serve-request <dir>` is the worker;
`python -m tests.sky_standin launcher <args...>` runs the real launcher CLI with
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
# Where the stand-in says its clusters are (the launcher pins later legs to leg 0's placement).
PLACEMENT = {"cloud": "GCP", "region": "us-central1", "zone": None, "instance_type": "standin-n1"}
# What a fresh cloud machine's job inherits from "the machine": nothing else of the caller's.
MACHINE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
CAPACITY_RETRY_S = 5.0
POLL_S = 0.05
# Launch arguments the real client forwards but this stand-in cannot honour.
_UNEMULATED_LAUNCH_ARGS = ("clone_disk_from", "resize", "_need_confirmation", "_is_launched_by_jobs_controller",
                           "_is_launched_by_sky_serve_controller", "_disable_controller_check",
                           "_file_mounts_blob_id", "_extra_launch_context", "_include_credentials")
_SDK_CALLS = ("launch", "down", "status", "cancel", "tail_logs", "stream_and_get", "get", "api_cancel",
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


def _job_status(cdir: Path) -> tuple[bool, int]:
    """(ended, JobExitCode) of a cluster's job, from its files and its processes."""
    if (cdir / "job.cancelled").exists():
        return True, JOB_CANCELLED
    done = _read_json(cdir / "job.exit")
    if done is not None:
        return True, JOB_FAILED if done["setup_failed"] or done["exit"] != 0 else JOB_SUCCEEDED
    job = _read_json(cdir / "job.json")
    if job is None:
        return False, JOB_NOT_FINISHED
    if _alive(job["pgid"], job["start"]):
        return False, JOB_NOT_FINISHED
    done = _read_json(cdir / "job.exit")  # it may have just finished
    if done is not None:
        return True, JOB_FAILED if done["setup_failed"] or done["exit"] != 0 else JOB_SUCCEEDED
    return True, JOB_FAILED  # killed without a word: SkyPilot's FAILED_DRIVER


# ---------------------------------------------------------------- the client

class StrictSky:
    """The `sky` module as the sky backend uses it, against local "clusters"."""

    def __init__(self, state_dir: Path, app_dir: Path, *, no_cloud: bool = False, capacity: bool = False,
                 cluster_env: dict[str, str] | None = None) -> None:
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
        self.cluster_env = dict(cluster_env or {})
        self._state = _State(self.state_dir)
        self._workers: dict[str, subprocess.Popen[bytes]] = {}
        self._real_requests: set[str] = set()

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

    def _submit(self, kind: str, cluster: str | None, args: dict[str, Any], secret_payload: Any = None) -> str:
        """Hand a request to a detached worker; its id. `secret_payload` goes over a
        pipe, never to disk (the task carries secret values)."""
        rid = str(uuid.uuid4())
        rdir = self._state.requests / rid
        rdir.mkdir()
        _write_json(rdir / "request.json", {"id": rid, "kind": kind, "cluster": cluster, "args": args,
                                             "submitted_at": time.time(), "client_pid": os.getpid()})
        (rdir / "request.log").touch()
        with (rdir / "worker.out").open("wb") as out:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve-request", str(rdir)],
                                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self._state.root, start_new_session=True)
        _write_json(rdir / "worker.json", {"pid": proc.pid, "start": _start_time(proc.pid)})
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # a worker that died at once says so in get()
            proc.stdin.write(pickle.dumps(secret_payload))
            proc.stdin.close()
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
            return self._real.stream_and_get(a["request_id"], output_stream=a["output_stream"])
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
                        "capacity": self.capacity, "app_dir": str(self.app_dir.resolve())}
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
        if task.num_nodes > 1:
            raise NotImplementedError(f"stand-in: num_nodes={task.num_nodes}: more than one node is not emulated")
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
        has_setup = bool(task.setup) and not self.req["args"]["no_setup"]
        if has_setup:
            (cdir / "setup.sh").write_text(str(task.setup))
        (cdir / "run.sh").write_text(str(task.run or ""))
        (cdir / "job.sh").write_text(_job_script(cdir, has_setup))
        env = {k: os.environ[k] for k in MACHINE_ENV if k in os.environ}
        env.update(cluster_env)
        env.update({k: str(v) for k, v in (task.envs or {}).items()})
        env.update({k: v.get_secret_value() for k, v in (task.secrets or {}).items()})
        env.update({"HOME": str(cdir / "home"), "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0",
                    "SKYPILOT_NODE_IPS": "127.0.0.1", "SKYPILOT_NUM_GPUS_PER_NODE": str(_gpus_per_node(accelerators)),
                    "LAUNCHER_APP_DIR": str(cdir / "app")})
        env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
        with (cdir / "job.log").open("wb") as log:
            proc = subprocess.Popen(["bash", str(cdir / "job.sh")], cwd=cdir / "home", env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        _write_json(cdir / "job.json", {"pgid": proc.pid, "start": _start_time(proc.pid), "started_at": time.time()})

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
                _kill_session(job["pgid"], job["start"])
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
        _kill_session(job["pgid"], job["start"])
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
            handle = SimpleNamespace(
                cluster_name=name, cluster_name_on_cloud=name, head_ip="127.0.0.1", launched_nodes=meta["num_nodes"],
                launched_resources=SimpleNamespace(**_placement_of(meta), use_spot=meta["use_spot"],
                                                   accelerators=meta["accelerators"])) if up else None
            records.append(StatusResponse(
                name=name, launched_at=meta["launched_at"], handle=handle,
                status=status_lib.ClusterStatus.UP if up else status_lib.ClusterStatus.INIT,
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


def optimizer_placement(task: Any) -> dict[str, Any]:
    """Where a real launch of this task would land: the pick of SkyPilot's own optimizer
    (the API server the test session runs, on the vendored catalog), read from its table
    as the launcher reads it. A launch SkyPilot could not plan fails here as it would for
    real (no catalog: CloudError; no cloud: NoCloudAccessError)."""
    import io

    import sky as real_sky

    from launcher.backends.sky import parse_optimizer_table

    dag = real_sky.Dag()
    dag.add(task)
    table = io.StringIO()
    real_sky.stream_and_get(real_sky.optimize(dag), output_stream=table)
    pick = parse_optimizer_table(table.getvalue(), int(task.num_nodes or 1))
    return {"cloud": pick.cloud, "region": pick.region, "zone": None, "instance_type": pick.instance_type}


def _placement_of(meta: dict[str, Any]) -> dict[str, Any]:
    handle = meta.get("handle") or {}
    return {k: handle.get(k, PLACEMENT[k]) for k in PLACEMENT}


def serve_request(rdir: Path) -> None:
    """The worker's entry point: the request's secret payload arrives on stdin."""
    payload = pickle.loads(sys.stdin.buffer.read())
    _Worker(rdir).serve(payload)


# ---------------------------------------------------------------- running the real launcher against it

def install_from_env() -> StrictSky | None:
    """With PREFLIGHT_TEST_SKY_STATE set, make the launcher's `sky_module()` return a StrictSky.

    PREFLIGHT_TEST_SKY_APP: the directory standing for the image's /app.
    PREFLIGHT_TEST_SKY_NO_CLOUD=1 / PREFLIGHT_TEST_SKY_CAPACITY=1: launches fail as with no
    cloud enabled / no capacity. PREFLIGHT_TEST_SKY_CLUSTER_ENV: a JSON object, the
    cloud machine's own environment (see StrictSky)."""
    state = os.environ.get("PREFLIGHT_TEST_SKY_STATE")
    if not state:
        return None
    fake = StrictSky(Path(state), Path(os.environ["PREFLIGHT_TEST_SKY_APP"]),
                     no_cloud=os.environ.get("PREFLIGHT_TEST_SKY_NO_CLOUD") == "1",
                     capacity=os.environ.get("PREFLIGHT_TEST_SKY_CAPACITY") == "1",
                     cluster_env=json.loads(os.environ.get("PREFLIGHT_TEST_SKY_CLUSTER_ENV") or "{}"))
    import launcher.backends.sky as backend_module
    import launcher.skytask as skytask_module

    skytask_module.sky_module = lambda: fake  # type: ignore[assignment]
    backend_module.sky_module = lambda: fake  # type: ignore[assignment]
    return fake


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve-request"] and len(argv) == 2:
        serve_request(Path(argv[1]))
        return 0
    if argv[:1] == ["launcher"]:
        install_from_env()
        from launcher.entry import main as launcher_main

        return launcher_main(argv[1:])
    print("usage: sky_standin.py serve-request <request dir> | launcher <args...>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


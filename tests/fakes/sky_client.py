"""`StrictSky`: the `sky` module (SkyPilot 0.14.1's client SDK) as the sky backend uses it, against
local "clusters" (the rules it keeps: sky_standin.py's docstring). Each SDK function is bound against
the real one's signature; the calls that are requests go to a detached worker (sky_requests.py,
sky_clusters.py); `fake.jobs` is managed jobs (sky_jobs.py).
"""

from __future__ import annotations

import codecs
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.fakes.sky_executor import _ensure_executor
from tests.fakes.sky_jobs import _StrictJobs
from tests.fakes.sky_proc import (
    JOB_ID,
    JOB_NOT_FINISHED,
    JOB_NOT_FOUND,
    POLL_S,
    _append_jsonl,
    _job_status,
    _read_json,
    _State,
)
from tests.fakes.sky_requests import _Requests

# Launch arguments the real client forwards but this stand-in cannot honour.
_UNEMULATED_LAUNCH_ARGS = (
    "clone_disk_from",
    "resize",
    "_need_confirmation",
    "_is_launched_by_jobs_controller",
    "_is_launched_by_sky_serve_controller",
    "_disable_controller_check",
    "_file_mounts_blob_id",
    "_extra_launch_context",
    "_include_credentials",
)
_SDK_CALLS = (
    "launch",
    "down",
    "status",
    "cancel",
    "tail_logs",
    "stream_and_get",
    "get",
    "api_cancel",
    "api_status",
    "cost_report",
)


class StrictSky(_Requests):
    """The `sky` module as the sky backend uses it, against local "clusters"."""

    def __init__(
        self,
        state_dir: Path,
        app_dir: Path,
        *,
        no_cloud: bool = False,
        capacity: bool = False,
        credentials: bool = False,
        cluster_env: dict[str, str] | None = None,
        pending_s: float = 0.0,
        controller_up_s: float = 0.0,
    ) -> None:
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

    # -- the SDK calls that are requests

    def launch(self, *args: Any, **kwargs: Any) -> str:
        """Serialize the task as the real client does; a request id for the launch."""
        a = self._bind("launch", args, kwargs)
        from sky.utils import cluster_utils, dag_utils

        sig = inspect.signature(self._real.launch)
        for name in _UNEMULATED_LAUNCH_ARGS:
            if a[name] != sig.parameters[name].default:
                if name == "clone_disk_from":  # the real client's own refusal
                    raise NotImplementedError(
                        "clone_disk_from is not implemented yet. Please contact the "
                        "SkyPilot team if you need this feature at slack.skypilot.co."
                    )
                raise NotImplementedError(f"stand-in: launch({name}=...) is not emulated")
        cluster = a["cluster_name"] or cluster_utils.generate_cluster_name()
        self._record("launch", cluster)
        dag = dag_utils.convert_entrypoint_to_dag(a["task"])  # a deep copy, as the real client makes
        for task in dag.tasks:
            for resource in task.resources:  # launch's flags override the task's autostop, as for real
                resource.override_autostop_config(
                    down=a["down"], idle_minutes=a["idle_minutes_to_autostop"], wait_for=a["wait_for"]
                )
            # The client-side half of sky.validate, then the server's checks that need no network.
            task.expand_and_validate_workdir()
            task.expand_and_validate_file_mounts()
            task.validate_name()
            task.validate_run()
            if task.workdir or task.file_mounts or task.storage_mounts or task.volumes:
                raise NotImplementedError(
                    "stand-in: workdir, file_mounts, storage and volume mounts are not "
                    "emulated (nothing would be uploaded)"
                )
        dag_yaml = dag_utils.dump_dag_to_yaml_str(dag)
        args_on_disk = {
            "cluster_name": cluster,
            "retry_until_up": a["retry_until_up"],
            "dryrun": a["dryrun"],
            "no_setup": a["no_setup"],
            "down": a["down"],
            "idle_minutes_to_autostop": a["idle_minutes_to_autostop"],
            "backend": getattr(a["backend"], "NAME", None),
            "fast": a["fast"],
            "optimize_target": str(a["optimize_target"]),
            "no_cloud": self.no_cloud,
            "capacity": self.capacity,
            "credentials": self.credentials,
            "pending_s": self.pending_s,
            "app_dir": str(self.app_dir.resolve()),
        }
        return self._submit(
            "launch", cluster, args_on_disk, secret_payload={"dag_yaml": dag_yaml, "cluster_env": self.cluster_env}
        )

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
                cluster_status=self.ClusterStatus.INIT,
            )
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        if a["job_id"] not in (None, JOB_ID):
            out.write(f"Job {a['job_id']} not found.\n")
            return JOB_NOT_FOUND
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with (cdir / "job.log").open("rb") as log:
            if a["tail"] > 0:
                lines = decoder.decode(log.read()).splitlines(keepends=True)
                out.write("".join(lines[-a["tail"] :]))
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
                        255, "tail_logs", f"Cluster {name!r} was terminated while its logs were streamed."
                    )
                time.sleep(POLL_S)

"""A RECORDING STAND-IN for the `sky` module — not SkyPilot, and no cloud.

No cloud is reachable from the build machine, so the sky backend's SDK calls
are tested against this: it behaves like SkyPilot 0.14's request-id API
(`launch`/`down` return request ids that `stream_and_get` resolves,
`tail_logs` streams a job's output and returns a JobExitCode) and records
every call. Its "clusters" run the task's trainer locally, in a fresh temp dir
per cluster, with the task's envs: so legs really resume from the store.
`Task` is the real `sky.Task` (its YAML parser is SkyPilot's own).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import sky as real_sky

JOB_FAILED = 100  # what SkyPilot's JobExitCode reports for a failed job: never the trainer's own code


class NoCloudAccessError(Exception):
    """Named like SkyPilot's own exception for "no cloud is enabled"."""


class RecordingSky:
    Task = real_sky.Task

    def __init__(self, trainer: Path, *, fail_setup: bool = False, job_exit: int = JOB_FAILED,
                 no_cloud: bool = False) -> None:
        self.trainer = trainer
        self.fail_setup = fail_setup
        self.no_cloud = no_cloud
        self.job_exit = job_exit
        self.calls: list[tuple[str, str]] = []
        self._requests: dict[str, tuple[str, Any, str]] = {}
        self._clusters: dict[str, Path] = {}
        self._tasks: dict[str, Any] = {}
        self._running: dict[str, subprocess.Popen[str]] = {}

    def _request(self, kind: str, task: Any, cluster: str) -> str:
        rid = f"req-{len(self._requests) + 1}-{kind}"
        self._requests[rid] = (kind, task, cluster)
        return rid

    def launch(self, task: Any, cluster_name: str, **_: Any) -> str:
        self.calls.append(("launch", cluster_name))
        return self._request("launch", task, cluster_name)

    def down(self, cluster_name: str, **_: Any) -> str:
        self.calls.append(("down", cluster_name))
        return self._request("down", None, cluster_name)

    def stream_and_get(self, request_id: str, output_stream: Any = None, **_: Any) -> Any:
        kind, task, cluster = self._requests[request_id]
        self.calls.append(("stream_and_get", f"{kind}:{cluster}"))
        write = output_stream.write if output_stream is not None else (lambda _t: None)
        if kind == "launch":
            if self.no_cloud:
                raise NoCloudAccessError("No cloud access available for launching (stand-in)")
            if cluster in self._clusters:
                raise RuntimeError(f"stand-in: cluster {cluster} reused: a leg must get a fresh one")
            disk = Path(tempfile.mkdtemp(prefix=f"standin-{cluster}-"))
            self._clusters[cluster] = disk
            write(f"stand-in: provisioning {cluster} {task.resources}\n")
            if self.fail_setup:
                write("stand-in: setup failed: exit code 1\n")
                raise RuntimeError("Failed to run setup command (stand-in)")
            shutil.copyfile(self.trainer, disk / "train.py")
            self._tasks[cluster] = task
            return 1, object()
        proc = self._running.pop(cluster, None)
        if proc is not None:
            proc.kill()
        disk = self._clusters.get(cluster)
        if disk is not None:
            shutil.rmtree(disk, ignore_errors=True)  # the instance and its disk are gone
        write(f"stand-in: terminated {cluster}\n")
        return None

    def tail_logs(self, cluster_name: str, job_id: int, follow: bool, output_stream: Any = None, **_: Any) -> int:
        self.calls.append(("tail_logs", cluster_name))
        task = self._tasks[cluster_name]
        # SkyPilot hands a job its task's envs and its secrets' values alike.
        secrets = {k: v.get_secret_value() if hasattr(v, "get_secret_value") else str(v)
                   for k, v in (getattr(task, "secrets", None) or {}).items() if v is not None}
        env = {**os.environ, **{k: str(v) for k, v in task.envs.items()}, **secrets}
        args = shlex.split(task.envs["LAUNCHER_TRAIN_ARGS"])
        proc = subprocess.Popen([sys.executable, *args], cwd=self._clusters[cluster_name], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._running[cluster_name] = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            if output_stream is not None:
                output_stream.write(line)
        proc.wait()
        self._running.pop(cluster_name, None)
        return self.job_exit

    def clusters_of(self, call: str) -> list[str]:
        return [c for name, c in self.calls if name == call]

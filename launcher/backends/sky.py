"""SkyPilot backend: a fresh cluster per leg, on SkyPilot's Python SDK (0.14 API).

Each leg: render + validate its task YAML, `sky.launch` on a new cluster name
(so the disk is empty), stream the launch and then the job's logs into the host
log, and `sky.down` in a `finally` — a failed setup does not tear itself down.
`kill` = `sky.down` of that leg's cluster. The leg's exit code comes from the
runtime's own events (`done` / `stop`), not from `tail_logs`, which returns
SkyPilot's JobExitCode. Billed time runs from the launch request to teardown
confirmed, rounded up to the provider's billing granularity.

The `sky` module is imported lazily (and can be injected: the tests use a
recording stand-in, as no cloud is reachable from the build machine).
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from launcher.backends.base import LegHandle, LegResult, LegSpec, LineSink
from launcher.config import Config
from launcher.errors import BadInput
from launcher.evidence import LegEvents, exit_code_from_events
from launcher.skytask import RenderedTask, render, sky_module

BILLING_GRANULARITY_S = 60  # per-second billing with a one-minute minimum (AWS, GCP, Azure)
# SkyPilot's errors for "could not even ask a cloud": nothing was provisioned, nothing is billed.
NOT_LAUNCHED = ("NoCloudAccessError", "ResourcesUnavailableError", "ApiServerConnectionError",
                "CloudUserIdentityError", "NotSupportedError", "CatalogError")


def cluster_name(spec: LegSpec) -> str:
    """A new, valid cluster name per leg (lowercase, starts with a letter, <= 35 chars)."""
    tail = re.sub(r"[^a-z0-9-]", "-", spec.run_id.lower())[-24:].strip("-")
    return f"pf-{tail}-l{spec.leg}"[:35]


class LineWriter:
    """A text stream SkyPilot writes logs to: each whole line goes to the log and the live view."""

    def __init__(self, log: IO[str], on_line: LineSink | None) -> None:
        self.log, self.on_line, self._buf = log, on_line, ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.log.write(line + "\n")
            self.log.flush()
            if self.on_line:
                self.on_line(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()


@dataclass
class _SkyHandle(LegHandle):
    task: RenderedTask | None = None
    thread: threading.Thread | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    killed: str | None = None


class SkyBackend:
    """Legs as fresh SkyPilot clusters running the pinned image."""

    name = "sky"
    billing_granularity_s = BILLING_GRANULARITY_S

    def __init__(self, cfg: Config, image_ref: str, nodes: int = 1, sky: Any = None) -> None:
        self.cfg, self.image_ref, self.nodes = cfg, image_ref, nodes
        self.sky = sky or sky_module()

    def launch(self, spec: LegSpec, on_line: LineSink | None = None) -> LegHandle:
        task = render(self.cfg, spec.rung, gpus=spec.gpus, nodes=self.nodes, image_ref=self.image_ref,
                      leg_env=dict(spec.env), out=spec.log_path.with_suffix(".sky.yaml"))
        cluster = cluster_name(spec)
        handle = _SkyHandle(spec, cluster, time.time(), ("sky", "launch", "-c", cluster, str(task.path)), task=task)
        handle.thread = threading.Thread(target=self._run, args=(handle, on_line), daemon=True)
        handle.thread.start()
        return handle

    def _run(self, handle: _SkyHandle, on_line: LineSink | None) -> None:
        """launch -> stream -> tail -> down (always), recording what happened."""
        spec, sky, out = handle.spec, self.sky, handle.outcome
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("w", encoding="utf-8") as log:
            stream = LineWriter(log, on_line)
            try:
                task = sky.Task.from_yaml(str(handle.task.path))
                if spec.secrets and hasattr(task, "update_secrets"):
                    task.update_secrets(dict(spec.secrets))
                try:
                    job_id, _ = sky.stream_and_get(sky.launch(task, cluster_name=handle.instance),
                                                   output_stream=stream)
                except Exception as err:
                    if type(err).__name__ in NOT_LAUNCHED:
                        out["not_launched"] = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                    raise
                out["job_exit"] = sky.tail_logs(handle.instance, job_id, follow=True, output_stream=stream)
            except Exception as err:  # noqa: BLE001 - setup failures, lost clusters: recorded, then down
                stream.write(f"launcher: sky leg failed: {type(err).__name__}: {err}\n")
                out["error"] = f"{type(err).__name__}: {err}"
            finally:
                try:
                    if "not_launched" not in out:  # nothing was provisioned when no cloud could be asked
                        sky.stream_and_get(sky.down(handle.instance), output_stream=stream)
                    out["down"] = True
                except Exception as err:  # noqa: BLE001 - a leaked cluster bills: say so loudly
                    stream.write(f"launcher: sky down {handle.instance} FAILED: {err}; check `sky status`\n")
                    out["down"] = False
                out["ended_at"] = time.time()

    def _result(self, handle: _SkyHandle) -> LegResult:
        if "not_launched" in handle.outcome:  # no cloud could be asked: exit 2, nothing billed
            raise BadInput(f"SkyPilot could not launch: {handle.outcome['not_launched']}",
                           hint="`sky check` says which clouds are enabled")
        events = LegEvents.read(handle.spec.leg, handle.spec.log_path)
        code = exit_code_from_events(events)
        if code is None:
            code = 1 if handle.outcome.get("error") or handle.outcome.get("job_exit", 1) else 0
        ended = handle.outcome.get("ended_at", time.time())
        billed_s = math.ceil((ended - handle.started_at) / self.billing_granularity_s) * self.billing_granularity_s
        reason = handle.killed or ("sky error: " + handle.outcome["error"] if "error" in handle.outcome else "exited")
        if handle.outcome.get("down") is False:
            reason += "; teardown NOT confirmed"
        return LegResult(-9 if handle.killed else code, handle.started_at, ended, bool(handle.killed), reason,
                         billed_seconds=billed_s * self.nodes)

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        assert isinstance(handle, _SkyHandle) and handle.thread is not None
        handle.thread.join(timeout)
        return None if handle.thread.is_alive() else self._result(handle)

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        assert isinstance(handle, _SkyHandle) and handle.thread is not None
        handle.killed = reason
        try:
            self.sky.stream_and_get(self.sky.down(handle.instance))
        except Exception as err:  # noqa: BLE001 - the leg thread's own `down` reports a real failure
            handle.outcome.setdefault("kill_error", f"{type(err).__name__}: {err}")
        handle.thread.join(120)
        handle.outcome.pop("not_launched", None)  # killed on purpose: bill what ran
        return self._result(handle)

"""SkyPilot backend: a fresh cluster per leg, on SkyPilot's Python SDK (0.14 API).

Each leg: render + validate its task YAML (launcher.backends.sky.task), ask SkyPilot's
optimizer what it would launch and what that costs (host VM included), name
the cluster in the ledger (`on_instance`) *before* anything is provisioned,
`sky.launch`, stream the launch and then the job's logs into the host log, and
`sky.down` in a `finally`. The leg's exit code comes from the runtime's own
events (`done` / `stop`), not from `tail_logs`, which returns SkyPilot's
JobExitCode. Billed time runs from the launch request to teardown confirmed,
rounded up to the provider's billing granularity, or SkyPilot's own
`cost_report` duration for the cluster where it has one.

Nothing here assumes what SkyPilot did: a failed launch asks `sky.status`
whether a cluster exists (and downs it, billed, if so); failures are told
apart with `isinstance` against `sky.exceptions`; a cluster that is already
gone (`ClusterDoesNotExist`) counts as down. A launcher that dies anyway leaves
the cluster's backstops (autostop with down, the hard cap; see skytask) and the
ledger row naming it, which the next launcher command reaps (`reap`).

The SDK calls themselves (errors by type, the optimizer's pick, down, status,
cost report, a managed job's record and cancel) are launcher.backends.sky.api;
the run's managed job is launcher.backends.sky.job; the task file, launcher.backends.sky.task.

The `sky` module is imported lazily (the tests inject a strict stand-in for
what needs a live cluster; pricing and dry runs go to SkyPilot's own API server).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from launcher.backends.base import Backend, LegHandle, LegResult, LegSpec, LineSink, billed_seconds
from launcher.backends.sky.api import (
    Capture,
    LineWriter,
    Pick,
    cancel,
    classify,
    cluster_up,
    cost_row,
    down,
    job_id_of,
    one_line,
    optimizer_pick,
    placement_of,
)
from launcher.backends.sky.task import HARD_CAP_GRACE_S, RenderedTask, render, sky_module, task_for_launch
from launcher.checks.evidence import LegEvents, exit_code_from_events
from launcher.config.schema import Config
from launcher.errors import BadInput

BILLING_GRANULARITY_S = 60  # per-second billing with a one-minute minimum (AWS, GCP, Azure)


def cluster_name(spec: LegSpec) -> str:
    """A new, valid cluster name per leg (lowercase, starts with a letter, <= 35 chars)."""
    tail = re.sub(r"[^a-z0-9-]", "-", spec.run_id.lower())[-24:].strip("-")
    role = "s" if spec.env.get("LAUNCHER_RUN_ID", spec.run_id) != spec.run_id else "l"
    return f"pf-{tail}-{role}{spec.leg}"[:35]


@dataclass
class _SkyHandle(LegHandle):
    task: RenderedTask | None = None
    pick: Pick | None = None
    cost_source: str = "config prices"
    thread: threading.Thread | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    killed: str | None = None
    request: Any = None
    """The pending `sky.launch` request, cancelled if the leg is killed before it returned."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the launch request is sent: a kill waits for its id, or stops it being sent."""
    request_noted: bool = False

    def new_notes(self) -> dict[str, Any]:
        if self.request is None or self.request_noted:
            return {}
        self.request_noted = True
        return {"request_id": str(self.request)}

    def ledger_fields(self) -> dict[str, Any]:
        return {
            **super().ledger_fields(),
            "task_sha256": self.task.sha256 if self.task is not None else None,
            "run_sha256": self.task.run_sha256 if self.task is not None else None,
            "hourly_usd": self.pick.instance_hourly_usd if self.pick is not None else None,
            "cost_source": self.cost_source,
        }


def ordered_candidates(task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A rendered task with `resources.ordered`, as one task per candidate (the candidate's keys
    over the shared resources), each named by what it changes ("spot", "on-demand", ...); [] for
    a task without the list."""
    import copy

    resources = task.get("resources") or {}
    ordered = resources.get("ordered") or []
    out = []
    for candidate in ordered:
        one = copy.deepcopy(task)
        one["resources"] = {**{k: v for k, v in resources.items() if k != "ordered"}, **candidate}
        label = (
            ", ".join(("spot" if v else "on-demand") if k == "use_spot" else f"{k} {v}" for k, v in candidate.items())
            or "as the resources say"
        )
        out.append((label, one))
    return out


def dearest(priced: list[tuple[str, Pick | None]]) -> Pick | None:
    """The dearest candidate's pick, carrying every candidate's price; None where one could not
    be priced (the config's prices then, as for any task SkyPilot cannot price)."""
    import dataclasses

    if any(pick is None for _, pick in priced):
        return None
    top = max((pick for _, pick in priced if pick is not None), key=lambda p: p.hourly_usd)
    return dataclasses.replace(top, candidates=tuple((label, p.hourly_usd) for label, p in priced if p is not None))


class SkyBackend(Backend):
    """Legs as fresh SkyPilot clusters running the pinned image. It can neither freeze a leg
    nor send it SIGTERM; `launcher stop` signals the run's managed job (launcher.backends.sky.job)."""

    name = "sky"
    billing_granularity_s = BILLING_GRANULARITY_S
    sigterm_deletes = True
    """SkyPilot 0.14.1 sends a managed job SIGTERM only in `jobs.cancel(graceful=True)`, whose
    teardown (sky/core.py `down`: `_graceful_job_cancel`, then `backend.teardown`) does not wait for
    the job: the final push the signal starts races the machine's deletion."""

    def __init__(
        self, cfg: Config, image_ref: str, nodes: int = 1, sky: Any = None, retry_until_up: bool = False
    ) -> None:
        self.cfg, self.image_ref, self.nodes = cfg, image_ref, nodes
        self.sky = sky or sky_module()
        self.retry_until_up = retry_until_up
        self.placement: dict[str, str] = {}
        """Where leg 0 landed: later legs of the rung are pinned there."""

    def render_leg(self, spec: LegSpec, out: Any) -> RenderedTask:
        deadline = float(spec.env.get("LAUNCHER_DEADLINE", "0") or 0)
        hard_stop = deadline + HARD_CAP_GRACE_S if deadline > 0 else None
        return render(
            self.cfg,
            spec.rung,
            gpus=spec.gpus,
            nodes=self.nodes,
            image_ref=self.image_ref,
            leg_env=dict(spec.env),
            out=out,
            hard_stop=hard_stop,
            pin=self.placement,
        )

    def price(self, task: Any) -> tuple[Pick | None, str]:
        """SkyPilot's pick and price where its optimizer can run; else (None, why)."""
        try:
            return optimizer_pick(self.sky, task), "skypilot optimizer"
        except Exception as err:  # noqa: BLE001 - no catalog, no server: the config's prices, said so
            return None, f"SkyPilot's optimizer: {one_line(err, 200)}"

    def quote(self, rung: str, gpus: Any) -> Pick | None:
        """SkyPilot's price for one leg of this rung (what the quota guard reserves at);
        None where its optimizer cannot run. A task with `resources.ordered` (the run: spot,
        then on-demand when spot has no capacity) is quoted at the dearest candidate
        (`price_ordered`): SkyPilot's optimizer prices the first only, and a fallback billed at
        the spot price was 3.17x under-reserved (2 x H100:8: $27.13/h spot, $86.13/h on-demand)."""
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="preflight-quote-") as tmp:
            spec = LegSpec("quote", 0, rung, tuple(self.cfg.trainer.command), {}, gpus=gpus)
            rendered = self.render_leg(spec, Path(tmp) / "quote.sky.yaml")
            priced = self.price_ordered(rendered)
            if priced is None:
                return self.price(self.sky.Task.from_yaml(str(rendered.path)))[0]
            return dearest(priced)

    def controller_quote(self, cloud: str | None) -> Pick | None:
        """SkyPilot's price for its jobs controller VM (the resources SkyPilot 0.14.1 gives it by
        default: `sky.jobs.constants.CONTROLLER_RESOURCES`, cpus 4+, memory 4x, disk 50 GB) on the
        run's cloud; None where its optimizer cannot price it."""
        import importlib
        import tempfile
        from pathlib import Path

        import yaml

        try:
            resources = dict(importlib.import_module("sky.jobs.constants").CONTROLLER_RESOURCES)
        except (ImportError, AttributeError):
            return None
        if cloud:
            resources["infra"] = cloud.lower()
        with tempfile.TemporaryDirectory(prefix="preflight-controller-") as tmp:
            path = Path(tmp) / "controller.sky.yaml"
            path.write_text(yaml.safe_dump({"name": "jobs-controller", "resources": resources, "run": "true"}))
            return self.price(self.sky.Task.from_yaml(str(path)))[0]

    def price_ordered(self, rendered: RenderedTask) -> list[tuple[str, Pick | None]] | None:
        """Each candidate of a rendered task's `resources.ordered`, priced by SkyPilot's optimizer
        as a task of its own, in SkyPilot's order, named ("spot", "on-demand"); None for a task
        without the list; a candidate it cannot price is None."""
        import tempfile
        from pathlib import Path

        import yaml

        candidates = ordered_candidates(yaml.safe_load(rendered.yaml_text))
        if len(candidates) < 2:
            return None
        priced: list[tuple[str, Pick | None]] = []
        with tempfile.TemporaryDirectory(prefix="preflight-ordered-") as tmp:
            for i, (label, task) in enumerate(candidates):
                path = Path(tmp) / f"candidate-{i}.sky.yaml"
                path.write_text(yaml.safe_dump(task, sort_keys=False))
                priced.append((label, self.price(self.sky.Task.from_yaml(str(path)))[0]))
        return priced

    def dry_launch(self, spec: LegSpec, out: Any) -> tuple[RenderedTask, Pick | None, str]:
        """What `launch` would send, sent as SkyPilot's own dry run (`sky.launch(...,
        dryrun=True)`: its parser, its optimizer, nothing provisioned); with the pick and
        price, or why there is none (no API server, no catalog, no cloud enabled)."""
        rendered = self.render_leg(spec, out)
        task = task_for_launch(self.sky, rendered.path, dict(spec.secrets))
        pick, source = self.price(task)
        if pick is None:
            return rendered, None, source
        try:
            with contextlib.redirect_stdout(Capture()):  # the client prints "Running on cluster: ..."
                self.sky.stream_and_get(
                    self.sky.launch(task, cluster_name=cluster_name(spec), dryrun=True), output_stream=Capture()
                )
        except Exception as err:  # noqa: BLE001 - shown, in SkyPilot's words
            mapped = classify(self.sky, err)
            return rendered, None, (mapped.message if mapped else f"SkyPilot's dry run failed: {one_line(err)}")
        return rendered, pick, source

    def launch(
        self, spec: LegSpec, on_line: LineSink | None = None, on_instance: Callable[[LegHandle], None] | None = None
    ) -> LegHandle:
        rendered = self.render_leg(spec, spec.log_path.with_suffix(".sky.yaml"))
        task = task_for_launch(self.sky, rendered.path, dict(spec.secrets))
        pick, source = self.price(task)
        cluster = cluster_name(spec)
        handle = _SkyHandle(
            spec,
            cluster,
            time.time(),
            ("sky", "launch", "-c", cluster, str(rendered.path)),
            task=rendered,
            pick=pick,
            cost_source=source if pick else "config prices",
        )
        if pick is None:
            handle.outcome["price_note"] = source
        if on_instance is not None:
            on_instance(handle)  # the ledger names the cluster before anything is provisioned
        handle.thread = threading.Thread(target=self._run, args=(handle, task, on_line), daemon=True)
        handle.thread.start()
        return handle

    def _run(self, handle: _SkyHandle, task: Any, on_line: LineSink | None) -> None:
        """launch -> stream -> tail -> down (always), recording what happened."""
        spec, sky, out = handle.spec, self.sky, handle.outcome
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("w", encoding="utf-8") as log:
            stream = LineWriter(log, on_line)
            if handle.pick is not None:
                stream.write(f"launcher: SkyPilot's pick: {handle.pick.describe()}\n")
            else:
                stream.write(f"launcher: no SkyPilot price ({out.get('price_note')}): launcher.yaml prices\n")
            try:
                try:
                    with handle.lock:
                        if handle.killed:
                            raise RuntimeError("killed before its launch request was sent")
                        handle.request = sky.launch(
                            task, cluster_name=handle.instance, retry_until_up=self.retry_until_up
                        )
                    job_id, launched = sky.stream_and_get(handle.request, output_stream=stream)
                except Exception as err:
                    out["launch_error"] = err
                    raise
                out["placement"] = placement_of(launched)
                if spec.leg == 0 and not self.placement and out["placement"]:
                    # Same cloud, region and machine for the rung's other legs; any zone of the
                    # region (a zone pin turns one zone's capacity into a failed leg).
                    # Spot or not stays the template's choice.
                    self.placement = {k: v for k, v in out["placement"].items() if k not in ("zone", "use_spot")}
                out["job_exit"] = sky.tail_logs(handle.instance, job_id, follow=True, output_stream=stream)
            except Exception as err:  # noqa: BLE001 - setup failures, lost clusters: recorded, then down
                stream.write(f"launcher: sky leg failed: {one_line(err)}\n")
                out["error"] = one_line(err)
            finally:
                out["down"], note = self._teardown(handle, stream)
                if note:
                    out["down_note"] = note
                out["ended_at"] = time.time()
                out["billed_s"] = self._billed_seconds(handle)

    def _teardown(self, handle: _SkyHandle, stream: Any) -> tuple[bool | str, str]:
        """After a failed launch, ask SkyPilot whether a cluster exists before deciding
        there is nothing to down or bill; otherwise down it."""
        if "launch_error" in handle.outcome:
            try:
                if not cluster_up(self.sky, handle.instance):
                    return "gone", ""
            except Exception:  # noqa: BLE001 - could not ask: down it anyway
                pass
        return down(self.sky, handle.instance, stream)

    def _billed_seconds(self, handle: _SkyHandle) -> float:
        """Instance-seconds: SkyPilot's own duration for the cluster where it reports one,
        else launch request to teardown confirmed; rounded up per node, times nodes."""
        if handle.outcome.get("down") == "gone" and "launch_error" in handle.outcome:
            return 0.0  # it never existed: nothing was provisioned, nothing is billed
        seconds = handle.outcome.get("ended_at", time.time()) - handle.started_at
        reported = cost_row(self.sky, handle.instance)
        if reported is not None:
            seconds = reported[1]
        return billed_seconds(seconds, self.billing_granularity_s) * self.nodes

    def _result(self, handle: _SkyHandle) -> LegResult:
        out = handle.outcome
        err = out.get("launch_error")
        mapped = classify(self.sky, err) if err is not None and not handle.killed else None
        if mapped is not None and out.get("billed_s", 0.0) == 0.0:
            raise mapped  # nothing was provisioned (asked of sky.status): exit 2 or 3, nothing billed
        events = LegEvents.read(handle.spec.leg, handle.spec.log_path)
        code = exit_code_from_events(events)
        if code is None:
            code = 1 if out.get("error") or out.get("job_exit", 1) else 0
        ended = out.get("ended_at", time.time())
        reason = handle.killed or ("sky error: " + out["error"] if "error" in out else "exited")
        if out.get("down") is False:
            reason += "; teardown NOT confirmed: " + out.get("down_note", "")
        hourly = handle.pick.instance_hourly_usd if handle.pick else None
        return LegResult(
            -9 if handle.killed else code,
            handle.started_at,
            ended,
            bool(handle.killed),
            reason,
            billed_seconds=out.get("billed_s", 0.0),
            instance_hourly_usd=hourly,
            cost_source=handle.cost_source,
            placement=out.get("placement") or None,
        )

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        assert isinstance(handle, _SkyHandle) and handle.thread is not None
        handle.thread.join(timeout)
        return None if handle.thread.is_alive() else self._result(handle)

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        """Lose the cluster: cancel a launch still in flight (the API server would carry
        it on without us), then down it; the leg thread's own `down` confirms."""
        assert isinstance(handle, _SkyHandle) and handle.thread is not None
        with handle.lock:  # a launch request in flight gets its id first: it is cancelled, not orphaned
            handle.killed = reason
        if handle.request is not None and "placement" not in handle.outcome:
            try:
                self.sky.api_cancel(handle.request)
            except Exception as err:  # noqa: BLE001 - the down below is what matters
                handle.outcome.setdefault("kill_error", one_line(err))
        ok, note = down(self.sky, handle.instance, None)
        if not ok:
            handle.outcome.setdefault("kill_error", note)
        handle.thread.join(120)
        return self._result(handle)

    @classmethod
    def check_signal(cls, run: Mapping[str, Any], leg: Mapping[str, Any] | None) -> None:
        """Only the run's managed job, while a leg of it is live, can be signalled."""
        if run["rung"] != "run" or leg is None:
            super().check_signal(run, leg)

    @classmethod
    def signal_leg(cls, leg: Mapping[str, Any], sig: int) -> None:
        """`sky.jobs.cancel` of the managed job the leg belongs to; graceful on SIGTERM."""
        job = job_id_of(leg["instance"])
        why = cancel(sky_module(), job, graceful=sig == signal.SIGTERM) if job is not None else "not a managed job"
        if why is not None:
            raise BadInput(f"sky.jobs.cancel of {leg['instance']}: {why}")

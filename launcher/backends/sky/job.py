"""The run on SkyPilot as ONE managed job (`sky.jobs.launch`), its recoveries as legs.

SkyPilot's jobs controller owns the job's life: it replaces a preempted instance
(spot first, on-demand when spot has none, `ordered` in sky/run.yaml) and restarts
a failed `run` up to `job_recovery.max_restarts_on_errors` times, relaunching the
same task on a fresh cluster each time. The launcher follows the job's log
(`sky.jobs.tail_logs`, which keeps streaming across recoveries) and splits it into
legs: the runtime prints a `session` event first thing in every attempt, so a
second one in the stream is the next attempt. After the job ends, SkyPilot's own
record (`sky.jobs.queue_v2`: status, recovery_count, job_duration) is read and set
against what the stream showed. Reading that record, cancelling a job and the
ledger's name for it (`sky-job-<id>`) are SDK calls: launcher.backends.sky.api.

The `sky` module is SkyPilot's (or the strict stand-in the tests inject).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from launcher.backends.base import LegSpec
from launcher.backends.sky.api import JOB_PREFIX, Capture, Pick, classify, one_line
from launcher.backends.sky.backend import SkyBackend, dearest
from launcher.backends.sky.inflight import PENDING_JOB_PREFIX, end_requests, ended_unanswered
from launcher.backends.sky.task import RenderedTask, render_job, task_for_launch


class LegSplitter:
    """`tail_logs`' output stream: each whole line goes to the current leg's log and the live
    view; a rank-0 `session` event, once the current leg already printed one, is the next
    attempt: `on_new_leg(leg)` runs first (it closes the leg and opens the next), then
    `on_session(leg)`."""

    def __init__(
        self,
        leg: int,
        log_for: Callable[[int], Path],
        on_line: Callable[[int, str], None],
        on_new_leg: Callable[[int], None],
        on_session: Callable[[int], None] | None = None,
    ) -> None:
        self.leg, self.log_for, self.on_line, self.on_new_leg = leg, log_for, on_line, on_new_leg
        self.on_session = on_session
        """Called with the leg once each attempt's first rank-0 `session` event is seen: the
        attempt is running, and SkyPilot's record names the resources it runs on."""
        self._buf = ""
        self._seen_session = False
        self._log: IO[str] = self._open(leg)

    def _open(self, leg: int) -> IO[str]:
        path = self.log_for(leg)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self._line(line + "\n")
        return len(text)

    def _line(self, line: str) -> None:
        from runtime.events import parse_line

        event = parse_line(line) if '"session"' in line else None  # SkyPilot may prefix a job's lines
        if event is not None and event["event"] == "session" and event.get("rank", 0) == 0:
            if self._seen_session:
                self._log.close()
                self.on_new_leg(self.leg + 1)
                self.leg += 1
                self._log = self._open(self.leg)
            self._seen_session = True
            if self.on_session is not None:
                self.on_session(self.leg)
        self._log.write(line)
        self._log.flush()
        self.on_line(self.leg, line)

    def flush(self) -> None:
        self._log.flush()

    def close(self) -> None:
        if self._buf:
            self._line(self._buf + "\n")
            self._buf = ""
        self._log.close()


@dataclass
class ManagedJob:
    """One submitted managed job: what was sent, its id, SkyPilot's pick and price."""

    backend: SkyBackend
    spec: LegSpec
    rendered: RenderedTask
    pick: Pick | None
    cost_source: str
    price_note: str = ""
    """Why there is no SkyPilot price (no API server, no catalog), when there is none."""
    submitted_at: float = 0.0
    job_id: int | None = None
    request: Any = None
    notes: list[str] = field(default_factory=list)
    prices: tuple[tuple[str, Pick | None], ...] = ()
    """Each candidate of the task's `resources.ordered`, SkyPilot's price for it ("spot", "on-demand"):
    an attempt is billed at the candidate it ran on (`price_of`); `pick` is the dearest."""

    @property
    def instance(self) -> str:
        """The ledger's name for the job's legs: `sky-job-<id>`, or its name until SkyPilot gave an id."""
        return f"{JOB_PREFIX}{self.job_id}" if self.job_id is not None else f"{PENDING_JOB_PREFIX}{self.name}"

    def price_of(self, use_spot: bool) -> Pick | None:
        """The price of the candidate an attempt ran on (spot or not); the job's pick where the task
        has one candidate, or none of its candidates matches."""
        for _label, pick in self.prices:
            if pick is not None and pick.use_spot == use_spot:
                return pick
        return self.pick

    @property
    def command(self) -> tuple[str, ...]:
        return ("sky", "jobs", "launch", "-n", self.name, str(self.rendered.path))

    @property
    def name(self) -> str:
        """Unique per job (a run's later jobs resume it): what the next command finds it by."""
        tail = re.sub(r"[^a-z0-9-]", "-", self.spec.run_id.lower())[-36:].strip("-") or "preflight-run"
        return f"{tail}-j{self.spec.leg}"


def prepare(
    backend: SkyBackend, spec: LegSpec, out: Path, job_deadline: float, leg_budget_s: float, max_restarts: int
) -> tuple[ManagedJob, Any]:
    """Render and validate the job's task, price it with SkyPilot's optimizer; (job, Task)."""
    rendered = render_job(
        backend.cfg,
        gpus=spec.gpus,
        nodes=backend.nodes,
        image_ref=backend.image_ref,
        leg_env=dict(spec.env),
        out=out,
        job_deadline=job_deadline,
        leg_budget_s=leg_budget_s,
        max_restarts=max_restarts,
    )
    task = task_for_launch(backend.sky, rendered.path, dict(spec.secrets))
    priced = backend.price_ordered(rendered)
    top = dearest(priced) if priced else None
    pick, source = (top, "skypilot optimizer") if top is not None else backend.price(task)
    return ManagedJob(
        backend,
        spec,
        rendered,
        pick,
        source if pick else "config prices",
        price_note="" if pick else source,
        prices=tuple(priced or ()),
    ), task


def submit(job: ManagedJob, task: Any, on_request: Callable[[str], None]) -> int:
    """`sky.jobs.launch`: 0.14.1 answers a list of job ids (and the controller's handle), after
    bringing the jobs controller up where it is not (minutes). `on_request` gets the request's id
    as soon as SkyPilot's API server gave it, before the wait (the ledger keeps it)."""
    sky = job.backend.sky
    job.submitted_at = time.time()
    job.request = sky.jobs.launch(task, name=job.name)
    on_request(str(job.request))
    ids, _controller = sky.stream_and_get(job.request, output_stream=Capture())
    if not ids:
        raise RuntimeError("sky.jobs.launch returned no job id")
    job.job_id = int(ids[0])
    return job.job_id


def abandon(job: ManagedJob) -> bool:
    """An interrupted submit: its request cancelled (SkyPilot would otherwise bring up the controller
    and submit the job without us), then any job of its name cancelled. Whether SkyPilot confirms
    the request ended without a job: nothing was provisioned for it."""
    if job.request is None:
        return True  # interrupted before the request was sent
    sky = job.backend.sky
    final, why = end_requests(sky, [str(job.request)])
    try:
        sky.get(sky.jobs.cancel(name=job.name))
    except Exception as err:  # noqa: BLE001 - a job created after all is then the next command's to reap
        job.notes.append(f"sky.jobs.cancel(name={job.name}): {one_line(err)}")
    return not why and ended_unanswered(final)


def follow(job: ManagedJob, stream: LegSplitter) -> int | None:
    """Stream the job's log across its recoveries until it ends; SkyPilot's JobExitCode."""
    return job.backend.sky.jobs.tail_logs(job_id=job.job_id, follow=True, output_stream=stream)


def dry_run(
    backend: SkyBackend, spec: LegSpec, out: Path, job_deadline: float, leg_budget_s: float, max_restarts: int
) -> tuple[RenderedTask, Pick | None, str]:
    """The job's task through SkyPilot's own dry run (`sky.launch(..., dryrun=True)`: its
    parser, its optimizer over the `ordered` candidates; managed jobs have no dry run of
    their own), with the pick and price of the first candidate that can launch (spot)."""
    import contextlib

    job, task = prepare(backend, spec, out, job_deadline, leg_budget_s, max_restarts)
    if job.pick is None:
        return job.rendered, None, job.price_note
    sky = backend.sky
    try:
        with contextlib.redirect_stdout(Capture()):
            sky.stream_and_get(
                sky.launch(task, cluster_name=f"pf-dry-{job.name}"[:35], dryrun=True), output_stream=Capture()
            )
    except Exception as err:  # noqa: BLE001 - shown, in SkyPilot's words
        mapped = classify(sky, err)
        return job.rendered, None, (mapped.message if mapped else f"SkyPilot's dry run failed: {one_line(err)}")
    return job.rendered, job.pick, "skypilot optimizer"

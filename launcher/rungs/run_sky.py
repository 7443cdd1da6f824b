"""Rung 4 on SkyPilot: the run as one managed job, each recovery a leg.

The same rules as launcher.rungs.run, applied as the job goes: when the job's log shows
the next attempt (launcher.backends.sky.job.LegSplitter), the attempt before it is
closed in the ledger (billed from its start to the next one's), the store is read,
and the new attempt's resume is checked once it ended. A bad resume, a store that
lost a verified checkpoint, or a crash loop cancels the job. A job that ends by its
deadline (the leg budget; the session cap) without reaching the last step is
followed by the next job, from the store, while the quota allows.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from launcher.backends.base import LegResult, LegSpec, billed_seconds
from launcher.backends.sky import job as skyjob
from launcher.backends.sky.api import cancel, record, spot_of
from launcher.checks.evidence import Check, Kind, LegEvents
from launcher.leg_env import redact
from launcher.legs import LegOutcome, RunContext, record_end
from launcher.rungs.run import (
    Progress,
    finished,
    hold_leg,
    judge_leg,
    min_leg_s,
    newest_in_store,
    quota_out,
    reached_end,
)

MAX_JOB_S = 7 * 24 * 3600.0
"""A job's deadline when no quota bounds it: a week (the longest leg budget there is)."""


class _Legs:
    """The ledger rows and outcomes of the job's attempts, as the stream shows them; each attempt
    priced at the resources SkyPilot's record says it runs on (spot, or the on-demand fallback)."""

    def __init__(self, ctx: RunContext, job: Any, outs: list[LegOutcome]) -> None:
        self.ctx, self.job, self.outs = ctx, job, outs
        self.open: dict[int, float] = {}
        self.picks: dict[int, Any] = {}

    def log(self, leg: int) -> Any:
        return self.ctx.run_dir / f"leg-{leg}.log"

    def begin(self, leg: int, started_at: float) -> None:
        ctx, job = self.ctx, self.job
        ctx.ledger.begin_leg(
            {
                "run_id": ctx.run_id,
                "leg": leg,
                "backend": "sky",
                "instance": job.instance,
                "command": list(job.command),
                "env": redact(dict(job.spec.env), ctx.cfg.secrets),
                "log_path": str(self.log(leg)),
                "started_at": started_at,
                "task_sha256": job.rendered.sha256,
                "pid": None,
                "role": None,
                "hourly_usd": job.pick.instance_hourly_usd if job.pick else None,
                "cost_source": job.cost_source,
            }
        )
        self.open[leg] = started_at

    def priced(self, leg: int) -> None:
        """The attempt is running: SkyPilot's record says on what (spot or not); its price is that
        candidate's (until then, and where the record says nothing, the dearest candidate's)."""
        job = self.job
        if len(job.prices) < 2 or leg not in self.open:
            return
        rec = record(self.ctx.backend.sky, job.job_id) or {}
        shown = str(rec.get("cluster_resources") or "")
        spot = spot_of(shown)  # SkyPilot writes `1x[spot](...)`: one reader of its markers (skyapi.spot_of)
        if spot is None:
            return
        pick = job.price_of(spot)
        if pick is not None:
            self.picks[leg] = pick
            self.ctx.ledger.note_leg(self.ctx.run_id, leg, hourly_usd=pick.instance_hourly_usd)
            self.ctx.show(
                leg,
                f"launcher: attempt runs on {shown} ({rec.get('cloud')} {rec.get('region')}): "
                f"billed at ${pick.hourly_usd:.2f}/h\n",
            )

    def end(self, leg: int, ended_at: float, reason: str, killed: bool, nothing: bool = False) -> LegOutcome:
        """Close the leg, billed from its start to `ended_at` (nothing: SkyPilot confirmed its submit
        ended without a job)."""
        from launcher.checks.evidence import exit_code_from_events

        started = self.open.pop(leg)
        events = LegEvents.read(leg, self.log(leg))
        code = exit_code_from_events(events)
        seconds = (
            0.0 if nothing else billed_seconds(max(0.0, ended_at - started), self.ctx.backend.billing_granularity_s)
        )
        pick = self.picks.get(leg, self.job.pick)
        result = LegResult(
            code,
            started,
            ended_at,
            killed,
            reason,
            billed_seconds=seconds * self.ctx.nodes,
            instance_hourly_usd=pick.instance_hourly_usd if pick else None,
            cost_source=self.job.cost_source,
        )
        record_end(self.ctx, leg, result)
        out = LegOutcome(result, events)
        self.outs.append(out)
        return out


def climb(ctx: RunContext, cmp: object = None) -> list[Check]:
    """The run as managed jobs until its last step; returns the checks."""
    run_cfg = ctx.cfg.rungs.run
    steps = run_cfg.steps
    store = ctx.open_store()
    exact = not ctx.gpu_count and ctx.cfg.trainer.deterministic
    outs: list[LegOutcome] = []
    checks: list[Check] = []
    progress = Progress(newest_in_store(store))
    stopping: list[str] = []

    def judge() -> str | None:
        return judge_leg(ctx, store, outs, progress, exact, checks)

    leg = 0
    while True:
        job, task = _prepare_job(ctx, leg, outs, progress, checks)
        legs = _Legs(ctx, job, outs)
        first = leg
        leg, code = _follow_job(ctx, job, task, legs, leg, judge, stopping)
        rec = record(ctx.backend.sky, job.job_id) or {}
        final = legs.end(leg, time.time(), f"job {rec.get('status', '?')} (tail_logs exit {code})", killed=False)
        stop = judge()
        checks.append(_job_check(job, rec, leg - first + 1))
        if stopping or stop:
            return checks
        if reached_end(final, steps):
            return checks + finished(outs, steps)
        if ctx.ledger.stop_requested(ctx.run_id):
            return checks
        if rec.get("status") not in ("SUCCEEDED",):
            checks.append(
                Check(
                    "the run makes progress",
                    False,
                    f"SkyPilot ended the job {rec.get('status')}: {rec.get('failure_reason') or ''} "
                    f"(job_recovery.max_restarts_on_errors: {run_cfg.max_restarts_on_errors}); the newest "
                    f"verified checkpoint is {progress.newest[1] or 'none'}",
                    kind=Kind.PROGRESS,
                )
            )
            return checks
        leg += 1  # the job stopped at its deadline before the last step: the next job resumes from the store


def _prepare_job(
    ctx: RunContext, leg: int, outs: list[LegOutcome], progress: Progress, checks: list[Check]
) -> tuple[skyjob.ManagedJob, Any]:
    """The next managed job, its first leg `leg`, rendered and priced: its deadline is what
    the quota grants it (a week where nothing bounds it); a quota that no longer fits one
    leg ends the run (launcher.rungs.run.quota_out)."""
    run_cfg = ctx.cfg.rungs.run
    gpus = max(1, ctx.gpus_total)
    grant = hold_leg(ctx, math.inf) if ctx.reservation_id is not None and ctx.gpu_count else None
    job_s = MAX_JOB_S if grant is None or not math.isfinite(grant.gpu_hours) else grant.gpu_hours * 3600 / gpus
    if job_s < min_leg_s(outs):
        raise quota_out(ctx, outs, grant, progress.newest, run_cfg.steps, checks, min_leg_s(outs))
    now = time.time()
    env = ctx.leg_env(leg, run_cfg.steps, now + job_s)
    spec = LegSpec(
        ctx.run_id,
        leg,
        "run",
        tuple(ctx.cfg.trainer.command),
        env,
        ctx.secrets(),
        ctx.files,
        ctx.run_dir / f"leg-{leg}.log",
        ctx.gpus,
    )
    return skyjob.prepare(
        ctx.backend,
        spec,
        ctx.run_dir / f"job-{leg}.sky.yaml",
        now + job_s,
        min(run_cfg.budget_minutes * 60.0, job_s),
        run_cfg.max_restarts_on_errors,
    )


def _follow_job(
    ctx: RunContext,
    job: skyjob.ManagedJob,
    task: Any,
    legs: _Legs,
    leg: int,
    judge: Callable[[], str | None],
    stopping: list[str],
) -> tuple[int, int | None]:
    """Submit the job and follow its log to its end, each recovery a new leg: the leg before
    is closed and judged, and a failed judgement cancels the job (its reason kept in
    `stopping`). (The job's last leg, tail_logs' exit code.) Interrupted or failed, the job
    is cancelled, so it does not go on billing without the launcher, and its legs closed."""
    first = leg
    try:
        legs.begin(leg, time.time())  # named before the request is sent: the next command finds it by name
        skyjob.submit(job, task, lambda rid: ctx.ledger.note_leg(ctx.run_id, leg, request_id=rid))
        ctx.ledger.note_leg(ctx.run_id, leg, instance=job.instance)
        ctx.show(leg, f"launcher: managed job {job.job_id} submitted: {job.pick.describe() if job.pick else ''}\n")

        def on_new_leg(new: int) -> None:
            now = time.time()
            legs.end(
                new - 1,
                now,
                f"SkyPilot recovered the job (attempt {new - first + 1} started): "
                "the attempt before was preempted or its run failed",
                killed=True,
            )
            legs.begin(new, now)
            stop = judge()
            if stop and not stopping:
                stopping.append(stop)
                cancel(ctx.backend.sky, job.job_id, graceful=False)

        splitter = skyjob.LegSplitter(leg, legs.log, ctx.show, on_new_leg, legs.priced)
        try:
            code = skyjob.follow(job, splitter)
        finally:
            splitter.close()
        return splitter.leg, code
    except BaseException:
        nothing = False
        if job.job_id is not None:  # interrupted or failed: the job must not go on billing without us
            cancel(ctx.backend.sky, job.job_id, graceful=False)
        else:  # the submit itself: its request cancelled, and a job it made after all
            nothing = skyjob.abandon(job)
        for open_leg in list(legs.open):
            legs.end(
                open_leg,
                time.time(),
                "launcher interrupted: job cancelled"
                if job.job_id is not None
                else "launcher interrupted during the submit: request cancelled",
                killed=True,
                nothing=nothing,
            )
        raise


def _job_check(job: Any, rec: dict[str, Any], attempts: int) -> Check:
    """What the stream showed, against SkyPilot's own record of the job."""
    recoveries = rec.get("recovery_count")
    ok = recoveries is not None and int(recoveries) + 1 == attempts
    return Check(
        f"managed job {job.job_id}: every recovery became a leg",
        ok,
        f"SkyPilot's record: {rec.get('status')}, recovery_count {recoveries}, job_duration "
        f"{rec.get('job_duration')} s; the launcher saw {attempts} attempt(s) in the job's log",
        kind=Kind.RECOVERIES,
    )

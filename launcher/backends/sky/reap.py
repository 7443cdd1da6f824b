"""What a dead launcher left on SkyPilot, asked of SkyPilot and ended: never assumed.

A launcher killed with `kill -9` can leave three things working on SkyPilot's API
server and in the cloud without anyone following them:

- a cluster (a leg's launch returned; its job runs);
- a request still in flight: a `sky.launch` queued, optimizing, or waiting between
  `--retry-until-up` attempts (a failed attempt removes its cluster record, so
  `sky.status` alone reads "gone" while the request goes on retrying), or a
  `sky.jobs.launch` bringing up the jobs controller (minutes);
- a managed job, with or without the id the launcher never got to read.

The ledger names each leg before its request is sent (the cluster; for a managed job its
name) and records the request's id once sent. The next launcher command (launcher.ops.reconcile)
calls `reap`, `reap_job` or `reap_submit` here: every request still working is cancelled
(`sky.api_cancel`) and its end confirmed by `sky.api_status`; a cluster still up is downed;
a managed job still live is cancelled by id or by name. Each says when the leg stopped
billing, or that nothing was provisioned (billed 0), or that it could not confirm either
(the leg then stays billed at its full reservation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from launcher.backends.sky.api import (
    RECORD_FIELDS,
    TERMINAL_JOB_STATUSES,
    cancel,
    cluster_up,
    cost_row,
    down,
    one_line,
    record,
)
from launcher.backends.sky.inflight import end_requests, ended_unanswered, live_requests, request_state
from launcher.backends.sky.task import sky_module

JOB_END_WAIT_S = 90.0
"""How long a cancelled managed job may take to reach a terminal status (SkyPilot's controller
polls its cancel signal every 15 s, then tears the job's cluster down)."""


@dataclass(frozen=True)
class Reaped:
    cluster: str
    was_up: bool
    ended_at: float | None
    """When it stopped billing: now for one taken down here, SkyPilot's record for one already gone;
    None: not confirmed, the leg stays billed at its reservation."""
    detail: str
    nothing_billed: bool = False
    """SkyPilot confirms nothing was provisioned: its request ended unanswered, no record is left."""


def _requests_ended(sky: Any, name: str, request_id: str | None, **match: Any) -> tuple[dict[str, str], str]:
    """Cancel the leg's request (by its id, and any other of this kind SkyPilot still works on for
    the same cluster or job name) and confirm each ended: ({id: final status}, why not confirmed)."""
    ids = [request_id] if request_id else []
    ids += [str(p.request_id) for p in live_requests(sky, name, **match)]
    return end_requests(sky, ids)


def _said(final: dict[str, str]) -> str:
    return ", ".join(f"{rid[:8]} {status}" for rid, status in final.items())


def reap(cluster: str, request_id: str | None = None) -> Reaped:
    """A leg whose launcher died: its launch request is ended first (it would provision the
    cluster later); then, is the cluster there? If so its job is cancelled and it is downed
    now. Either way: when it stopped billing (SkyPilot's cost report), or nothing ran."""
    sky = sky_module()
    try:
        final, why = _requests_ended(sky, "sky.launch", request_id, cluster=cluster)
        if why:
            return Reaped(cluster, False, None, f"launch of {cluster}: {why}")
        up = cluster_up(sky, cluster)
    except Exception as err:  # noqa: BLE001 - unknown: say so, never assume it gone
        return Reaped(
            cluster,
            False,
            None,
            f"could not ask SkyPilot about {cluster}: {one_line(err)}; "
            f"check `sky api status`, `sky status` and `sky down {cluster}`",
        )
    ended_requests = f" (its launch request {_said(final)})" if final else ""
    if not up:
        report = cost_row(sky, cluster)
        if report is None and ended_unanswered(final):
            return Reaped(
                cluster,
                False,
                time.time(),
                f"cluster {cluster} was never provisioned: SkyPilot has no record of it{ended_requests}",
                nothing_billed=True,
            )
        ended = None if report is None else report[0] + report[1]
        return Reaped(cluster, False, ended, f"cluster {cluster} is already gone{ended_requests}")
    try:
        sky.stream_and_get(sky.cancel(cluster, all=True))
    except Exception:  # noqa: BLE001 - down takes the job with it
        pass
    ok, note = down(sky, cluster, None)
    if ok is False:
        return Reaped(cluster, True, None, note)
    return Reaped(cluster, True, time.time(), f"cluster {cluster} was still up: taken down{ended_requests}")


def reap_job(job_id: int) -> Reaped:
    """A managed job whose launcher died: still running, it is cancelled now (its leg billed
    to now); already ended, to when SkyPilot says it ended. Never assumed either way."""
    sky = sky_module()
    name = f"managed job {job_id}"
    try:
        rec = record(sky, job_id)
    except Exception as err:  # noqa: BLE001 - unknown: say so
        return Reaped(
            name,
            False,
            None,
            f"could not ask SkyPilot about {name}: {one_line(err)}; check "
            f"`sky jobs queue` and `sky jobs cancel {job_id}`",
        )
    if rec is None:
        return Reaped(name, False, None, f"SkyPilot has no {name}; check `sky jobs queue`")
    if rec["status"] in TERMINAL_JOB_STATUSES:
        return Reaped(name, False, rec.get("end_at"), f"{name} had already ended ({rec['status']})")
    why = cancel(sky, job_id, graceful=False)
    if why is not None:
        return Reaped(name, True, None, f"{name} is {rec['status']} and could not be cancelled: {why}")
    return Reaped(name, True, time.time(), f"{name} was still {rec['status']}: cancelled")


def jobs_named(sky: Any, name: str, controller: str | None) -> list[dict[str, Any]]:
    """SkyPilot's records of the managed jobs called `name`. A jobs controller that is not up
    (never launched, or autostopped) answers `ClusterNotUpError` without a refresh: where
    SkyPilot has no record of that controller at all, no job ever ran; otherwise it is asked
    again with `refresh=True` (SkyPilot starts the controller to answer)."""

    def ask(refresh: bool) -> list[dict[str, Any]]:
        records = sky.get(sky.jobs.queue_v2(refresh=refresh, name_match=name, fields=RECORD_FIELDS))[0]
        return [
            {k: (getattr(r["status"], "value", r["status"]) if k == "status" else r.get(k)) for k in RECORD_FIELDS}
            for r in records
            if r.get("job_name") == name
        ]

    try:
        return ask(False)
    except sky.exceptions.ClusterNotUpError:
        if controller and not cluster_up(sky, controller) and cost_row(sky, controller) is None:
            return []
        return ask(True)


def reap_submit(name: str, request_id: str | None) -> Reaped:
    """A managed job whose launcher died before `sky.jobs.launch` answered with its id: the
    request is cancelled (it would bring up the controller and submit the job later) and its end
    confirmed; then any job of that name that got submitted anyway is cancelled by name."""
    sky = sky_module()
    label = f"managed job {name}"
    try:
        final, why = _requests_ended(sky, "sky.jobs.launch", request_id, needle=name)
        if why:
            return Reaped(label, False, None, f"submit of {label}: {why}")
        controller = None
        if request_id:
            _status, payload = request_state(sky, request_id)
            controller = getattr(payload, "cluster_name", None)
        jobs = jobs_named(sky, name, controller)
    except Exception as err:  # noqa: BLE001 - unknown: say so
        return Reaped(
            label,
            False,
            None,
            f"could not ask SkyPilot about {label}: {one_line(err)}; check `sky api status` and `sky jobs queue`",
        )
    said = f" (its submit request {_said(final)})" if final else ""
    if not jobs:
        if ended_unanswered(final):
            return Reaped(
                label, False, time.time(), f"{label} was never submitted{said}: nothing billed", nothing_billed=True
            )
        return Reaped(label, False, None, f"SkyPilot has no {label}{said}; check `sky jobs queue`")
    live = [j for j in jobs if j["status"] not in TERMINAL_JOB_STATUSES]
    for job in live:
        cancel(sky, int(job["job_id"]), graceful=False)
    deadline = time.time() + JOB_END_WAIT_S
    while live and time.time() < deadline:
        time.sleep(1.0)
        live = [j for j in live if (record(sky, int(j["job_id"])) or {}).get("status") not in TERMINAL_JOB_STATUSES]
    if live:
        return Reaped(
            label,
            True,
            None,
            f"{label} (job {live[0]['job_id']}) could not be confirmed cancelled; check `sky jobs queue`",
        )
    ended = max((float(j["end_at"]) for j in jobs if j.get("end_at")), default=time.time())
    ids = ", ".join(str(j["job_id"]) for j in jobs)
    return Reaped(
        label,
        bool(jobs),
        time.time() if any(j["status"] not in TERMINAL_JOB_STATUSES for j in jobs) else ended,
        f"{label} (job {ids}) submitted without its launcher{said}: cancelled",
    )

"""SkyPilot's requests in flight, as the launcher ends them: a request's state on the API
server, the live requests of a cluster or job, and cancelling them until the server confirms.
What a dead launcher left (launcher.backends.sky.reap) and the managed job's submission
(launcher.backends.sky.job) both end their requests through here. Like launcher.backends.sky.api,
every function takes the `sky` module first; nothing here imports SkyPilot.
"""

from __future__ import annotations

import time
from typing import Any

from launcher.backends.sky.api import one_line

REQUEST_DONE = ("SUCCEEDED", "FAILED", "CANCELLED")
"""SkyPilot's finished request statuses (RequestStatus.finished_status); PENDING, WAITING and
RUNNING requests are still working for a client, whether or not it is alive."""


PENDING_JOB_PREFIX = "sky-job-submitting:"
"""A managed-job leg's instance while its `jobs.launch` request has not answered: the job's name."""


CANCEL_CONFIRM_S = 60.0


def ended_unanswered(final: dict[str, str]) -> bool:
    """Whether every request `end_requests` confirmed ended without an answer (CANCELLED or
    FAILED): together with no record of what it would have made, nothing was provisioned."""
    return bool(final) and all(status in ("CANCELLED", "FAILED") for status in final.values())


def request_state(sky: Any, request_id: str) -> tuple[str | None, Any]:
    """(status, the request's payload) as SkyPilot's API server has it; (None, None): it has none."""
    for payload in sky.api_status([request_id]) or []:
        if str(payload.request_id).startswith(request_id):
            status = payload.status
            return str(getattr(status, "value", status)), payload
    return None, None


def live_requests(sky: Any, name: str, *, cluster: str | None = None, needle: str | None = None) -> list[Any]:
    """The requests of this kind (`sky.launch`, `sky.jobs.launch`) still working: of one cluster,
    or whose body names `needle` (a managed job's name)."""
    found = []
    for payload in sky.api_status(cluster_name=cluster) if cluster else sky.api_status():
        status = str(getattr(payload.status, "value", payload.status))
        if payload.name != name or status in REQUEST_DONE:
            continue
        if cluster is not None and payload.cluster_name != cluster:
            continue
        if needle is not None and needle not in (payload.request_body or ""):
            continue
        found.append(payload)
    return found


CANCEL_SETTLE_S = 3.0
"""How long an ended request must stay ended before it counts as ended (see `end_requests`)."""


def end_requests(sky: Any, request_ids: list[str], wait_s: float = CANCEL_CONFIRM_S) -> tuple[dict[str, str], str]:
    """`api_cancel` the requests still working, then wait until SkyPilot says each has finished and
    it stays so for CANCEL_SETTLE_S: ({id: its final status}, '') or (what is known, why not all
    are confirmed).

    Why the settle: in SkyPilot 0.14.1 a `--retry-until-up` launch between attempts has no process
    (WAITING, pid cleared) and its executor's monitor thread sets WAITING after each failed attempt;
    a cancel landing just before that write is overwritten and the request is rescheduled (seen: 1
    in 6 kill -9 runs read WAITING after CANCELLED). A request cancelled while it runs is SIGTERMed
    and its own handler may record FAILED over CANCELLED: it ended either way. A request that
    comes back to life is cancelled again."""
    ids = list(dict.fromkeys(request_ids))
    if not ids:
        return {}, ""
    final: dict[str, str] = {}
    errors: list[str] = []
    deadline = time.time() + wait_s
    stable_since: float | None = None
    while True:
        live = []
        for rid in ids:
            status, _ = request_state(sky, rid)
            if status is None or status in REQUEST_DONE:
                final[rid] = status or "UNKNOWN"
            else:
                final.pop(rid, None)
                live.append(rid)
        if live:
            stable_since = None
            try:
                sky.get(sky.api_cancel(live, silent=True))
            except Exception as err:  # noqa: BLE001 - said if it never ends; the status decides
                errors.append(one_line(err))
        elif stable_since is None:
            stable_since = time.time()
        elif time.time() - stable_since >= CANCEL_SETTLE_S:
            return final, ""
        if time.time() > deadline:
            if not live:
                return final, ""
            return final, (
                f"request(s) {', '.join(live)} still working after api_cancel"
                f"{': ' + errors[-1] if errors else ''}; check `sky api status`"
            )
        time.sleep(0.5)

"""Managed jobs on disk, for the sky stand-in (sky_jobs.py's docstring): `jobs/<id>/` under the state
dir, each job's record (`job.json`), one log, its attempts' clusters; a job whose controller died is
FAILED_CONTROLLER when next looked at. For tests: `job_record`, `preempt_job`, `shutdown_jobs`,
`stop_controller`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.fakes.sky_proc import (
    POLL_S,
    _alive,
    _kill_node,
    _kill_session,
    _locked,
    _read_json,
    _write_json,
    controller_name,
)


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
                _kill_node(attempt["cluster_dir"], attempt["pid"], attempt["start"])
            attempt.update(ended_at=now, outcome="controller_failed")
        rec.update(
            status="FAILED_CONTROLLER",
            end_at=rec.get("end_at") or now,
            schedule_state="DONE",
            done=True,
            failure_reason="Controller process has exited abnormally (Controller process is dead). For "
            f"more details, run: sky jobs logs --controller {rec['job_id']}",
        )
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
        "job_id": rec["job_id"],
        "task_id": 0,
        "job_name": rec["job_name"],
        "task_name": rec["task_name"],
        "job_duration": _job_duration(rec, now),
        "workspace": "default",
        "status": status,
        "schedule_state": rec["schedule_state"],
        "resources": rec["resources"],
        "recovery_count": rec["recovery_count"],
        "details": details,
        "failure_reason": rec["failure_reason"],
        "user_name": rec["user_name"],
        "user_hash": rec["user_hash"],
        "submitted_at": rec["submitted_at"],
        "start_at": rec["start_at"],
        "end_at": rec["end_at"],
        "last_recovered_at": rec["last_recovered_at"],
        "user_yaml": rec["user_yaml"],
        "run_timestamp": rec.get("run_timestamp"),
        "priority": rec["priority"],
        "pool": None,
        "current_cluster_name": rec["cluster_name"],
        "is_job_group": False,
        "controller_pid": (rec.get("controller") or {}).get("pid"),
    }
    cloud, region, zone = placement.get("cloud"), placement.get("region"), placement.get("zone")
    if _live_attempt(rec) is not None and placement:  # read from the live cluster's handle
        simple, full = placement["shown"]  # SkyPilot's own formatter made them (sky_attempts.launched_shown)
        row.update(
            cluster_resources=simple,
            cluster_resources_full=full,
            cloud=cloud,
            region=region,
            zone=zone,
            infra=infra_utils.InfraInfo(cloud, region, zone).formatted_str(),
            accelerators=placement.get("accelerators"),
            cluster_name_on_cloud=rec["cluster_name"],
            internal_external_ips=[("127.0.0.1", "127.0.0.1")],
        )
    else:  # no cluster: the last cached infra, and the requested resources if it ever launched
        cached = rec["resources"] if cloud else None
        row.update(
            infra=infra_utils.InfraInfo(cloud, region, zone).formatted_str(),
            cloud=cloud or "-",
            region=region or "-",
            zone=zone or "-",
            cluster_resources=cached or "-",
            cluster_resources_full=cached or "-",
        )
    return row


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
    failed / failed_setup / driver_failed / preempted / cancelled / controller_failed — exit_code,
    and after a graceful cancel sigterm_at / sigterm_to: when, and to how many processes), task_id_env (SKYPILOT_TASK_ID), and job_duration (the sum of the attempts' run times)."""
    jobdir = _job_dir(Path(state_dir), job_id)
    rec = _refresh_dead_controller(jobdir) if jobdir is not None else None
    if rec is not None:
        rec["job_duration"] = _job_duration(rec, time.time())
    return rec


def preempt_job(state_dir: Path, job_id: int, timeout_s: float = 30.0, spot_gone: bool = False) -> None:
    """Preempt a managed job: its current attempt's instance is lost (every process of the attempt's
    node is SIGKILLed, no signal first). `spot_gone`: spot has no capacity from now on, so the
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
            _kill_node(attempt["cluster_dir"], attempt["pid"], attempt["start"])
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"stand-in: managed job {job_id} has no running attempt to preempt (status {rec['status']})"
            )
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
            _kill_node(attempt["cluster_dir"], attempt["pid"], attempt["start"])

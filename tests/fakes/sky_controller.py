"""A managed job's controller, for the sky stand-in (what it emulates: sky_jobs.py's docstring): a
detached process (its own session) that runs the job's attempts, each on a fresh cluster directory,
recovering from preemptions and user failures, retrying what SkyPilot retries, and cancelling when
the job's signal file says so.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from tests.fakes.sky_attempts import _Attempts
from tests.fakes.sky_job_state import _live_attempt, _terminal, _update_job
from tests.fakes.sky_proc import _kill_node, _locked, _read_json, _write_json


class _Controller(_Attempts):
    """One managed job's controller: a detached process (its own session) that runs the job's
    attempts, each on a fresh cluster directory, recovering from preemptions and user failures."""

    def __init__(self, jobdir: Path) -> None:
        self.dir = jobdir
        self.job_id = int(jobdir.name)
        self.log = (jobdir / "controller.log").open("a", encoding="utf-8", buffering=1)
        self.placement: dict[str, Any] | None = None
        self.current: dict[str, Any] | None = None  # the running attempt

    def say(self, line: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} stand-in controller: {line}\n")

    def user_log(self, line: str) -> None:
        """A line of the job's own log (between attempts only: no attempt is writing then)."""
        with (self.dir / "job.log").open("a", encoding="utf-8") as log:
            log.write(f"stand-in: {line}\n")

    def update(self, mutate: Any = None, **changes: Any) -> dict[str, Any]:
        return _update_job(self.dir, mutate, **changes)

    def cancel_signal(self) -> dict[str, Any] | None:
        if not self.dir.is_dir():  # the state dir was removed under us (a test's tmp dir): nothing to run for
            if self.current is not None:
                _kill_node(self.current["cluster_dir"], self.current["pid"], self.current["start"])
            os._exit(0)
        return _read_json(self.dir / "cancel.json")

    def finish(self, status: str, failure_reason: str | None = None) -> None:
        now = time.time()

        def mutate(rec: dict[str, Any]) -> None:
            attempt = _live_attempt(rec)
            if attempt is not None:
                attempt.setdefault("outcome", status.lower())
                attempt["ended_at"] = now
            if failure_reason is not None:
                rec["failure_reason"] = failure_reason
            rec.update(status=status, end_at=now, schedule_state="DONE", backoff=None, done=True)

        self.update(mutate)
        self.say(f"job {self.job_id} finished: {status}")

    # -- the job's life

    def begin(self, payload: dict[str, Any]) -> tuple[int, list[int]] | None:
        """The job's start: its DAG and the environment every attempt gets, STARTING on disk; the
        restart limits (max_restarts_on_errors, recover_on_exit_codes), or None if it was cancelled."""
        from sky.skylet import constants as sky_constants
        from sky.utils import common_utils, dag_utils

        from sky import sky_logging

        self.payload = payload
        self.dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # as the controller loads the job's DAG
        [self.task] = self.dag.tasks
        run_timestamp = sky_logging.get_run_timestamp()
        task_id_env = common_utils.get_global_job_id(
            run_timestamp, self.dag.name, str(self.job_id), task_id=0, is_managed_job=True
        )
        # Fixed once for the job's life: every attempt (every recovery) gets the same values.
        self.task.update_envs(
            {
                sky_constants.TASK_ID_ENV_VAR: task_id_env,
                sky_constants.TASK_ID_LIST_ENV_VAR: task_id_env,
                sky_constants.MANAGED_JOB_ID_ENV_VAR: str(self.job_id),
                "SKYPILOT_JOB_RANK": "0",
            }
        )
        self.task.envs.pop(sky_constants.ROOT_JOB_ID_ENV_VAR, None)
        recovery = list(self.task.resources)[0].job_recovery
        recovery = dict(recovery) if isinstance(recovery, dict) else {"strategy": recovery}
        max_restarts = int(recovery.get("max_restarts_on_errors") or 0)
        codes = recovery.get("recover_on_exit_codes")
        recover_codes = [codes] if isinstance(codes, int) else [int(c) for c in (codes or [])]
        with _locked(self.dir / ".lock"):
            rec = _read_json(self.dir / "job.json")
            if rec["status"] == "CANCELLED":  # cancelled while PENDING
                rec["done"] = True
                _write_json(self.dir / "job.json", rec)
                return None
            rec.update(
                status="STARTING",
                schedule_state="LAUNCHING",
                submitted_at=time.time(),
                run_timestamp=run_timestamp,
                task_id_env=task_id_env,
            )
            _write_json(self.dir / "job.json", rec)
        self.say(f"job {self.job_id} ({self.dag.name!r}) starting; SKYPILOT_TASK_ID={task_id_env}")
        return max_restarts, recover_codes

    def run(self, payload: dict[str, Any]) -> None:
        limits = self.begin(payload)
        if limits is None:  # cancelled while PENDING
            return
        max_restarts, recover_codes = limits
        restarts = 0
        while True:
            started = self.launch_attempt()
            if started is None:  # cancelled, or it cannot launch at all: the job has ended
                return
            proc, attempt = started
            outcome, code = self.watch(proc, attempt)
            if outcome == "cancelled":
                return
            if outcome == "succeeded":
                self.finish("SUCCEEDED")
                return
            if outcome == "preempted":
                self.recover(
                    f"the job cluster of attempt {attempt['attempt']} was preempted; recovering the job "
                    "on a fresh cluster"
                )
                continue
            # The user's program failed (run or setup exited non-zero, or its driver died).
            exit_codes = [code] if code is not None else None
            matching = [c for c in exit_codes or [] if c in recover_codes]
            if matching:
                self.recover(
                    f"exit code(s) {matching} matched recover_on_exit_codes {recover_codes}; restarting "
                    "the job on a fresh cluster"
                )
                continue
            restarts += 1
            if restarts <= max_restarts:
                desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
                self.recover(
                    f"{desc}. Restarting the job (restart {restarts} of {max_restarts} on errors) on a fresh cluster"
                )
                continue
            details = f"To see the details, run: sky jobs logs --controller {self.job_id}"
            if outcome == "driver_failed":
                details = (
                    "The job driver on the remote cluster failed. This can be caused by the job taking too "
                    "much memory or other resources. Try adding more memory, CPU, or disk in your job "
                    f"definition. {details}"
                )
            desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
            self.finish(
                "FAILED_SETUP" if outcome == "failed_setup" else "FAILED", f"{desc} (user program failure). {details}"
            )
            return

    def recover(self, why: str) -> None:
        self.user_log(why)
        self.say(why)
        self.update(status="RECOVERING", schedule_state="LAUNCHING")


def run_controller(jobdir: Path, data: bytes | None = None) -> None:
    """The job controller's entry point: the job's DAG (secrets and all) arrives on stdin (or from the executor)."""
    payload = pickle.loads(sys.stdin.buffer.read() if data is None else data)
    controller = _Controller(jobdir)
    try:
        controller.run(payload)
    except BaseException:  # noqa: BLE001 - a crashed controller fails its job, as SkyPilot's does
        import traceback

        controller.say(traceback.format_exc())
        rec = _read_json(jobdir / "job.json") or {}
        attempt = _live_attempt(rec)
        if attempt is not None and attempt.get("pid"):
            _kill_node(attempt["cluster_dir"], attempt["pid"], attempt["start"])
        if not _terminal(rec):
            controller.finish(
                "FAILED_CONTROLLER",
                "Controller process has exited abnormally (stand-in: see "
                f"{jobdir / 'controller.log'}). For more details, run: "
                f"sky jobs logs --controller {jobdir.name}",
            )
        raise

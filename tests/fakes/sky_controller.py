"""A managed job's controller, for the sky stand-in (what it emulates: sky_jobs.py's docstring): a
detached process (its own session) that runs the job's attempts, each on a fresh cluster directory,
recovering from preemptions and user failures, retrying what SkyPilot retries, and cancelling when
the job's signal file says so.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.fakes.sky_job_state import _live_attempt, _terminal, _update_job
from tests.fakes.sky_proc import (CAPACITY_RETRY_S, PLACEMENT, POLL_S, _accelerators_str, _kill_session, _locked,
                                  _optimizer_pick, _read_json, _session_alive, _spawn_job, _start_time,
                                  _term_session, _write_json)

# How often a job's controller looks for a cancel signal. SkyPilot's controller polls every 15 s;
# the stand-in polls faster so that tests stay short (the order of events is the same).
JOBS_CANCEL_POLL_S = 0.5
# graceful cancel with graceful_timeout=None: SkyPilot 0.14.1 SIGTERMs every process of the run's
# tree, then SIGKILLs what is left 30 s later; so does the stand-in (it gave 10 s to the job's
# process group alone before issue 29, so a final push saw neither the same signal nor the same time).
GRACEFUL_CANCEL_TIMEOUT_S = 30.0


class _Prechecks(Exception):
    """SkyPilot's ProvisionPrechecksError: the job cannot launch at all (FAILED_PRECHECKS)."""

    def __init__(self, reasons: list[BaseException]) -> None:
        super().__init__(reasons)
        self.reasons = reasons


class _Controller:
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
                _kill_session(self.current["pid"], self.current["start"])
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
        from sky import sky_logging
        from sky.skylet import constants as sky_constants
        from sky.utils import common_utils, dag_utils

        self.payload = payload
        self.dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # as the controller loads the job's DAG
        [self.task] = self.dag.tasks
        run_timestamp = sky_logging.get_run_timestamp()
        task_id_env = common_utils.get_global_job_id(run_timestamp, self.dag.name, str(self.job_id), task_id=0,
                                                     is_managed_job=True)
        # Fixed once for the job's life: every attempt (every recovery) gets the same values.
        self.task.update_envs({sky_constants.TASK_ID_ENV_VAR: task_id_env,
                               sky_constants.TASK_ID_LIST_ENV_VAR: task_id_env,
                               sky_constants.MANAGED_JOB_ID_ENV_VAR: str(self.job_id), "SKYPILOT_JOB_RANK": "0"})
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
            rec.update(status="STARTING", schedule_state="LAUNCHING", submitted_at=time.time(),
                       run_timestamp=run_timestamp, task_id_env=task_id_env)
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
                self.recover(f"the job cluster of attempt {attempt['attempt']} was preempted; recovering the job "
                             "on a fresh cluster")
                continue
            # The user's program failed (run or setup exited non-zero, or its driver died).
            exit_codes = [code] if code is not None else None
            matching = [c for c in exit_codes or [] if c in recover_codes]
            if matching:
                self.recover(f"exit code(s) {matching} matched recover_on_exit_codes {recover_codes}; restarting "
                             "the job on a fresh cluster")
                continue
            restarts += 1
            if restarts <= max_restarts:
                desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
                self.recover(f"{desc}. Restarting the job (restart {restarts} of {max_restarts} on errors) on a "
                             "fresh cluster")
                continue
            details = f"To see the details, run: sky jobs logs --controller {self.job_id}"
            if outcome == "driver_failed":
                details = ("The job driver on the remote cluster failed. This can be caused by the job taking too "
                           "much memory or other resources. Try adding more memory, CPU, or disk in your job "
                           f"definition. {details}")
            desc = f"Job exited with exit code {code}" if code is not None else "Job failed (FAILED_DRIVER)"
            self.finish("FAILED_SETUP" if outcome == "failed_setup" else "FAILED",
                        f"{desc} (user program failure). {details}")
            return

    def recover(self, why: str) -> None:
        self.user_log(why)
        self.say(why)
        self.update(status="RECOVERING", schedule_state="LAUNCHING")

    def launch_attempt(self) -> tuple[subprocess.Popen[bytes], dict[str, Any]] | None:
        """Launch the next attempt on a fresh cluster, retrying (forever, as SkyPilot's first launch
        does) what may succeed later; None if the job ended instead (cancelled, FAILED_PRECHECKS)."""
        from sky import exceptions, execution
        from sky.utils import common_utils

        while True:
            signal_ = self.cancel_signal()
            if signal_ is not None:
                self.update(status="CANCELLING")
                self.finish("CANCELLED")
                return None
            try:
                execution._resolve_managed_secrets(self.dag)  # noqa: SLF001 - what the controller's launch does
                if self.payload["capacity"]:
                    wanted = _accelerators_str(self._candidates()[0].accelerators) or "CPU"
                    raise exceptions.ResourcesUnavailableError(
                        f"Failed to acquire resources ({wanted}) in every zone of {PLACEMENT['cloud']}.",
                        failover_history=[exceptions.ResourcesUnavailableError("stand-in: no capacity")])
                if self.placement is None:
                    self.placement = self.optimize()
                elif self.placement["use_spot"] and (self.dir / "no-spot").exists():
                    # Spot has no capacity now: SkyPilot's recovery relaunches the task's resources
                    # in their order, and the next candidate (on-demand) is what launches.
                    self.placement = self.optimize(on_demand_only=True)
            except _Prechecks as err:
                reason = "; ".join(common_utils.format_exception(r, use_bracket=True) for r in err.reasons)
                self.say(f"Provision prechecks failed: {reason}")
                self.finish("FAILED_PRECHECKS", reason)
                return None
            except Exception as err:  # noqa: BLE001 - SkyPilot retries the launch after any other failure
                self.say(f"Failed to launch a cluster with error: {common_utils.format_exception(err)}; retrying "
                         f"in {CAPACITY_RETRY_S:.0f}s")
                self.update(schedule_state="ALIVE_BACKOFF", backoff=common_utils.format_exception(err))
                deadline = time.monotonic() + CAPACITY_RETRY_S
                while time.monotonic() < deadline and self.cancel_signal() is None:
                    time.sleep(JOBS_CANCEL_POLL_S)
                continue
            return self.start_attempt()

    def _candidates(self) -> list[Any]:
        return list(self.task.resources)

    def optimize(self, on_demand_only: bool = False) -> dict[str, Any]:
        """Where the attempts run: SkyPilot's optimizer's pick among the candidates (an `ordered`
        list in order, `any_of` the cheapest), from the session's API server as plain launches;
        `on_demand_only`: among those that are not spot (spot has no capacity)."""
        from sky import exceptions
        from sky.utils import dag_utils

        [task] = dag_utils.load_dag_from_yaml_str(self.payload["dag_yaml"]).tasks  # a fresh copy
        # The controller strips job_recovery before launching (StrategyExecutor.make).
        kept = [r.copy(job_recovery=None) for r in task.resources if not (on_demand_only and r.use_spot)]
        if not kept:
            raise exceptions.ResourcesUnavailableError(
                "Failed to acquire resources: spot has no capacity and the task has no on-demand candidate.",
                failover_history=[exceptions.ResourcesUnavailableError("stand-in: no spot capacity")])
        task.set_resources(type(task.resources)(kept))
        try:
            pick = _optimizer_pick(task)
        except exceptions.ResourcesUnavailableError as err:
            if not any(isinstance(e, exceptions.ResourcesUnavailableError) for e in err.failover_history):
                raise _Prechecks(list(err.failover_history) or [err]) from err
            raise
        except (exceptions.InvalidClusterNameError, exceptions.NoCloudAccessError,
                exceptions.ResourcesMismatchError) as err:
            raise _Prechecks([err]) from err
        candidates = [r for r in self._candidates() if not (on_demand_only and r.use_spot)]
        chosen = next((r for r in candidates if bool(r.use_spot) == pick.use_spot
                       and _accelerators_str(dict(r.accelerators) if r.accelerators else None) == pick.accelerators),
                      None) or next((r for r in candidates if bool(r.use_spot) == pick.use_spot), candidates[0])
        placement = {"cloud": pick.cloud, "region": pick.region, "zone": None, "instance_type": pick.instance_type,
                     "use_spot": bool(chosen.use_spot),
                     "accelerators": dict(chosen.accelerators) if chosen.accelerators else None}
        self.say(f"optimizer's pick: {placement}")
        return placement

    def start_attempt(self) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        assert self.placement is not None
        rec = _read_json(self.dir / "job.json")
        number = len(rec["attempts"]) + 1
        cdir = self.dir / "attempts" / str(number)
        cdir.mkdir(parents=True)
        launched_at = time.time()
        shutil.copytree(self.payload["app_dir"], cdir / "app", symlinks=True)
        (cdir / "home").mkdir()
        cluster = rec["cluster_name"]
        info = {"cluster_name": cluster, "cloud": self.placement["cloud"], "region": self.placement["region"],
                "zone": self.placement["zone"]}
        proc = _spawn_job(self.task, cdir, self.placement["accelerators"], self.payload["cluster_env"],
                          has_setup=bool(self.task.setup), log_path=self.dir / "job.log", append=True,
                          extra_env={"SKYPILOT_CLUSTER_INFO": json.dumps(info)})
        now = time.time()
        attempt = {"attempt": number, "cluster_dir": str(cdir), "cluster_name": cluster, "launched_at": launched_at,
                   "started_at": now, "ended_at": None, "pid": proc.pid, "start": _start_time(proc.pid),
                   "use_spot": self.placement["use_spot"], "accelerators": self.placement["accelerators"]}

        def mutate(rec: dict[str, Any]) -> None:
            if rec["status"] == "RECOVERING":
                rec["recovery_count"] += 1  # counted once the job is running again, as SkyPilot counts it
            if rec["start_at"] is None:
                rec["start_at"] = now
            rec["attempts"].append(attempt)
            rec.update(status="RUNNING", last_recovered_at=now, schedule_state="ALIVE", backoff=None,
                       placement=self.placement)

        self.current = attempt
        self.update(mutate)
        self.say(f"attempt {number} running on a fresh cluster {cdir}")
        return proc, attempt

    def watch(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any]) -> tuple[str, int | None]:
        """Until the attempt's job ends or a cancel arrives: (outcome, exit code)."""
        next_check = 0.0
        while True:
            if time.monotonic() >= next_check:
                signal_ = self.cancel_signal()
                if signal_ is not None:
                    self.cancel(proc, attempt, signal_)
                    return "cancelled", None
                next_check = time.monotonic() + JOBS_CANCEL_POLL_S
            if proc.poll() is not None:
                break
            time.sleep(POLL_S)
        cdir = Path(attempt["cluster_dir"])
        done = _read_json(cdir / "job.exit")
        if done is not None:
            code = int(done["exit"])
            outcome = "succeeded" if code == 0 and not done["setup_failed"] else (
                "failed_setup" if done["setup_failed"] else "failed")
        elif (cdir / "preempted").exists():
            outcome, code = "preempted", None
        else:  # killed without a word: SkyPilot's FAILED_DRIVER
            outcome, code = "driver_failed", None
        self.end_attempt(proc, attempt, outcome, code)
        return outcome, code

    def end_attempt(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any], outcome: str,
                    code: int | None) -> None:
        """The attempt's cluster is torn down: whatever still runs there dies with it, its disk goes."""
        _kill_session(proc.pid, attempt["start"])
        proc.wait()
        self.current = None
        now = time.time()

        def mutate(rec: dict[str, Any]) -> None:
            rec["attempts"][attempt["attempt"] - 1].update(ended_at=now, outcome=outcome, exit_code=code)

        self.update(mutate)
        cdir = Path(attempt["cluster_dir"])
        for disk in ("home", "app"):
            shutil.rmtree(cdir / disk, ignore_errors=True)
        self.say(f"attempt {attempt['attempt']} ended: {outcome} (exit code {code}); its cluster is torn down")

    def cancel(self, proc: subprocess.Popen[bytes], attempt: dict[str, Any], signal_: dict[str, Any]) -> None:
        """Non-graceful: the cluster is torn down with the job on it (no signal first). Graceful: SIGTERM
        to every process of the job's session, then up to graceful_timeout (30 s) for it to exit."""
        self.update(status="CANCELLING")
        self.say(f"cancelling job {self.job_id} (graceful={signal_.get('graceful')})")
        if signal_.get("graceful") and proc.poll() is None:
            _term_session(proc.pid)
            timeout = signal_.get("graceful_timeout")
            deadline = time.monotonic() + (GRACEFUL_CANCEL_TIMEOUT_S if timeout is None else float(timeout))
            while _session_alive(proc.pid) and time.monotonic() < deadline:
                proc.poll()
                time.sleep(POLL_S)
        self.end_attempt(proc, attempt, "cancelled", None)
        self.finish("CANCELLED")


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
            _kill_session(attempt["pid"], attempt["start"])
        if not _terminal(rec):
            controller.finish("FAILED_CONTROLLER", "Controller process has exited abnormally (stand-in: see "
                                                   f"{jobdir / 'controller.log'}). For more details, run: "
                                                   f"sky jobs logs --controller {jobdir.name}")
        raise

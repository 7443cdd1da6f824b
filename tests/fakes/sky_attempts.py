"""A managed job's attempts, for the sky stand-in's controller (tests/fakes/sky_controller.py):
each on a fresh cluster directory, placed by the optimizer (spot first, then on-demand), watched
until it ends, and cancelled the way SkyPilot 0.14.1 cancels one. A mixin of the controller.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.fakes.sky_proc import (
    CAPACITY_RETRY_S,
    PLACEMENT,
    POLL_S,
    _accelerators_str,
    _kill_node,
    _optimizer_pick,
    _read_json,
    _spawn_job,
    _start_time,
    _term_node,
)

# How often a job's controller looks for a cancel signal. SkyPilot's controller polls every 15 s;
# the stand-in polls faster so that tests stay short (the order of events is the same).
JOBS_CANCEL_POLL_S = 0.5


def launched_shown(chosen: Any, pick: Any) -> list[str]:
    """What SkyPilot's job record shows of the attempt's cluster (cluster_resources and its _full):
    SkyPilot's own formatter (sky/utils/resources_utils.py get_readable_resources_repr, as
    sky/jobs/utils.py fills the record from the live handle) on the candidate launched where the
    optimizer placed it, so the stand-in writes `1x[spot](gpus=T4:1, ...)` exactly as SkyPilot does."""
    from types import SimpleNamespace

    from sky.utils import resources_utils

    infra = "/".join(str(part).lower() for part in (pick.cloud, pick.region) if part)
    launched = chosen.copy(infra=infra, instance_type=pick.instance_type, job_recovery=None)
    handle = SimpleNamespace(launched_resources=launched, launched_nodes=1, cached_cluster_info=None)
    return list(resources_utils.get_readable_resources_repr(handle, simplified_only=False))


class _Prechecks(Exception):
    """SkyPilot's ProvisionPrechecksError: the job cannot launch at all (FAILED_PRECHECKS)."""

    def __init__(self, reasons: list[BaseException]) -> None:
        super().__init__(reasons)
        self.reasons = reasons


class _Attempts:
    """The controller's attempts (its state, `say`, `update` and the rest are the controller's)."""

    def launch_attempt(self) -> tuple[subprocess.Popen[bytes], dict[str, Any]] | None:
        """Launch the next attempt on a fresh cluster, retrying (forever, as SkyPilot's first launch
        does) what may succeed later; None if the job ended instead (cancelled, FAILED_PRECHECKS)."""
        from sky.utils import common_utils

        from sky import exceptions, execution

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
                        failover_history=[exceptions.ResourcesUnavailableError("stand-in: no capacity")],
                    )
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
                self.say(
                    f"Failed to launch a cluster with error: {common_utils.format_exception(err)}; retrying "
                    f"in {CAPACITY_RETRY_S:.0f}s"
                )
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
        from sky.utils import dag_utils

        from sky import exceptions

        [task] = dag_utils.load_dag_from_yaml_str(self.payload["dag_yaml"]).tasks  # a fresh copy
        # The controller strips job_recovery before launching (StrategyExecutor.make).
        kept = [r.copy(job_recovery=None) for r in task.resources if not (on_demand_only and r.use_spot)]
        if not kept:
            raise exceptions.ResourcesUnavailableError(
                "Failed to acquire resources: spot has no capacity and the task has no on-demand candidate.",
                failover_history=[exceptions.ResourcesUnavailableError("stand-in: no spot capacity")],
            )
        task.set_resources(type(task.resources)(kept))
        try:
            pick = _optimizer_pick(task)
        except exceptions.ResourcesUnavailableError as err:
            if not any(isinstance(e, exceptions.ResourcesUnavailableError) for e in err.failover_history):
                raise _Prechecks(list(err.failover_history) or [err]) from err
            raise
        except (
            exceptions.InvalidClusterNameError,
            exceptions.NoCloudAccessError,
            exceptions.ResourcesMismatchError,
        ) as err:
            raise _Prechecks([err]) from err
        candidates = [r for r in self._candidates() if not (on_demand_only and r.use_spot)]
        chosen = next(
            (
                r
                for r in candidates
                if bool(r.use_spot) == pick.use_spot
                and _accelerators_str(dict(r.accelerators) if r.accelerators else None) == pick.accelerators
            ),
            None,
        ) or next((r for r in candidates if bool(r.use_spot) == pick.use_spot), candidates[0])
        placement = {
            "cloud": pick.cloud,
            "region": pick.region,
            "zone": None,
            "instance_type": pick.instance_type,
            "use_spot": bool(chosen.use_spot),
            "accelerators": dict(chosen.accelerators) if chosen.accelerators else None,
            "shown": launched_shown(chosen, pick),
        }
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
        info = {
            "cluster_name": cluster,
            "cloud": self.placement["cloud"],
            "region": self.placement["region"],
            "zone": self.placement["zone"],
        }
        proc = _spawn_job(
            self.task,
            cdir,
            self.placement["accelerators"],
            self.payload["cluster_env"],
            has_setup=bool(self.task.setup),
            log_path=self.dir / "job.log",
            append=True,
            extra_env={"SKYPILOT_CLUSTER_INFO": json.dumps(info)},
        )
        now = time.time()
        attempt = {
            "attempt": number,
            "cluster_dir": str(cdir),
            "cluster_name": cluster,
            "launched_at": launched_at,
            "started_at": now,
            "ended_at": None,
            "pid": proc.pid,
            "start": _start_time(proc.pid),
            "use_spot": self.placement["use_spot"],
            "accelerators": self.placement["accelerators"],
        }

        def mutate(rec: dict[str, Any]) -> None:
            if rec["status"] == "RECOVERING":
                rec["recovery_count"] += 1  # counted once the job is running again, as SkyPilot counts it
            if rec["start_at"] is None:
                rec["start_at"] = now
            rec["attempts"].append(attempt)
            rec.update(
                status="RUNNING", last_recovered_at=now, schedule_state="ALIVE", backoff=None, placement=self.placement
            )

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
            outcome = (
                "succeeded"
                if code == 0 and not done["setup_failed"]
                else ("failed_setup" if done["setup_failed"] else "failed")
            )
        elif (cdir / "preempted").exists():
            outcome, code = "preempted", None
        else:  # killed without a word: SkyPilot's FAILED_DRIVER
            outcome, code = "driver_failed", None
        self.end_attempt(proc, attempt, outcome, code)
        return outcome, code

    def end_attempt(
        self, proc: subprocess.Popen[bytes], attempt: dict[str, Any], outcome: str, code: int | None
    ) -> None:
        """The attempt's cluster is torn down: whatever still runs there dies with it, its disk goes."""
        _kill_node(attempt["cluster_dir"], proc.pid, attempt["start"])
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
        """As SkyPilot 0.14.1 cancels a running managed job: the controller's cleanup of the cancelled
        job (sky/jobs/controller.py `_cleanup`) calls sky/jobs/utils.py `terminate_cluster`, which is
        sky/core.py `down(cluster, graceful=...)`. Non-graceful: `backend.teardown`, the job dies with
        its machine (no signal first). Graceful: `_graceful_job_cancel` first sends SIGTERM
        (sky/skylet/job_lib.py `cancel_jobs`: os.killpg, and nothing waits for the job to exit), flushes
        MOUNT_CACHED uploads (graceful_timeout bounds that flush, not the job; there are none here),
        then the same teardown: the machine is deleted right after the SIGTERM, whether or not the job
        finished what the signal started (a final checkpoint push). So here: SIGTERM to every process
        of the node, then the teardown at once."""
        self.update(status="CANCELLING")
        self.say(f"cancelling job {self.job_id} (graceful={signal_.get('graceful')})")
        if signal_.get("graceful") and proc.poll() is None:
            signalled, at = _term_node(attempt["cluster_dir"], proc.pid), time.time()
            self.update(lambda rec: rec["attempts"][attempt["attempt"] - 1].update(sigterm_at=at, sigterm_to=signalled))
            self.say(f"SIGTERM to {signalled} process(es) of attempt {attempt['attempt']}; tearing its cluster down")
        self.end_attempt(proc, attempt, "cancelled", None)
        self.finish("CANCELLED")

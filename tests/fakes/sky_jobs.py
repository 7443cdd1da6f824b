"""`fake.jobs`: SkyPilot's managed jobs (`sky.jobs`) as the sky stand-in emulates them (sky_standin.py).
The client is here; the API server's half is sky_jobs_worker.py, a job's controller sky_controller.py,
the jobs on disk sky_job_state.py.

Managed jobs (`fake.jobs`: `launch`, `queue_v2`, `queue`, `cancel`, `tail_logs`, each bound
against the real `sky.jobs.<name>`, and the real client's request body built to validate the
arguments; `calls` records them as ("jobs.launch", job name), ("jobs.cancel", "1,2" / name /
"all"), ("jobs.tail_logs", job id or name), ("jobs.queue_v2", None), ...):
- `jobs.launch` does what the real client does (`convert_entrypoint_to_dag`, the job name,
  SkyPilot's own `sdk.validate` against the session's API server — a bad job_recovery strategy
  is its ValueError, raised by the call — then `dump_dag_to_yaml_str`). The worker does the
  server's part with SkyPilot's code (`maybe_infer_and_fill_dag_and_task_names`,
  `fill_default_config_in_dag_for_job_launch`: differing job_recovery across the candidates is
  its ValueError from `get`), allocates the job id (1, 2, ... under a lock) and starts the job's
  controller, a detached process (its own session): a killed client leaves the job running.
  `get` yields `([job_id], None)`: there is no controller cluster, so no controller handle.
  Several candidate resources (`ordered`, `any_of`, an accelerator list) are accepted here:
  SkyPilot's optimizer (the session's API server) picks once per job, and every attempt runs on
  that pick (`ordered`: the first launchable entry, e.g. spot before on-demand; `any_of`: the
  cheapest). The pick's cloud and region are the job's; zone is None.
- The controller runs the job PENDING -> STARTING -> RUNNING. Each attempt is a FRESH cluster
  directory (`jobs/<id>/attempts/<n>/`: fresh `home/`, fresh copy of the image the job was
  submitted with) running setup then run exactly as a plain cluster's job, with the same
  environment rules plus the controller's SKYPILOT_TASK_ID / SKYPILOT_TASK_IDS (the same for
  every attempt), SKYPILOT_MANAGED_JOB_ID, SKYPILOT_JOB_RANK=0, SKYPILOT_NUM_JOBS=1 and
  SKYPILOT_CLUSTER_INFO; the task's envs are those of the submit, for every attempt. Every
  attempt appends to ONE log (`jobs/<id>/job.log`, what `tail_logs` streams), in order, with a
  `stand-in: ...` line between attempts saying why the job recovered. An ended attempt's
  cluster is torn down: every process of its node is killed (whatever session it made: torchrun's
  ranks make their own), its home/ and app/ removed.
- `preempt_job(state_dir, job_id)` (or `python tests/fakes/sky_standin.py preempt <state_dir> <id>`)
  loses the current attempt's instance: every process of its node SIGKILLed. The controller
  sees the cluster gone: RECOVERING, then a new attempt; unlimited, as for real.
  `recovery_count` counts every recovery and restart, once the job is RUNNING again.
- A user failure (run or setup exits non-zero; the job's bash killed by anything but
  `preempt_job` is SkyPilot's FAILED_DRIVER) restarts the job on a fresh attempt while restarts
  <= job_recovery.max_restarts_on_errors (default 0); an exit code in recover_on_exit_codes
  restarts without counting. Otherwise FAILED (setup: FAILED_SETUP), with SkyPilot's
  failure_reason ("Job exited with exit code N (user program failure). To see the details,
  run: sky jobs logs --controller <id>"). Exit 0: SUCCEEDED.
- What SkyPilot's controller retries forever stays STARTING (or RECOVERING) in backoff here too,
  retried every CAPACITY_RETRY_S: a secret without a value (SkyPilot's own RuntimeError, in
  `jobs/<id>/controller.log`), no capacity (`capacity=True`). A launch the optimizer refuses
  (e.g. an accelerator no catalog has) is FAILED_PRECHECKS. `no_cloud=True`: `jobs.launch`
  fails with NoCloudAccessError (the jobs controller itself cannot be launched). A controller
  that dies makes its job FAILED_CONTROLLER (its cluster torn down) when next looked at.
- `jobs.cancel` (exactly one of job_ids / name / all(_users), SkyPilot's ValueError otherwise;
  a terminal job is skipped, a PENDING one cancelled at once) writes a signal file that the
  controller polls every JOBS_CANCEL_POLL_S (0.5 s; real: 15 s): CANCELLING, then the attempt is
  SIGKILLed with its cluster (no signal first), CANCELLED. graceful=True: SIGTERM to every process of
  the attempt's node at once (the run's tree, as SkyPilot signals it), then the same teardown at once:
  SkyPilot 0.14.1's graceful cancel does not wait for the job (graceful_timeout bounds its flush of
  MOUNT_CACHED uploads, of which there are none here; sky_attempts.py `cancel` cites the code).
- `jobs.queue_v2` yields `(records, total, status_counts, total_no_filter)`: SkyPilot's own
  ManagedJobRecord through its own encoder/JSON/decoder, status the real ManagedJobStatus,
  newest first. `fields` as the real server honours it: unrequested fields are None (job_id,
  task_id, status always sent), fields=None sends all, an unknown field is SkyPilot's
  ValueError. Filled: job_id, task_id=0, job_name, task_name, status, schedule_state,
  recovery_count, submitted_at, start_at, end_at, last_recovered_at (-1 before the start),
  job_duration (the sum of the attempts' run times), failure_reason, details, resources
  (SkyPilot's string), cluster_resources(_full), cloud / region / zone / infra (the live
  cluster's, then the cached ones or '-'), workspace, user_name / user_hash, user_yaml
  (secrets redacted), priority, current_cluster_name. `jobs.queue` (v1, deprecated, logs the
  warning) gives a list with the default fields.
- `jobs.tail_logs` is not a request (as for real): it streams the one log from the start to
  output_stream (stdout if None), following across recoveries until the job is terminal, and
  returns the JobExitCode (0 SUCCEEDED, 100 any FAILED_*, 103 CANCELLED, 102 not found);
  follow=False writes what is there and returns None.
- `job_record(state_dir, job_id)` is the record on disk (`jobs/<id>/job.json`) with
  `attempts` (each one's launched/started/ended times, use_spot, outcome, exit code) and
  job_duration, for tests and billing checks; `shutdown_jobs(state_dir)` kills every
  controller and attempt (test cleanup).
- Refused (NotImplementedError): pools, num_jobs other than None/1, job groups and pipelines
  (explicit job_group, or launching from inside a job group), more than one node,
  `_need_confirmation`, workdir / file_mounts / storage / volumes, `queue_v2(sort_by=,
  sort_order=, infra_match=)`, `cancel(pool=, task=)`, `tail_logs(controller=True,
  tail_offset=, task=, preload_content=False)`. Not emulated: a recovery lands on the same
  placement (SkyPilot's EAGER_NEXT_REGION may move it to another region); the controller does
  not restart itself (emergency recovery); job clusters are not in `status()` nor
  `cost_report()` (their attempts' times are in the job's record); `jobs.wait` and
  `download_logs` are absent.
"""

from __future__ import annotations

import codecs
import inspect
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.fakes.sky_job_state import _job_dir, _job_ids, _nonterminal_job_ids_by_name, _refresh_dead_controller
from tests.fakes.sky_proc import JOB_NOT_FOUND, POLL_S, controller_name

if TYPE_CHECKING:
    from tests.fakes.sky_client import StrictSky


class _StrictJobs:
    """`sky.jobs` (managed jobs) as the stand-in emulates it: see the module docstring."""

    def __init__(self, owner: StrictSky) -> None:
        import sky.jobs as real_jobs

        self._sky = owner
        self._real = real_jobs
        self.ManagedJobStatus = real_jobs.ManagedJobStatus

    def _bind(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The real `sky.jobs.<name>`'s arguments for this call, defaults applied (TypeError as it would)."""
        bound = inspect.signature(getattr(self._real, name)).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    @staticmethod
    def _body(model: str, /, **fields: Any) -> None:
        """Build the real client's request body: its pydantic validation errors, as for real."""
        from sky.server.requests import payloads

        getattr(payloads, model)(**fields)

    def launch(self, *args: Any, **kwargs: Any) -> str:
        """Submit a managed job; a request id. `get` yields `([job_id], None)`: real SkyPilot gives
        the jobs controller's handle second; the stand-in has no controller cluster, so None."""
        a = self._bind("launch", args, kwargs)
        from sky.client import sdk as client_sdk
        from sky.jobs.client import sdk as jobs_sdk
        from sky.skylet import constants as sky_constants
        from sky.utils import dag_utils

        if a["pool"] is not None:
            raise NotImplementedError("stand-in: jobs.launch(pool=...): pools are not emulated")
        if a["num_jobs"] not in (None, 1):
            raise NotImplementedError(
                f"stand-in: jobs.launch(num_jobs={a['num_jobs']!r}): only one job per launch is emulated"
            )
        if a["_need_confirmation"]:
            raise NotImplementedError("stand-in: jobs.launch(_need_confirmation=True) is not emulated")
        group = a["job_group"]
        if isinstance(group, jobs_sdk._AutoJobGroup):  # noqa: SLF001 - the real default's own type
            if (
                os.environ.get(sky_constants.MANAGED_JOB_ID_ENV_VAR, "").isdigit()
                and os.environ.get(sky_constants.ROOT_JOB_ID_ENV_VAR, "").isdigit()
            ):
                raise NotImplementedError(
                    "stand-in: launching from inside a job group attaches the job to it; job groups are not emulated"
                )
        elif group is not None:
            raise NotImplementedError("stand-in: jobs.launch(job_group=...): job groups are not emulated")
        dag = dag_utils.convert_entrypoint_to_dag(a["task"])  # a deep copy, as the real client makes
        if a["name"] is not None:
            dag.name = a["name"]
        if len(dag.tasks) != 1 or getattr(dag, "is_job_group", lambda: False)():
            raise NotImplementedError(
                "stand-in: a managed job of more than one task (pipeline, job group) is not emulated"
            )
        [task] = dag.tasks
        if task.num_nodes > 1:
            raise NotImplementedError(f"stand-in: num_nodes={task.num_nodes}: more than one node is not emulated")
        client_sdk.validate(dag)  # SkyPilot's own: the client's file checks, then the API server's validation
        if task.workdir or task.file_mounts or task.storage_mounts or task.volumes:
            raise NotImplementedError(
                "stand-in: workdir, file_mounts, storage and volume mounts are not emulated (nothing would be uploaded)"
            )
        self._sky._record("jobs.launch", dag.name)
        dag_yaml = dag_utils.dump_dag_to_yaml_str(dag)
        args_on_disk = {
            "name": a["name"],
            "num_jobs": a["num_jobs"],
            "no_cloud": self._sky.no_cloud,
            "capacity": self._sky.capacity,
            "app_dir": str(self._sky.app_dir.resolve()),
            "controller_up_s": self._sky.controller_up_s,
            "job_name": dag.name,
        }
        return self._sky._submit(
            "jobs_launch",
            controller_name(),
            args_on_disk,
            secret_payload={"dag_yaml": dag_yaml, "cluster_env": self._sky.cluster_env},
        )

    def queue_v2(self, *args: Any, **kwargs: Any) -> str:
        """A request id; `get` yields `(records, total, status_counts, total_no_filter)` with
        SkyPilot's own ManagedJobRecord, `fields` honoured as the real server does."""
        a = self._bind("queue_v2", args, kwargs)
        for name in ("sort_by", "sort_order", "infra_match"):
            if a[name] is not None:
                raise NotImplementedError(f"stand-in: jobs.queue_v2({name}=...) is not emulated")
        fields = list(a["fields"]) if a["fields"] is not None else None
        self._body(
            "JobsQueueV2Body",
            refresh=a["refresh"],
            skip_finished=a["skip_finished"],
            all_users=a["all_users"],
            job_ids=a["job_ids"],
            limit=a["limit"],
            fields=fields,
            statuses=a["statuses"],
            submitted_after=a["submitted_after"],
            submitted_before=a["submitted_before"],
            name_match=a["name_match"],
        )
        self._sky._record("jobs.queue_v2", None)
        return self._sky._submit(
            "jobs_queue",
            controller_name(),
            {
                "refresh": a["refresh"],
                "controller_up_s": self._sky.controller_up_s,
                "version": 2,
                "skip_finished": a["skip_finished"],
                "job_ids": a["job_ids"],
                "limit": a["limit"],
                "fields": fields,
                "statuses": a["statuses"],
                "submitted_after": a["submitted_after"],
                "submitted_before": a["submitted_before"],
                "name_match": a["name_match"],
            },
        )

    def queue(self, *args: Any, **kwargs: Any) -> str:
        """Deprecated v1: `get` yields a list of records with the default fields (version=2: as queue_v2)."""
        a = self._bind("queue", args, kwargs)
        if a["version"] not in (1, 2):
            raise ValueError(f"Invalid queue version: {a['version']}. Must be 1 or 2.")
        if a["version"] == 2:
            return self.queue_v2(
                refresh=a["refresh"], skip_finished=a["skip_finished"], all_users=a["all_users"], job_ids=a["job_ids"]
            )
        from sky import sky_logging

        sky_logging.init_logger("sky.jobs.client.sdk").warning(
            "sky.jobs.queue(version=1) is deprecated and will be removed in v0.13. Use "
            "sky.jobs.queue(version=2) or sky.jobs.queue_v2() instead."
        )
        self._body(
            "JobsQueueBody",
            refresh=a["refresh"],
            skip_finished=a["skip_finished"],
            all_users=a["all_users"],
            job_ids=a["job_ids"],
        )
        self._sky._record("jobs.queue", None)
        return self._sky._submit(
            "jobs_queue",
            controller_name(),
            {
                "refresh": a["refresh"],
                "controller_up_s": self._sky.controller_up_s,
                "version": 1,
                "skip_finished": a["skip_finished"],
                "job_ids": a["job_ids"],
                "limit": None,
                "fields": None,
                "statuses": None,
                "submitted_after": None,
                "submitted_before": None,
                "name_match": None,
            },
        )

    def cancel(self, *args: Any, **kwargs: Any) -> str:
        """A request id; the cancel lands when the job's controller next polls (see JOBS_CANCEL_POLL_S)."""
        a = self._bind("cancel", args, kwargs)
        if a["pool"] is not None:
            raise NotImplementedError("stand-in: jobs.cancel(pool=...): pools are not emulated")
        if a["task"] is not None:
            raise NotImplementedError(
                "stand-in: jobs.cancel(task=...): cancelling one task of a job group is not emulated"
            )
        self._body(
            "JobsCancelBody",
            name=a["name"],
            job_ids=a["job_ids"],
            all=a["all"],
            all_users=a["all_users"],
            pool=a["pool"],
            graceful=a["graceful"],
            graceful_timeout=a["graceful_timeout"],
            task=a["task"],
        )
        job_ids = None if a["job_ids"] is None else [int(j) for j in a["job_ids"]]
        label = (
            ",".join(map(str, job_ids))
            if job_ids
            else a["name"]
            if a["name"] is not None
            else "all"
            if a["all"] or a["all_users"]
            else None
        )
        self._sky._record("jobs.cancel", label)
        return self._sky._submit(
            "jobs_cancel",
            None,
            {
                "name": a["name"],
                "job_ids": job_ids,
                "all": a["all"],
                "all_users": a["all_users"],
                "pool": a["pool"],
                "graceful": a["graceful"],
                "graceful_timeout": a["graceful_timeout"],
            },
        )

    def tail_logs(self, *args: Any, **kwargs: Any) -> int | None:
        """Stream the job's one log (every attempt's output, in order) from the start, following
        across recoveries until the job is terminal; its JobExitCode. follow=False: None."""
        a = self._bind("tail_logs", args, kwargs)
        if a["tail"] is not None and a["tail"] <= 0:
            raise ValueError(f"tail must be None or a positive integer, got {a['tail']}.")
        if a["tail_offset"] is not None and a["tail_offset"] < 0:
            raise ValueError(f"tail_offset must be None or a non-negative integer, got {a['tail_offset']}.")
        if a["output_stream"] is not None and not a["preload_content"]:
            raise ValueError("output_stream cannot be specified when preload_content is False")
        self._body(
            "JobsLogsBody",
            name=a["name"],
            job_id=a["job_id"],
            follow=a["follow"],
            controller=a["controller"],
            refresh=a["refresh"],
            tail=a["tail"],
            tail_offset=a["tail_offset"],
            task=a["task"],
        )
        self._sky._record("jobs.tail_logs", str(a["job_id"]) if a["job_id"] is not None else a["name"])
        if a["controller"]:
            raise NotImplementedError("stand-in: jobs.tail_logs(controller=True) is not emulated")
        if a["tail_offset"] is not None:
            raise NotImplementedError("stand-in: jobs.tail_logs(tail_offset=...) is not emulated")
        if not a["preload_content"]:
            raise NotImplementedError("stand-in: jobs.tail_logs(preload_content=False) is not emulated")
        if a["task"] is not None:
            raise NotImplementedError("stand-in: jobs.tail_logs(task=...): job groups are not emulated")
        if a["name"] is not None and a["job_id"] is not None:
            raise ValueError("Cannot specify both name and job_id.")
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        root = self._sky._state.root

        def not_found(message: str) -> int | None:
            out.write(message + "\n")
            return JOB_NOT_FOUND if a["follow"] else None

        job_id = a["job_id"]
        if job_id is None and a["name"] is None:
            ids = _job_ids(root)
            if not ids:
                return not_found("No managed job found.")
            job_id = ids[-1]
        elif job_id is None:
            ids = _nonterminal_job_ids_by_name(root, a["name"])
            if not ids:
                return not_found(f"No running managed job found with name {a['name']!r}.")
            if len(ids) > 1:
                raise ValueError(f"Multiple running jobs found with name {a['name']!r}.")
            [job_id] = ids
        jobdir = _job_dir(root, job_id)
        if jobdir is None:
            return not_found(f"Job {job_id} not found.")
        return _stream_job_log(jobdir, job_id, a["tail"], a["follow"], out)


def _stream_job_log(jobdir: Path, job_id: int, tail: int | None, follow: bool, out: Any) -> int | None:
    """`jobs.tail_logs`' streaming: the job's one log from the start (or its last `tail` lines) to
    `out`, following until the job is terminal; its JobExitCode. follow=False: None."""
    from sky.jobs.state import ManagedJobStatus

    from sky import exceptions

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    with (jobdir / "job.log").open("rb") as log:
        if tail is not None:
            lines = decoder.decode(log.read()).splitlines(keepends=True)
            out.write("".join(lines[-tail:]))
        while True:
            rec = _refresh_dead_controller(jobdir)
            status = ManagedJobStatus(rec["status"])
            chunk = log.read()
            if chunk:
                out.write(decoder.decode(chunk))
            if not follow:
                return None
            if status.is_terminal():  # the controller writes the log before it sets a terminal status
                out.write(decoder.decode(log.read(), final=True))
                out.write(f"Managed job finished: {job_id} (status: {status.value}).\n")
                return int(exceptions.JobExitCode.from_managed_job_status(status))
            time.sleep(POLL_S)

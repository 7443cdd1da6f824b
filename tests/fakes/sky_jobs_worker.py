"""Managed jobs, the API server's half (a part of the worker, sky_clusters.py): `jobs.launch` (the
server's checks, the job id, the job's controller started detached), `jobs.queue(_v2)` and
`jobs.cancel`, and the jobs controller as a cluster of the state dir. The job itself runs under its
controller (sky_controller.py); what the stand-in emulates: sky_jobs.py's docstring.
"""

from __future__ import annotations

import getpass
import json
import pickle
import shutil
import time
import uuid
from typing import Any

from tests.fakes.sky_executor import _spawn
from tests.fakes.sky_job_state import (
    _job_dir,
    _job_dirs,
    _job_ids,
    _new_job,
    _nonterminal_job_ids_by_name,
    _queue_row,
    _refresh_dead_controller,
    _terminal,
    _update_job,
)
from tests.fakes.sky_proc import (
    PLACEMENT,
    _locked,
    _read_json,
    _redacted_yaml,
    _start_time,
    _write_json,
    controller_name,
)


class _JobsRequests:
    """The worker's managed-jobs requests (a mixin: the request, its state dir and `say` are _Worker's)."""

    # -- managed jobs (sky.jobs): the API server's half; the job itself runs under its controller

    def _jobs_launch(self, payload: dict[str, Any]) -> tuple[list[int], None]:
        from sky.backends import backend_utils
        from sky.jobs import utils as managed_job_utils
        from sky.skylet import constants as sky_constants
        from sky.utils import common_utils, dag_utils

        from sky import exceptions

        args = self.req["args"]
        self.say("jobs.launch request")
        dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # what the API server does with the body
        if len(dag.tasks) != 1:
            raise NotImplementedError("stand-in: a managed job of more than one task is not emulated")
        [task] = dag.tasks
        resources = list(task.resources)
        for res in resources[1:]:  # the server's own checks (jobs/server/core.py)
            if res.priority != resources[0].priority:
                raise ValueError(
                    f"Task {task.name!r}: All resources must have the same priority. Found priority "
                    f"{res.priority} but expected {resources[0].priority}."
                )
        priority = resources[0].priority if resources[0].priority is not None else sky_constants.DEFAULT_PRIORITY
        dag_utils.maybe_infer_and_fill_dag_and_task_names(dag)
        dag_utils.fill_default_config_in_dag_for_job_launch(dag)  # differing job_recovery: SkyPilot's ValueError
        if args["no_cloud"]:  # the jobs controller itself cannot be launched
            raise exceptions.NoCloudAccessError("Cloud access is not set up. Run: sky check")
        self._controller_up(args["controller_up_s"])
        task.update_envs({"SKYPILOT_NUM_JOBS": str(args["num_jobs"] or 1)})
        recovery = list(task.resources)[0].job_recovery
        record = {
            "job_name": dag.name,
            "task_name": task.name,
            "status": "PENDING",
            "schedule_state": "WAITING",
            "submitted_at": None,
            "start_at": None,
            "end_at": None,
            "last_recovered_at": -1,
            "recovery_count": 0,
            "failure_reason": None,
            "backoff": None,
            "resources": backend_utils.get_task_resources_str(task, is_managed_job=True),
            "job_recovery": recovery if isinstance(recovery, dict) else {"strategy": recovery},
            "priority": priority,
            "user_name": getpass.getuser(),
            "user_hash": common_utils.get_user_hash(),
            "user_yaml": _redacted_yaml(payload["dag_yaml"]),
            "placement": None,
            "attempts": [],
            "controller": None,
            "done": False,
            "cluster_name": None,
        }
        job_id, jobdir = _new_job(self.state.root, record)
        _update_job(jobdir, cluster_name=managed_job_utils.generate_managed_job_cluster_name(task.name, job_id))
        # The image the job was submitted with: every attempt's /app is a copy of this, never of a later app_dir.
        shutil.copytree(args["app_dir"], jobdir / "image", symlinks=True)
        pid, _ = _spawn(
            self.state.root,
            "job-controller",
            jobdir,
            jobdir,
            jobdir / "controller.out",
            pickle.dumps(
                {
                    "dag_yaml": dag_utils.dump_dag_to_yaml_str(dag),
                    "cluster_env": payload["cluster_env"],
                    "app_dir": str(jobdir / "image"),
                    "capacity": args["capacity"],
                }
            ),
        )
        _update_job(jobdir, controller={"pid": pid, "start": _start_time(pid)})
        self.say(f"Launching managed job {dag.name!r}: job id {job_id}")
        return [job_id], None

    def _controller_up(self, up_s: float) -> None:
        """The jobs controller, as a cluster of this state dir: launched (INIT for `up_s`, then UP)
        where it is not up; a request cancelled meanwhile leaves it INIT, as a cancelled launch
        leaves a cluster."""
        name = controller_name()
        with self.state.cluster_lock(name):
            cdir = self.state.clusters / name
            meta = _read_json(cdir / "meta.json")
            if meta is not None and meta["status"] == "UP":
                return
            self.say(f"Launching the jobs controller {name} ({'restarting it' if meta else 'new'}) ...")
            cdir.mkdir(exist_ok=True)
            meta = meta or {
                "name": name,
                "cluster_hash": uuid.uuid4().hex,
                "request_id": self.rdir.name,
                "launched_at": int(time.time()),
                "num_nodes": 1,
                "accelerators": None,
                "use_spot": False,
                "autostop": {"idle_minutes": 10, "down": False, "enabled": True},
                "launch_args": {},
                "requested": {},
                "task_yaml": "",
                "handle": {"launched_nodes": 1, **PLACEMENT, "instance_type": "standin-controller"},
            }
            meta["status"] = "INIT"
            _write_json(cdir / "meta.json", meta)
            time.sleep(up_s)
            meta["status"] = "UP"
            _write_json(cdir / "meta.json", meta)
            self.say(f"the jobs controller {name} is UP")

    def _controller_is_up(self) -> bool:
        meta = _read_json(self.state.clusters / controller_name() / "meta.json")
        return meta is not None and meta["status"] == "UP"

    def _jobs_queue(self, _payload: Any) -> Any:
        from sky.jobs import constants as managed_job_constants
        from sky.jobs import state as managed_job_state
        from sky.jobs import utils as managed_job_utils
        from sky.schemas.api import responses
        from sky.server.requests.serializers import decoders, encoders

        args = self.req["args"]
        if not self._controller_is_up():  # SkyPilot's answer without a refresh; with one, it starts it
            if not args.get("refresh"):
                from sky import exceptions

                raise exceptions.ClusterNotUpError("No in-progress managed jobs.")
            self._controller_up(args.get("controller_up_s") or 0.0)
        fields = args["fields"]
        if args["version"] == 1:  # the server asks for the default fields (and their dependencies)
            fields = managed_job_utils._update_fields(  # noqa: SLF001 - SkyPilot's own field expansion
                list(managed_job_constants.DEFAULT_MANAGED_JOB_FIELDS)
            )[0]
        elif fields:  # an unknown field is SkyPilot's ValueError('Unknown field: ...')
            for field in managed_job_utils._update_fields(list(fields))[0]:  # noqa: SLF001
                managed_job_state._map_response_field_to_db_column(field)  # noqa: SLF001
        if args["limit"] is not None and args["limit"] < 1:
            raise ValueError(f"Limit must be at least 1, got {args['limit']}")
        now = time.time()
        rows = [
            _queue_row(rec, now)
            for rec in (_refresh_dead_controller(d) for d in _job_dirs(self.state.root))
            if rec is not None
        ]
        total_no_filter = len(rows)
        if args["skip_finished"]:
            rows = [r for r in rows if not r["status"].is_terminal()]
        if args["job_ids"] is not None:
            rows = [r for r in rows if r["job_id"] in args["job_ids"]]
        if args["name_match"] is not None:
            rows = [r for r in rows if args["name_match"] in (r["job_name"] or "")]
        for bound, keep in (("submitted_after", lambda t, b: t >= b), ("submitted_before", lambda t, b: t <= b)):
            if args[bound] is not None:  # a job not yet submitted counts as "now", a terminal one as never
                rows = [
                    r
                    for r in rows
                    if (r["submitted_at"] is not None and keep(r["submitted_at"], args[bound]))
                    or (r["submitted_at"] is None and not r["status"].is_terminal() and keep(now, args[bound]))
                ]
        status_counts: dict[str, int] = {}
        for r in rows:
            status_counts[r["status"].value] = status_counts.get(r["status"].value, 0) + 1
        if args["statuses"]:
            rows = [r for r in rows if r["status"].value in args["statuses"]]
        total = len(rows)
        rows.sort(key=lambda r: r["job_id"], reverse=True)  # newest first, as SkyPilot sorts by default
        if args["limit"] is not None:
            rows = rows[: args["limit"]]
        if fields:  # what was not asked for is not sent (job_id, task_id and status always are)
            keep_fields = set(fields) | {"job_id", "task_id", "status"}
            rows = [{k: v for k, v in r.items() if k in keep_fields} for r in rows]
        # Through SkyPilot's own encoder, JSON and decoder, as the records travel for real.
        if args["version"] == 1:
            return decoders.decode_jobs_queue(json.loads(json.dumps(encoders.encode_jobs_queue(rows))))
        records = [responses.ManagedJobRecord(**r) for r in rows]
        wire = encoders.encode_jobs_queue_v2((records, total, status_counts, total_no_filter))
        return decoders.decode_jobs_queue_v2(json.loads(json.dumps(wire)))

    def _jobs_cancel(self, _payload: Any) -> None:
        from sky.jobs.state import ManagedJobStatus

        args = self.req["args"]
        if not self._controller_is_up():
            from sky import exceptions

            raise exceptions.ClusterNotUpError("All managed jobs should have finished.")
        job_ids = list(dict.fromkeys(args["job_ids"] or []))
        name, everything = args["name"], args["all"] or args["all_users"]
        if sum([bool(job_ids), name is not None, args["pool"] is not None, everything]) != 1:
            given = (
                ([f"job_ids={','.join(map(str, job_ids))}"] if job_ids else [])
                + ([f"name={name}"] if name is not None else [])
                + ([f"pool={args['pool']}"] if args["pool"] is not None else [])
                + (["all"] if args["all"] else [])
                + (["all_users"] if args["all_users"] else [])
            )
            raise ValueError(
                f"Can only specify one of JOB_IDS, name, pool, or all/all_users. Provided {' '.join(given)!r}."
            )
        if everything:
            job_ids = [
                j
                for j in _job_ids(self.state.root)
                if not _terminal(_refresh_dead_controller(self.state.root / "jobs" / str(j)))
            ]
            if not job_ids:
                self.say("No job to cancel.")
                return None
        elif name is not None:
            job_ids = _nonterminal_job_ids_by_name(self.state.root, name)
            if not job_ids:
                self.say(f"No running job found with name {name!r}.")
                return None
            if len(job_ids) > 1:
                self.say(f"Multiple running jobs found with name {name!r}.\nJob IDs: {job_ids}")
                raise RuntimeError("Please specify the job ID instead of the job name.")
        cancelled = []
        for job_id in job_ids:
            jobdir = _job_dir(self.state.root, job_id)
            rec = _refresh_dead_controller(jobdir) if jobdir is not None else None
            if rec is None:
                self.say(f"Job {job_id} not found. Skipped.")
                continue
            with _locked(jobdir / ".lock"):
                rec = _read_json(jobdir / "job.json")
                status = ManagedJobStatus(rec["status"])
                if status.is_terminal():
                    self.say(f"Job {job_id} is already in terminal state {status.value}. Skipped.")
                    continue
                if status == ManagedJobStatus.PENDING:  # its controller has not started it: cancelled at once
                    rec.update(status="CANCELLED", end_at=time.time(), schedule_state="DONE")
                    _write_json(jobdir / "job.json", rec)
                else:  # the controller's signal file (SkyPilot's ~/.sky/signals/<job_id>)
                    _write_json(
                        jobdir / "cancel.json",
                        {
                            "graceful": bool(args["graceful"]),
                            "graceful_timeout": args["graceful_timeout"],
                            "at": time.time(),
                        },
                    )
            cancelled.append(job_id)
        if not cancelled:
            self.say("No job to cancel.")
        else:
            who = (
                f"Job with ID {cancelled[0]} is"
                if len(cancelled) == 1
                else f"Jobs with IDs {', '.join(map(str, cancelled))} are"
            )
            self.say(f"{who} scheduled to be cancelled.")
        return None

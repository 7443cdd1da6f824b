"""The sky stand-in's worker (its "API server", see sky_standin.py): one detached process per request,
writing the request's result (or its exception) to the request's directory. Here: clusters and their
one job (launch, down, cancel, status, cost_report) and api_cancel; the managed-jobs requests are
sky_jobs_worker.py's.

Several nodes (a plain `launch`): each node is a process group of its own (its own session, its own
`nodes/<i>/` disk; the head is the cluster dir) started together with SkyPilot's node variables
(SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS: every node is 127.0.0.1), all writing
the one job log, a worker's lines prefixed `(worker<i>, rank=<i>, pid=…, ip=…)`; the job ends when
every node has, FAILED if any failed; `down` / `cancel` kill every process of every node (sky_proc._kill_node).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import pickle
import shutil
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.fakes.sky_jobs_worker import _JobsRequests
from tests.fakes.sky_proc import (
    CAPACITY_RETRY_S,
    JOB_ID,
    PLACEMENT,
    _accelerators_str,
    _append_jsonl,
    _job_status,
    _kill_node,
    _kill_session,
    _node_dir,
    _placement_of,
    _read_json,
    _redacted_yaml,
    _safe_name,
    _spawn_job,
    _start_time,
    _State,
    _write_json,
    controller_name,
    optimizer_placement,
)


class _Worker(_JobsRequests):
    """Executes one request, writing its result (or its exception) to the request dir."""

    def __init__(self, rdir: Path) -> None:
        self.rdir = rdir
        self.req = _read_json(rdir / "request.json")
        self.state = _State(rdir.parent.parent)
        self.log = (rdir / "request.log").open("a", encoding="utf-8", buffering=1)

    def say(self, line: str) -> None:
        self.log.write(f"stand-in: {line}\n")

    def serve(self, payload: Any) -> None:
        wait_s = float((self.req.get("args") or {}).get("pending_s") or 0.0)
        if wait_s > 0:  # queued on the API server: PENDING, nothing done yet
            (self.rdir / "pending").touch()
            time.sleep(wait_s)
            (self.rdir / "pending").unlink()
        try:
            outcome: tuple[str, Any] = ("ok", getattr(self, f"_{self.req['kind']}")(payload))
        except BaseException as err:  # noqa: BLE001 - the request's error goes to its client, as for real
            outcome = ("error", err)
        try:
            data = pickle.dumps(outcome)
        except Exception:  # noqa: BLE001 - an unpicklable error: its type and text still reach the client
            err = outcome[1]
            data = pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: {err}")))
        tmp = self.rdir / ".result.pkl.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.rdir / "result.pkl")

    # -- launch

    def _launch(self, payload: dict[str, Any]) -> tuple[int | None, Any]:
        from sky.utils import common_utils, dag_utils

        from sky import exceptions, execution

        args, name = self.req["args"], self.req["cluster"]
        self.say(f"launch request for cluster {name}")
        dag = dag_utils.load_dag_from_yaml_str(payload["dag_yaml"])  # what the API server does with the body
        if len(dag.tasks) != 1:
            raise NotImplementedError("stand-in: a DAG of more than one task is not emulated")
        [task] = dag.tasks
        execution._resolve_managed_secrets(dag)  # noqa: SLF001 - SkyPilot's own refusal of valueless secrets
        common_utils.check_cluster_name_is_valid(name)
        if len(task.resources) != 1:
            raise NotImplementedError("stand-in: choosing among several candidate resources is not emulated")
        [res] = list(task.resources)
        if args["no_cloud"]:
            raise exceptions.NoCloudAccessError("Cloud access is not set up. Run: sky check")
        placement = optimizer_placement(task)  # SkyPilot plans (its optimizer) before it provisions anything
        if args["dryrun"]:
            self.say("dryrun: nothing provisioned")
            return None, None
        if self.state.cluster(name) is not None:
            raise RuntimeError(f"stand-in: cluster {name!r} already exists: each leg must launch a fresh cluster")
        while args.get("credentials"):
            identity = exceptions.CloudUserIdentityError(
                f"Failed to get {PLACEMENT['cloud']} user identification. Details: the credentials were refused "
                "(stand-in)"
            )
            if not args["retry_until_up"]:
                raise exceptions.ResourcesUnavailableError(
                    f"Failed to provision all possible launchable resources. Relax the task's resource "
                    f"requirements: {task.num_nodes}x {res}",
                    failover_history=[identity],
                )
            self.say(
                f"credentials refused for {PLACEMENT['cloud']}; retrying in {CAPACITY_RETRY_S:.0f}s (retry_until_up)"
            )
            time.sleep(CAPACITY_RETRY_S)
        while args["capacity"]:
            tried = f"{task.num_nodes}x {res}"
            wanted = _accelerators_str(res.accelerators) or "CPU"
            message = (
                "Failed to provision all possible launchable resources. Relax the task's resource "
                f"requirements: {tried}\nFailed to acquire resources ({wanted}) in every zone of "
                f"{PLACEMENT['cloud']} for {{{res}}}."
            )
            if not args["retry_until_up"]:
                raise exceptions.ResourcesUnavailableError(
                    message + "\nTo keep retrying until the cluster is up, use the `--retry-until-up` flag."
                )
            self.say(f"no capacity for {tried}; retrying in {CAPACITY_RETRY_S:.0f}s (retry_until_up)")
            time.sleep(CAPACITY_RETRY_S)
        with self.state.cluster_lock(name):
            cdir = self.state.clusters / name
            try:
                cdir.mkdir()
            except FileExistsError:
                raise RuntimeError(
                    f"stand-in: cluster {name!r} already exists: each leg must launch a fresh cluster"
                ) from None
            return self._provision(task, res, cdir, payload, placement)

    def _provision(
        self, task: Any, res: Any, cdir: Path, payload: dict[str, Any], placement: dict[str, Any]
    ) -> tuple[int, Any]:
        args, name = self.req["args"], self.req["cluster"]
        accelerators = dict(res.accelerators) if res.accelerators else None
        autostop = res.autostop_config
        meta = {
            "name": name,
            "cluster_hash": uuid.uuid4().hex,
            "request_id": self.rdir.name,
            "status": "INIT",
            "launched_at": int(time.time()),
            "num_nodes": task.num_nodes,
            "accelerators": accelerators,
            "use_spot": bool(res.use_spot),
            "autostop": None
            if autostop is None
            else {"idle_minutes": autostop.idle_minutes, "down": autostop.down, "enabled": autostop.enabled},
            "launch_args": {k: args[k] for k in ("idle_minutes_to_autostop", "down", "retry_until_up", "no_setup")},
            "requested": {
                "cloud": str(res.cloud) if res.cloud else None,
                "region": res.region,
                "zone": res.zone,
                "instance_type": res.instance_type,
                "image_id": res.image_id,
            },
            "task_yaml": _redacted_yaml(payload["dag_yaml"]),
        }
        _write_json(cdir / "meta.json", meta)
        self.say(f"provisioning {name} ({task.num_nodes}x {res}) ...")
        shutil.copytree(args["app_dir"], cdir / "app", symlinks=True)
        (cdir / "home").mkdir()
        handle = SimpleNamespace(
            cluster_name=name,
            cluster_name_on_cloud=name,
            head_ip="127.0.0.1",
            launched_nodes=task.num_nodes,
            launched_resources=SimpleNamespace(**placement, use_spot=bool(res.use_spot), accelerators=accelerators),
        )
        self._start_job(task, cdir, accelerators, payload["cluster_env"])
        meta.update(status="UP", handle={"launched_nodes": task.num_nodes, **placement})
        _write_json(cdir / "meta.json", meta)
        self.say(f"{name} is UP; job {JOB_ID} submitted")
        return JOB_ID, handle

    def _start_job(
        self, task: Any, cdir: Path, accelerators: dict[str, Any] | None, cluster_env: dict[str, str]
    ) -> None:
        """The job on every node at once: node 0 (the head) in the cluster dir, node i in nodes/<i>/
        (a disk of its own), each with SkyPilot's node variables, all into the one job log."""
        has_setup = bool(task.setup) and not self.req["args"]["no_setup"]
        started = []
        for rank in range(task.num_nodes):
            ndir = _node_dir(cdir, rank)
            if rank:
                ndir.mkdir(parents=True)
                shutil.copytree(cdir / "app", ndir / "app", symlinks=True)
                (ndir / "home").mkdir()
            proc = _spawn_job(
                task,
                ndir,
                accelerators,
                cluster_env,
                has_setup=has_setup,
                log_path=cdir / "job.log",
                append=True,
                node=(rank, task.num_nodes),
            )  # O_APPEND: no node writes over another
            started.append({"pgid": proc.pid, "start": _start_time(proc.pid)})
        _write_json(cdir / "job.json", {**started[0], "nodes": started, "started_at": time.time()})

    # -- the other requests

    def _down(self, _payload: Any) -> None:
        name = self.req["cluster"]
        with contextlib.ExitStack() as stack:
            if _safe_name(name):
                stack.enter_context(self.state.cluster_lock(name))  # waits out a launch still provisioning it
            cdir = self.state.cluster(name)
            if cdir is None:
                from sky import exceptions

                raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
            self.say(f"terminating {name} ...")
            job = _read_json(cdir / "job.json")
            for rank, node in enumerate((job.get("nodes") or [job]) if job is not None else []):
                _kill_node(_node_dir(cdir, rank), node["pgid"], node["start"])  # every process: the machine is gone
            meta = _read_json(cdir / "meta.json") or {
                "launched_at": int(cdir.stat().st_mtime),
                "num_nodes": 1,
                "accelerators": None,
            }
            _append_jsonl(
                self.state.history,
                {
                    "name": name,
                    "launched_at": meta["launched_at"],
                    "downed_at": time.time(),
                    "num_nodes": meta["num_nodes"],
                    "accelerators": meta["accelerators"],
                    "cluster_hash": meta.get("cluster_hash"),
                },
            )
            shutil.rmtree(cdir)
            self.say(f"terminated {name}")

    def _cancel(self, _payload: Any) -> None:
        from sky import exceptions

        name, args = self.req["cluster"], self.req["args"]
        cdir = self.state.cluster(name)
        if cdir is None:
            raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if (_read_json(cdir / "meta.json") or {}).get("status") != "UP":
            raise exceptions.ClusterNotUpError(f"Cluster {name!r} is not up (status: INIT).")
        if args["job_ids"] is not None and JOB_ID not in args["job_ids"]:
            self.say(f"no job {args['job_ids']} on {name}")
            return
        ended, _ = _job_status(cdir)
        if ended:
            self.say(f"job {JOB_ID} on {name} already ended")
            return
        job = _read_json(cdir / "job.json")
        for rank, node in enumerate(job.get("nodes") or [job]):
            _kill_node(_node_dir(cdir, rank), node["pgid"], node["start"])
        if not (cdir / "job.exit").exists():  # it had not finished before the kill
            _write_json(cdir / "job.cancelled", {"at": time.time()})
        self.say(f"cancelled job {JOB_ID} on {name}")

    def _status(self, _payload: Any) -> list[Any]:
        from sky.schemas.api.responses import StatusResponse
        from sky.utils import common_utils, status_lib

        wanted = self.req["args"]["cluster_names"]
        records = []
        for name in self.state.cluster_names():
            cdir = self.state.clusters / name
            meta = _read_json(cdir / "meta.json")
            if (wanted is not None and name not in wanted) or meta is None:
                continue
            up = meta["status"] == "UP"
            autostop = meta["autostop"] or {}
            if name == controller_name() and wanted is None:
                continue  # not emulated: the jobs controller in an unnamed status()
            handle = (
                SimpleNamespace(
                    cluster_name=name,
                    cluster_name_on_cloud=name,
                    head_ip="127.0.0.1",
                    launched_nodes=meta["num_nodes"],
                    launched_resources=SimpleNamespace(
                        **_placement_of(meta), use_spot=meta["use_spot"], accelerators=meta["accelerators"]
                    ),
                )
                if up
                else None
            )
            records.append(
                StatusResponse(
                    name=name,
                    launched_at=meta["launched_at"],
                    handle=handle,
                    status=status_lib.ClusterStatus[meta["status"]],
                    autostop=autostop.get("idle_minutes", -1) if autostop.get("enabled", True) else -1,
                    to_down=bool(autostop.get("down", False)),
                    cluster_hash=meta["cluster_hash"],
                    cluster_ever_up=up,
                    user_hash=common_utils.get_user_hash(),
                    user_name=getpass.getuser(),
                    workspace="default",
                    is_managed=False,
                    nodes=meta["num_nodes"],
                    cloud=_placement_of(meta)["cloud"],
                    region=_placement_of(meta)["region"],
                    accelerators=_accelerators_str(meta["accelerators"]),
                    last_creation_yaml=meta["task_yaml"],
                    cluster_name_on_cloud=name,
                )
            )
        return sorted(records, key=lambda r: r.launched_at)

    def _cost_report(self, _payload: Any) -> list[dict[str, Any]]:
        days = self.req["args"]["days"] or 30  # SkyPilot's COST_REPORT_DEFAULT_DAYS
        now, since = time.time(), time.time() - days * 86400
        reports = []
        try:
            downed = [json.loads(line) for line in self.state.history.read_text().splitlines() if line]
        except FileNotFoundError:
            downed = []
        for rec in downed:
            if rec["downed_at"] >= since:
                reports.append(
                    {
                        **rec,
                        "status": None,
                        "duration": int(rec["downed_at"] - rec["launched_at"]),
                        "usage_intervals": [(rec["launched_at"], int(rec["downed_at"]))],
                    }
                )
        alive = [
            m
            for m in (_read_json(self.state.clusters / n / "meta.json") for n in self.state.cluster_names())
            if m is not None
        ]
        if alive:
            from sky.utils import status_lib
        for meta in alive:
            name = meta["name"]
            reports.append(
                {
                    "name": name,
                    "launched_at": meta["launched_at"],
                    "downed_at": None,
                    "num_nodes": meta["num_nodes"],
                    "accelerators": meta["accelerators"],
                    "cluster_hash": meta["cluster_hash"],
                    "duration": int(now - meta["launched_at"]),
                    "status": status_lib.ClusterStatus[meta["status"]],
                    "usage_intervals": [(meta["launched_at"], None)],
                }
            )
        return reports

    def _api_cancel(self, _payload: Any) -> list[str]:
        ids = self.req["args"]["request_ids"]
        targets = (
            [d for d in self.state.requests.iterdir() if d != self.rdir]
            if ids is None
            else [self.state.requests / r for r in ids if _safe_name(r)]
        )
        cancelled = []
        for rdir in targets:
            if not (rdir / "request.json").exists() or (rdir / "result.pkl").exists() or (rdir / "cancelled").exists():
                continue
            worker = _read_json(rdir / "worker.json") or {}
            if worker.get("pid"):
                _kill_session(worker["pid"], worker.get("start"))
            if not (rdir / "result.pkl").exists():  # it had not finished before the kill
                _write_json(rdir / "cancelled", {"at": time.time()})
                cancelled.append(rdir.name)
                self.say(f"cancelled request {rdir.name}")
        return cancelled


def serve_request(rdir: Path, data: bytes | None = None) -> None:
    """The worker's entry point: the request's secret payload arrives on stdin (or from the executor)."""
    payload = pickle.loads(sys.stdin.buffer.read() if data is None else data)
    _Worker(rdir).serve(payload)

"""The sky stand-in's requests as its client sees them (a part of StrictSky, sky_client.py): each
SDK call that is a request is handed to a detached worker (sky_clusters.py), as the API server
executes requests independently of its client; `stream_and_get` and `get` wait for one on disk,
`api_status` lists them as SkyPilot's own RequestPayload, `optimize` is SkyPilot's own request.
"""

from __future__ import annotations

import codecs
import json
import os
import pickle
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.fakes.sky_executor import _spawn
from tests.fakes.sky_proc import POLL_S, _alive, _read_json, _start_time, _write_json

REQUEST_NAMES = {"jobs_launch": "jobs.launch", "jobs_queue": "jobs.queue_v2", "jobs_cancel": "jobs.cancel"}
"""The stand-in's request kinds by SkyPilot's request names (`sky.<name>` in api_status); the others match."""


class _Requests:
    """StrictSky's requests (a mixin: its state dir, the real SDK, `_bind` and `_record` are StrictSky's)."""

    # -- requests

    def wait_requests_ended(self, kind: str, cluster: str, timeout_s: float = 60.0) -> int:
        """Wait until no `kind` request for `cluster` has a live worker (each one finished,
        failed or was cancelled): after that, nothing can act for them. How many there were."""
        deadline = time.monotonic() + timeout_s
        while True:
            mine = [
                d
                for d in self._state.requests.iterdir()
                if {"kind": kind, "cluster": cluster}.items() <= (_read_json(d / "request.json") or {}).items()
            ]
            workers = [_read_json(d / "worker.json") or {} for d in mine]
            live = [
                d.name for d, w in zip(mine, workers) if _alive(w.get("pid", 0), w.get("start"))
            ]  # a zombie is gone
            if not live:
                return len(mine)
            if time.monotonic() > deadline:
                raise TimeoutError(f"stand-in: {kind} requests for {cluster} still running: {live}")
            time.sleep(POLL_S)

    def _submit(self, kind: str, cluster: str | None, args: dict[str, Any], secret_payload: Any = None) -> str:
        """Hand a request to a detached worker; its id. `secret_payload` goes over a
        pipe, never to disk (the task carries secret values)."""
        rid = str(uuid.uuid4())
        rdir = self._state.requests / rid
        rdir.mkdir()
        _write_json(
            rdir / "request.json",
            {
                "id": rid,
                "kind": kind,
                "cluster": cluster,
                "args": args,
                "submitted_at": time.time(),
                "client_pid": os.getpid(),
            },
        )
        (rdir / "request.log").touch()
        pid, proc = _spawn(
            self._state.root, "serve-request", rdir, self._state.root, rdir / "worker.out", pickle.dumps(secret_payload)
        )
        _write_json(rdir / "worker.json", {"pid": pid, "start": _start_time(pid)})
        if proc is not None:
            self._workers[rid] = proc
        return rid

    def _resolve(self, request_id: str | None) -> Path:
        """A request's directory from its id, a unique prefix of it, or None (the latest)."""
        if request_id is None:
            dirs = [d for d in self._state.requests.iterdir() if (d / "request.json").exists()]
            if not dirs:
                raise self.exceptions.ClientError("Failed to stream logs: no request was submitted")
            return max(dirs, key=lambda d: _read_json(d / "request.json")["submitted_at"])
        if not isinstance(request_id, str) or not request_id or "/" in request_id:
            raise self.exceptions.ClientError(f"Failed to stream logs: invalid request id {request_id!r}")
        matches = [d for d in self._state.requests.iterdir() if d.name.startswith(request_id)]
        if len(matches) != 1:
            raise RuntimeError(
                f"Failed to get request {request_id}: 404 {'ambiguous' if matches else 'no such'} request id"
            )
        return matches[0]

    def _outcome(self, rdir: Path) -> tuple[str, Any] | None:
        """('ok', value) / ('error', exception) / ('cancelled', None), or None while it runs."""
        if (rdir / "cancelled").exists():
            return "cancelled", None
        path = rdir / "result.pkl"
        if path.exists():
            return pickle.loads(path.read_bytes())
        proc = self._workers.get(rdir.name)
        if proc is not None:
            proc.poll()  # reap our own child, so that /proc does not show a zombie as running
        worker = _read_json(rdir / "worker.json") or {}
        if worker.get("pid") and _alive(worker["pid"], worker.get("start")):
            return None
        if path.exists():
            return pickle.loads(path.read_bytes())
        if (rdir / "cancelled").exists():
            return "cancelled", None
        return "error", RuntimeError(
            f"stand-in: the worker of request {rdir.name} died without a result (see {rdir / 'worker.out'})"
        )

    def _finish(self, rdir: Path, outcome: tuple[str, Any]) -> Any:
        self._workers.pop(rdir.name, None)
        kind, value = outcome
        if kind == "ok":
            return value
        if kind == "cancelled":
            name = _read_json(rdir / "request.json")["kind"]
            raise self.exceptions.RequestCancelled(
                f"Current {name!r} request ({rdir.name}) is cancelled by another process."
            )
        raise value

    def _request_label(self, rdir: Path) -> str:
        req = _read_json(rdir / "request.json") or {}
        return f"{req.get('kind')}:{req.get('cluster')}"

    def stream_and_get(self, *args: Any, **kwargs: Any) -> Any:
        """Stream a request's log to `output_stream` (stdout if None) until it ends; its result."""
        a = self._bind("stream_and_get", args, kwargs)
        if str(a["request_id"]) in self._real_requests:
            return self._real.stream_and_get(
                a["request_id"], tail=a["tail"], follow=a["follow"], output_stream=a["output_stream"]
            )
        if a["log_path"] is not None:
            raise NotImplementedError("stand-in: streaming a server-side log_path is not emulated")
        rdir = self._resolve(a["request_id"])
        self._record("stream_and_get", self._request_label(rdir))
        out = a["output_stream"] if a["output_stream"] is not None else sys.stdout
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with (rdir / "request.log").open("rb") as log:
            if a["tail"] is not None and a["tail"] > 0:
                lines = decoder.decode(log.read()).splitlines(keepends=True)
                out.write("".join(lines[-a["tail"] :]))
            while True:
                outcome = self._outcome(rdir)
                chunk = log.read()
                if chunk:
                    out.write(decoder.decode(chunk))
                if not a["follow"]:
                    return None
                if outcome is not None:
                    out.write(decoder.decode(log.read(), final=True))
                    return self._finish(rdir, outcome)
                time.sleep(POLL_S)

    def optimize(self, *args: Any, **kwargs: Any) -> Any:
        """SkyPilot's own optimizer (its API server, its catalog): pricing needs no live
        cluster, so it is not stood in for. The request id is the real server's."""
        rid = self._real.optimize(*args, **kwargs)
        self._real_requests.add(str(rid))
        self._record("optimize", None)
        return rid

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for a request; its result, or raise its exception."""
        a = self._bind("get", args, kwargs)
        if str(a["request_id"]) in self._real_requests:
            return self._real.get(a["request_id"])
        rdir = self._resolve(a["request_id"])
        self._record("get", self._request_label(rdir))
        while (outcome := self._outcome(rdir)) is None:
            time.sleep(POLL_S)
        return self._finish(rdir, outcome)

    def api_status(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The API server's requests as SkyPilot's own RequestPayload (not a request itself, as for
        real): by id prefix (any status), else only those still working unless all_status; of one
        cluster (a managed job's requests are the jobs controller's); newest first."""
        a = self._bind("api_status", args, kwargs)
        from sky.server.requests import payloads

        self._record("api_status", a["cluster_name"])
        rows = []
        for rdir in self._state.requests.iterdir():
            req = _read_json(rdir / "request.json")
            if req is None:
                continue
            status = self._request_status(rdir)
            if a["request_ids"] is not None:
                if not any(rdir.name.startswith(str(r)) for r in a["request_ids"]):
                    continue
            elif not a["all_status"] and status in ("SUCCEEDED", "FAILED", "CANCELLED"):
                continue
            if a["cluster_name"] is not None and req.get("cluster") != a["cluster_name"]:
                continue
            rows.append(
                payloads.RequestPayload(
                    request_id=rdir.name,
                    name=f"sky.{REQUEST_NAMES.get(req['kind'], req['kind'])}",
                    entrypoint=f"sky.client.sdk.{req['kind']}",
                    request_body=json.dumps(req.get("args") or {}),
                    status=status,
                    created_at=req["submitted_at"],
                    user_id="standin",
                    return_value="null",
                    error="null",
                    pid=(_read_json(rdir / "worker.json") or {}).get("pid"),
                    schedule_type="long",
                    cluster_name=req.get("cluster"),
                    finished_at=None,
                )
            )
        rows.sort(key=lambda r: r.created_at, reverse=True)
        return rows[: a["limit"]] if a["limit"] else rows

    def _request_status(self, rdir: Path) -> str:
        """PENDING (queued), RUNNING, SUCCEEDED, FAILED or CANCELLED, as the API server says."""
        if (rdir / "cancelled").exists():
            return "CANCELLED"
        if (rdir / "result.pkl").exists():
            return "SUCCEEDED" if pickle.loads((rdir / "result.pkl").read_bytes())[0] == "ok" else "FAILED"
        worker = _read_json(rdir / "worker.json") or {}
        if worker.get("pid") and _alive(worker["pid"], worker.get("start")):
            return "PENDING" if (rdir / "pending").exists() else "RUNNING"
        if (rdir / "result.pkl").exists() or (rdir / "cancelled").exists():
            return self._request_status(rdir)
        return "FAILED"  # its worker died without a result

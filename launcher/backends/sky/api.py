"""SkyPilot's SDK as the launcher speaks it, apart from any backend.

What both the per-leg clusters (launcher.backends.sky.backend) and the managed job
(launcher.backends.sky.job) say to SkyPilot and read back: its errors told apart
by type (`classify`), its optimizer's pick and price (`optimizer_pick`), where a
cluster landed, its log streams as lines, `down` / `status` / `cost_report` of a
cluster, and a managed job's record and cancellation. Every function takes the
`sky` module (SkyPilot's, or the strict stand-in the tests inject) as its first
argument; nothing here imports SkyPilot itself.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import IO, Any

from launcher.backends.base import LineSink
from launcher.errors import BadInput, Refused

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(err: BaseException, limit: int = 300) -> str:
    """SkyPilot's error as one plain line (its messages carry terminal colours)."""
    return " ".join(ANSI.sub("", f"{type(err).__name__}: {err}").split())[:limit]


@dataclass(frozen=True)
class Pick:
    """What SkyPilot's optimizer would launch for a task, and its price."""

    cloud: str
    region: str | None
    instance_type: str | None
    accelerators: str | None
    use_spot: bool
    nodes: int
    hourly_usd: float
    """The whole cluster, per hour: every node's VM, GPUs and host included."""
    candidates: tuple[tuple[str, float], ...] = ()
    """For a task whose `resources.ordered` SkyPilot tries one after another (spot, then
    on-demand): each candidate's price, as SkyPilot's optimizer gives it, in that order; this
    pick is the dearest of them (`SkyBackend.quote`)."""

    @property
    def instance_hourly_usd(self) -> float:
        """One node's share: what the ledger records per leg and bills per instance-hour."""
        return self.hourly_usd / max(1, self.nodes)

    def describe(self) -> str:
        where = f"{self.cloud} {self.region or 'any region'}"
        what = f"{self.nodes} x {self.instance_type or '?'}" + (f" ({self.accelerators})" if self.accelerators else "")
        return f"{what} on {where}{' spot' if self.use_spot else ''}: ${self.hourly_usd:.2f}/h"


def setup_errors(sky: Any) -> tuple[type[BaseException], ...]:
    """SkyPilot's errors that mean "this machine cannot launch anything as configured":
    no cloud enabled, a catalog it cannot read, bad or missing credentials, no API
    server. Bad input (exit 2): nothing was provisioned, nothing is billed."""
    exc = sky.exceptions
    names = (
        "NoCloudAccessError",
        "CloudError",
        "CloudUserIdentityError",
        "InvalidCloudCredentials",
        "InvalidCloudConfigs",
        "ApiServerConnectionError",
        "ApiServerAuthenticationError",
        "NotSupportedError",
        "InvalidClusterNameError",
        "PermissionDeniedError",
        "ProvisionPrechecksError",
        "ResourcesMismatchError",
        "InvalidSkyPilotConfigError",
        "NoWorkspaceAccessError",
    )
    return tuple(getattr(exc, n) for n in names if isinstance(getattr(exc, n, None), type))


CREDENTIAL_ERRORS = ("CloudUserIdentityError", "InvalidCloudCredentials", "NoCloudAccessError", "PermissionDeniedError")
"""SkyPilot's errors that say a cloud refused who we are: waiting for capacity cannot help."""


def is_credentials(sky: Any, cause: Any) -> bool:
    """Whether one failover_history entry is a credentials error: by its type, as every SkyPilot
    error here; an entry served back serialized (a dict with `type`, or text) has only its
    type's name, which is matched then."""
    if isinstance(cause, BaseException):
        kinds = tuple(
            getattr(sky.exceptions, n) for n in CREDENTIAL_ERRORS if isinstance(getattr(sky.exceptions, n, None), type)
        )
        return isinstance(cause, kinds)
    name = cause.get("type") if isinstance(cause, dict) else str(cause).split(":", 1)[0].strip()
    return name in CREDENTIAL_ERRORS


def classify(sky: Any, err: BaseException) -> BadInput | Refused | None:
    """The launcher error a SkyPilot exception means, by type; None: a failure of this leg.
    A ResourcesUnavailableError is told apart by the causes in its failover_history: when every
    attempt failed on the cloud's credentials it is no capacity problem, and no retry hint."""
    if isinstance(err, sky.exceptions.ResourcesUnavailableError):
        history = list(getattr(err, "failover_history", None) or [])
        if history and all(is_credentials(sky, e) for e in history):
            last = history[-1]
            said = one_line(last, 240) if isinstance(last, BaseException) else " ".join(str(last).split())[:240]
            return BadInput(
                f"no cloud credentials SkyPilot could use: {said}",
                hint="`sky check` names the cloud and what it refused; fix its credentials, then launch again",
            )
        tried = [one_line(e, 120) for e in (getattr(err, "failover_history", None) or [])][-3:]
        return Refused(
            f"SkyPilot found no capacity: {' '.join(str(err).split())[:240]}"
            + (f" (tried: {'; '.join(tried)})" if tried else ""),
            hint="run it again with --retry-until-up to wait for capacity, or ask for other --gpus",
        )
    if isinstance(err, setup_errors(sky)):
        return BadInput(
            f"SkyPilot could not launch: {one_line(err)}",
            hint="`sky check` says which clouds are enabled; `sky api info` whether the API server is up",
        )
    return None


def optimizer_pick(sky: Any, task: Any) -> Pick:
    """SkyPilot's own optimizer on this task (its catalog, its cost model, on its API server):
    the resources it chose and their hourly price for all nodes, host VM included.

    In 0.14.1 the `optimize` request returns no value to a client (the optimized DAG is
    not serialized); what it gives is its table of considered resources, in the request's
    log, with the chosen row marked. That table is read here.

    The stream can end before the table reached the request's log: the server stops
    following once the request is done, and on a loaded machine the executor's last
    writes can land after that (seen: the stream ended at "Considered resources (1 node):").
    The log of a finished request is complete, so it is then read again, whole, a few times."""
    dag = sky.Dag()
    dag.add(task)
    nodes = int(task.num_nodes or 1)
    request = sky.optimize(dag)
    table = Capture()
    sky.stream_and_get(request, output_stream=table)
    for wait_s in TABLE_REREAD_WAITS_S:
        if has_chosen_row(table.text):
            break
        time.sleep(wait_s)
        table = Capture()
        sky.stream_and_get(request, follow=False, output_stream=table)
    return parse_optimizer_table(table.text, nodes)


TABLE_REREAD_WAITS_S = (0.0, 0.5, 2.0)
"""Pauses before each whole re-read of a finished optimize request whose stream lacked the table."""


def _header_and_chosen(text: str) -> tuple[str | None, str | None]:
    """The table's header line and its chosen (\u2714) row, ANSI colours stripped; None where absent."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    header = next((line for line in lines if "INSTANCE" in line and "COST" in line), None)
    chosen = next((line for line in lines if "\u2714" in line), None)
    return header, chosen


def has_chosen_row(text: str) -> bool:
    return None not in _header_and_chosen(text)


SPOT_MARK = re.compile(r"\[([^\[\]]*)\]")
"""A bracketed marker in resources as SkyPilot 0.14.1 formats them (see `spot_of`)."""


def spot_of(shown: str) -> bool | None:
    """Whether resources SkyPilot formatted are spot, read from the marker it writes, whatever its
    case: `[spot]` in a launched cluster's resources (sky/utils/resources_utils.py format_resource:
    the managed job record's cluster_resources, e.g. `1x[spot](gpus=T4:1, n1-highmem-4, ...)`),
    `[Spot]` after the instance type in the optimizer's table and a Resources' repr
    (sky/resources.py get_spot_str, `__repr__`). None where it cannot say: nothing shown ('-'),
    or a request of several candidates (`[On-demand|Spot]`, sky/backends/backend_utils.py
    get_task_resources_str, the record's fallback once the cluster is gone)."""
    shown = (shown or "").strip()
    if not shown or shown == "-":
        return None
    for mark in SPOT_MARK.findall(shown):
        kinds = {part.strip().lower() for part in mark.split("|")}
        if "spot" in kinds:
            return True if kinds == {"spot"} else None
    return False


def parse_optimizer_table(text: str, nodes: int) -> Pick:
    """The chosen row of SkyPilot's "Considered resources" table:
    INFRA (cloud (region or zone)) | INSTANCE (`[Spot]` after a spot one: `spot_of`) | vCPUs | Mem(GB) | GPUS | COST ($) | CHOSEN."""
    header, chosen = _header_and_chosen(text)
    if header is None or chosen is None:
        raise RuntimeError("SkyPilot's optimizer printed no chosen resources: " + " ".join(text.split())[-200:])
    names = re.split(r"\s{2,}", header.strip())
    row = dict(zip(names, re.split(r"\s{2,}", chosen.strip())))
    infra = re.match(r"(\S+)(?: \((\S+)\))?", row.get("INFRA", row.get("CLOUD", "")))
    if infra is None or "COST ($)" not in row:
        raise RuntimeError(f"SkyPilot's optimizer table has an unexpected shape: {chosen.strip()!r}")
    where = infra.group(2)
    region = where.rsplit("-", 1)[0] if where and re.search(r"-[a-z]$", where) else where
    instance = row.get("INSTANCE", "")
    gpus = row.get("GPUS", "-")
    return Pick(
        infra.group(1),
        region,
        SPOT_MARK.sub("", instance).strip() or None,
        None if gpus in ("-", "") else gpus,
        bool(spot_of(instance)),
        nodes,
        float(row["COST ($)"]),
    )


def placement_of(handle: Any) -> dict[str, str]:
    """cloud / region / zone / instance_type / use_spot of a launched cluster, from its handle."""
    res = getattr(handle, "launched_resources", None)
    if res is None:
        return {}
    out = {
        "cloud": getattr(res, "cloud", None),
        "region": getattr(res, "region", None),
        "zone": getattr(res, "zone", None),
        "instance_type": getattr(res, "instance_type", None),
    }
    found = {k: str(v).lower() if k == "cloud" else str(v) for k, v in out.items() if v}
    if found and getattr(res, "use_spot", None) is not None:
        found["use_spot"] = "true" if res.use_spot else "false"
    return found


class Capture:
    """An output stream that keeps what SkyPilot writes to it."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


class LineWriter:
    """A text stream SkyPilot writes logs to: each whole line goes to the log and the live view."""

    def __init__(self, log: IO[str], on_line: LineSink | None) -> None:
        self.log, self.on_line, self._buf = log, on_line, ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.log.write(line + "\n")
            self.log.flush()
            if self.on_line:
                self.on_line(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()


# --- clusters ----------------------------------------------------------------------


def down(sky: Any, cluster: str, stream: Any) -> tuple[bool | str, str]:
    """`sky down`: (True, '') done; ('gone', '') there was no such cluster (nothing to
    bill, nothing leaked); (False, why) it may still be billing."""
    try:
        sky.stream_and_get(sky.down(cluster), output_stream=stream)
        return True, ""
    except sky.exceptions.ClusterDoesNotExist:
        return "gone", ""
    except Exception as err:  # noqa: BLE001 - a leaked cluster bills: say so loudly
        note = f"sky down {cluster} FAILED: {one_line(err)}; check `sky status`"
        if stream is not None:
            stream.write(f"launcher: {note}\n")
        return False, note


def cluster_up(sky: Any, cluster: str) -> bool:
    """Does SkyPilot know this cluster (in any state)? Asked, never assumed."""
    return any(_field(r, "name") == cluster for r in sky.get(sky.status(cluster_names=[cluster])) or [])


def _field(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, dict) else getattr(row, name, None)


def cost_row(sky: Any, cluster: str) -> tuple[float, float] | None:
    """(launched_at, seconds up) from SkyPilot's cost report for the cluster; None where it has none."""
    try:
        rows = sky.get(sky.cost_report())
    except Exception:  # noqa: BLE001 - our own measure stands
        return None
    for row in rows or []:
        if _field(row, "name") == cluster and _field(row, "duration") is not None:
            return float(_field(row, "launched_at") or 0.0), float(_field(row, "duration"))
    return None


# --- managed jobs ------------------------------------------------------------------

TERMINAL_JOB_STATUSES = (
    "SUCCEEDED",
    "CANCELLED",
    "FAILED",
    "FAILED_SETUP",
    "FAILED_PRECHECKS",
    "FAILED_NO_RESOURCE",
    "FAILED_CONTROLLER",
)
JOB_PREFIX = "sky-job-"
"""A managed job's legs carry `sky-job-<id>` as their instance in the ledger."""
RECORD_FIELDS = [
    "job_id",
    "job_name",
    "status",
    "recovery_count",
    "submitted_at",
    "start_at",
    "end_at",
    "last_recovered_at",
    "job_duration",
    "failure_reason",
    "cloud",
    "region",
    "zone",
    "cluster_resources",
]


def job_id_of(instance: str | None) -> int | None:
    """The managed job id a leg row names (None: not a managed-job leg)."""
    if not instance or not instance.startswith(JOB_PREFIX):
        return None
    digits = instance[len(JOB_PREFIX) :].split()[0]
    return int(digits) if digits.isdigit() else None


def record(sky: Any, job_id: int) -> dict[str, Any] | None:
    """SkyPilot's record of the job (`jobs.queue_v2` with the fields the launcher reads). A jobs
    controller that autostopped (10 minutes after its last job) answers ClusterNotUpError unless
    asked to refresh, which starts it again: a dead launcher's job is still billed from its record."""
    try:
        records = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=[job_id], fields=RECORD_FIELDS))[0]
    except sky.exceptions.ClusterNotUpError:
        records = sky.get(sky.jobs.queue_v2(refresh=True, job_ids=[job_id], fields=RECORD_FIELDS))[0]
    for rec in records:
        if int(rec["job_id"]) == job_id:
            status = rec["status"]
            return {k: (getattr(status, "value", status) if k == "status" else rec.get(k)) for k in RECORD_FIELDS}
    return None


def cancel(sky: Any, job_id: int, graceful: bool) -> str | None:
    """`sky.jobs.cancel`; graceful: SIGTERM to the job's processes first (its final
    checkpoint), then teardown. None when sent, else why it could not be."""
    try:
        sky.get(sky.jobs.cancel(job_ids=[job_id], graceful=graceful))
    except Exception as err:  # noqa: BLE001 - said, never raised over the error that led here
        return one_line(err)
    return None

"""What the ledger's reads return: one typed row per table, and how a row damaged
by hand is read as far as it goes.

The rows are TypedDicts, plain dicts at run time (`run["legs"]`, `leg["killed"]`):
the types say what each key holds, nothing converts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple, NotRequired, TypedDict


@dataclass(frozen=True)
class Review:
    """A recorded `launcher review`: the reviewed files and their sha256."""

    id: int
    created_at: float
    digest: str
    files: dict[str, str]


class CheckRow(TypedDict):
    """A rung's check: its name, pass/fail, the line it printed and the event lines it rests on."""

    run_id: str
    seq: int
    name: str
    ok: bool
    detail: str
    evidence: list[Any]
    damaged: NotRequired[list[str]]


class LegRow(TypedDict):
    """A leg as the ledger reads it (`Ledger.runs`, `Ledger.leg_records`): JSON decoded, `killed`
    a bool; a number damaged by hand reads None and is named under `damaged`."""

    run_id: str
    leg: int | None
    backend: str
    instance: str
    command: list[str]
    env: dict[str, str]
    log_path: str
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    killed: bool
    end_reason: str | None
    billed_gpu_hours: float | None
    billed_s: float | None
    """Instance-seconds billed: every node, the provider's rounding included (None: before schema 13)."""
    cost_usd: float | None
    task_sha256: str | None
    pid: int | None
    role: str | None
    hourly_usd: float | None
    cost_source: str | None
    placement: dict[str, str] | None
    run_sha256: str | None
    """The `run:` script every node executed (sky; local with --nodes N)."""
    nodes: list[dict[str, Any]] | None
    """A leg of several nodes: each node's record (node, instance, pid, exit_code, log)."""
    request_id: str | None
    """sky: the id of the leg's launch (or managed job's submit) request on SkyPilot's API server."""
    watchdog: dict[str, Any] | None
    """What watched the leg's ranks saw (launcher.checks.watchdog.LiveWatch.record)."""
    damaged: NotRequired[list[str]]


class RunRow(TypedDict):
    """A run as `Ledger.runs` reads it, with its files, legs and checks."""

    id: str
    project: str
    rung: str
    backend: str
    gpu_name: str | None
    gpu_count: int | None
    nodes: int | None
    store_uri: str
    review_id: int | None
    files_digest: str
    config_sha256: str
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    verdict: str | None
    billed_gpu_hours: float | None
    cost_usd: float | None
    cost_source: str | None
    image: str | None
    preflight: Any
    """The preflight report (JSON) that let the run launch, None where none or unreadable."""
    files: dict[str, str]
    legs: list[LegRow]
    checks: list[CheckRow]
    damaged: NotRequired[list[str]]


class StopRow(TypedDict):
    """A `launcher stop` request and, once it ended, how."""

    id: int
    run_id: str
    leg: int | None
    requested_at: float
    timeout_s: float
    ended_at: float | None
    outcome: str | None
    final_step: int | None
    checkpoint: str | None
    verified: int | None
    loadable: int | None
    detail: str | None


class ImageRow(TypedDict):
    """A built leg image."""

    id: int
    tag: str
    image_id: str
    base: str
    lock: str
    files_digest: str
    files: dict[str, str]
    runtime_digest: str
    built_at: float
    seconds: float
    pushed_ref: str | None


class ReservationRow(TypedDict):
    """GPU-hours and USD a launcher holds against the quota, until settled."""

    id: int
    run_id: str
    rung: str
    created_at: float
    host: str
    pid: int
    pid_start: int | None
    gpu_hours: float
    usd: float
    overdraft: int
    arithmetic: str
    settled_at: float | None
    settled_gpu_hours: float | None
    settled_usd: float | None
    settled_how: str | None


class LegBilling(TypedDict):
    """What billing a leg needs: its start, its price, the run's GPUs and nodes."""

    started_at: float
    hourly_usd: float | None
    gpu_count: int
    nodes: int


class RungSpend(TypedDict):
    """A rung's bills in the period."""

    gpu_hours: float
    usd: float
    runs: int


class PeriodTotals(NamedTuple):
    """Billed and still-reserved GPU-hours and USD in a quota period."""

    used_gpu_hours: float
    used_usd: float
    held_gpu_hours: float
    held_usd: float


RUN_NUMBERS = ("gpu_count", "nodes", "started_at", "ended_at", "exit_code", "billed_gpu_hours", "cost_usd")
LEG_NUMBERS = (
    "leg",
    "started_at",
    "ended_at",
    "exit_code",
    "billed_gpu_hours",
    "billed_s",
    "cost_usd",
    "pid",
    "killed",
    "hourly_usd",
)


def clean(row: dict[str, Any], numbers: tuple[str, ...], json_cols: dict[str, type]) -> dict[str, Any]:
    """A row as readers expect it; what was damaged is set to None (or empty) and named."""
    damaged = []
    for col in numbers:
        value = row.get(col)
        if value is not None and (isinstance(value, (bytes, str)) or value != value):
            damaged.append(col)
            row[col] = None
    for col, kind in json_cols.items():
        try:
            value = json.loads(row[col])
            if not isinstance(value, kind):
                raise ValueError
            row[col] = value
        except (TypeError, ValueError, RecursionError):
            damaged.append(col)
            row[col] = kind()
    for col in ("id", "run_id", "rung", "backend", "instance", "log_path", "verdict", "files_digest"):
        if col in row and row[col] is not None and not isinstance(row[col], str):
            damaged.append(col)
            row[col] = str(row[col])
    if damaged:
        row["damaged"] = damaged
    return row


def json_or_none(text: Any) -> Any:
    """A JSON column's value, None where it is empty or does not parse."""
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None

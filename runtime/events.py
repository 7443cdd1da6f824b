"""Structured event lines: the evidence the launcher, the ledger and the report read.

One JSON object per line on stdout, always starting with `{"event": ` so a line
can be found inside mixed output (torchrun or SkyPilot prefixes included):

    {"event": "step", "t": 1764500000.123, "rank": 0, "step": 120, "loss": 3.1, ...}

Events (docs/design.md): start, resume, step, push, verify, delete_local, prune,
stop, done; and `log`, the runtime's own word on how it runs, with a level. Every rank prints its own lines (a rank-0-only logger turns a crash
into silence); `rank` says whose line it is, and `node` on which node, in a world of several.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any, Iterable, Iterator

from runtime.contract import check_event

MARKER = '{"event": '
DAMAGED = "damaged"
MAX_LINE = 1 << 20
_lock = threading.Lock()  # the background pusher emits too: one whole line at a time


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _node() -> int | None:
    """The node this rank runs on, in a world of several nodes (torchrun's GROUP_RANK, the node
    rank it was started with); None on one node, where every event line stays as it was."""
    if int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1) <= 1:
        return None
    return int(os.environ.get("GROUP_RANK", "0") or 0)


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: say so explicitly rather than emit invalid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def emit(event: str, **fields: Any) -> dict[str, Any]:
    """Print one event line (flushed: a killed leg must not lose its last lines)."""
    record = {"event": event, "t": round(time.time(), 3), "rank": _rank()}
    node = _node()
    if node is not None:
        record["node"] = node
    record.update({k: _clean(v) for k, v in fields.items()})
    line = json.dumps(record, separators=(", ", ": ")) + "\n"
    with _lock:
        sys.stdout.write(line)
        sys.stdout.flush()
    return record


LOG = "log"
INFO, WARNING = "info", "warning"


def log(level: str, message: str, **fields: Any) -> dict[str, Any]:
    """A line of the runtime's own about how the leg runs (not evidence), as a `log` event with
    its level: `info` says nothing is wrong, and the live view shows it only with -v; `warning`
    is shown. The leg's log keeps both. `source` names the part speaking."""
    assert level in (INFO, WARNING), level
    return emit(LOG, level=level, message=message, **fields)


def parse_line(line: str) -> dict[str, Any] | None:
    """The event on this line, or None when the line carries none. A line that claims
    to be an event but is not one readers can use (cut short by a kill, a field of
    the wrong type, absurdly long or deep) reads as a `damaged` event naming why."""
    start = line.find(MARKER)
    if start < 0:
        return None
    text = line[start:]
    if len(text) > MAX_LINE:
        return damaged(None, f"an event line of {len(text)} characters (limit {MAX_LINE})")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as err:
        if not text.rstrip().endswith("}"):
            return None  # a line cut short by a kill: the leg simply ended there
        return damaged(None, f"not JSON ({type(err).__name__})")
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return damaged(None, "no event name")
    if record["event"] == DAMAGED:
        return damaged(None, "a line claiming to be a damaged marker")
    problem = check_event(record)
    return damaged(record["event"], problem) if problem else record


def damaged(kind: str | None, reason: str) -> dict[str, Any]:
    return {"event": DAMAGED, "kind": kind, "reason": reason}


def iter_events(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, event) for each event line."""
    for lineno, line in enumerate(lines, start=1):
        record = parse_line(line)
        if record is not None:
            yield lineno, record

"""The event lines both sides rely on: each event's name and the fields (with their
types) that the launcher, the drill and the report read. Torch-free: the host
imports it to read a log, the runtime's printer is what writes it.

A log is input the host did not make (a trainer of any shape, a doctored file),
so `check_event` says what is wrong with a line instead of letting a string
`step` or a missing field crash `status` or the report three calls later. A
line that fails reads as a `damaged` event naming why; nothing consumes it as
evidence, and `status` and the report show it as such.
"""

from __future__ import annotations

import math
from typing import Any

INT, NUM, OPT_NUM, STR, BOOL, LIST, DICT = "int", "number", "number or null", "string", "bool", "list", "object"
OPT_DICT = "object or null"
MAX_INT = 1 << 62

# event -> {field: type}; fields named here are required. Other fields are free.
EVENT_FIELDS: dict[str, dict[str, str]] = {
    "session": {},
    "start": {},
    "resume": {"from_step": INT},
    "resume_skip": {"name": STR, "step": INT, "reason": STR},
    "step": {"step": INT, "loss": NUM, "lr": NUM},
    "save": {"step": INT, "bytes": INT, "seconds": NUM},
    "serialized": {"step": INT, "name": STR, "bytes": INT, "seconds": NUM},
    "push": {"step": INT, "name": STR, "bytes": INT, "seconds": NUM},
    "push_wait": {"step": INT, "seconds": NUM},
    "push_failed": {"step": INT, "error": STR},
    "verify": {"step": INT, "name": STR, "windows": INT, "bytes_read": INT, "ok": BOOL, "seconds": NUM},
    "delete_local": {"step": INT, "name": STR, "bytes_freed": INT, "free_bytes": INT},
    "prune": {"step": INT, "deleted": LIST, "kept": LIST},
    "memory": {"step": INT, "peak_max": NUM},
    "rate": {"step": INT, "tok_s": NUM, "window_first": INT, "window_last": INT, "seconds": NUM, "rel_err": OPT_NUM},
    "health": {},
    "flops": {"step": INT, "flops_per_token": OPT_NUM},
    "stop": {"reason": STR},
    "done": {"step": INT},
}
# Fields that need not be there, but that consumers read as this type when they are.
OPTIONAL_FIELDS: dict[str, str] = {
    "t": NUM, "rank": INT, "tokens": INT, "tok_s": NUM, "step_s": NUM, "phases": DICT, "lr_expected": NUM,
    "eta_s": OPT_NUM, "total_steps": INT, "max_steps": INT, "params": INT, "world_size": INT,
    "mem_max_bytes": OPT_NUM, "final_checkpoint_verified": BOOL, "failures": LIST, "checkpoint": STR,
    "sample_index": INT, "batch_hash": STR, "lr": NUM, "epoch": INT, "state_bytes": DICT, "tokens_consumed": INT,
    "flops_per_token": OPT_NUM, "formula_flops_per_token": NUM, "flop_s": NUM, "mfu": OPT_NUM, "by_dtype": DICT,
    "gpu_phases": DICT, "async_save": BOOL, "blocked_s": NUM, "gpu_util": OPT_DICT, "dtype": STR, "compiled": BOOL, "device_name": STR,
}
NO_SAMPLE_INDEX = "the trainer printed no sample_index on its step events: the data position cannot be checked"


def _is(value: Any, kind: str) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT
    if kind in (NUM, OPT_NUM):
        if value is None:
            return kind == OPT_NUM
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and abs(value) <= 1e300)
    if kind == OPT_DICT:
        return value is None or isinstance(value, dict)
    return isinstance(value, {STR: str, BOOL: bool, LIST: list, DICT: dict}[kind])


def check_event(record: dict[str, Any]) -> str | None:
    """None if the event has the fields and types its readers rely on; else why not."""
    kind = record["event"]
    for name, want in EVENT_FIELDS.get(kind, {}).items():
        if name not in record:
            return f"{kind} event without {name!r}"
        if not _is(record[name], want):
            return f"{kind} event: {name} is {str(record[name])[:40]!r}, not a {want}"
    for name, want in OPTIONAL_FIELDS.items():
        if name in record and name not in EVENT_FIELDS.get(kind, {}) and not _is(record[name], want):
            return f"{kind} event: {name} is {str(record[name])[:40]!r}, not a {want}"
    for key in ("phases", "gpu_phases", "by_dtype"):
        values = record.get(key)
        if isinstance(values, dict) and not all(_is(v, NUM) and v >= 0 for v in values.values()):
            return f"{kind} event: a value in {key} is not a non-negative number"
    util = record.get("gpu_util")
    if isinstance(util, dict) and not (_is(util.get("mean"), NUM) and 0 <= util["mean"] <= 100):
        return f"{kind} event: gpu_util.mean is not a percentage"
    sizes = record.get("state_bytes")
    if isinstance(sizes, dict) and not all(_is(v, INT) and v >= 0 for v in sizes.values()):
        return f"{kind} event: a state size is not a byte count"
    return None

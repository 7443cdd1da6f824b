"""The host<->instance contract, written once and imported by both sides
(torch-free, stdlib only): the leg environment (`LAUNCHER_*` names and the one
`leg_env()` that builds it for real legs and for the dry run), the stop reasons
a leg prints and the exit codes they mean, and the event lines with the fields
(and types) that the launcher, the drill and the report read. docs/design.md's
"Leg environment" and "Events" sections are this module in prose.

A log is input the host did not make (a trainer of any shape, a doctored file),
so `check_event` says what is wrong with a line instead of letting a string
`step` or a missing field crash `status` or the report three calls later. A
line that fails reads as a `damaged` event naming why; nothing consumes it as
evidence, and `status` and the report show it as such.
"""

from __future__ import annotations

import json
import math
from typing import Any

# --- the leg environment -------------------------------------------------------------
RUN_ID = "LAUNCHER_RUN_ID"
LEG = "LAUNCHER_LEG"
RUNG = "LAUNCHER_RUNG"
STORE = "LAUNCHER_STORE"
"""Checkpoint store URI: file:///abs/dir or hf://owner/repo."""
MAX_STEPS = "LAUNCHER_MAX_STEPS"
"""Stop after this many optimizer steps, counted across legs from step 0."""
DEADLINE = "LAUNCHER_DEADLINE"
"""Unix seconds: push a final checkpoint and stop before it."""
DEADLINE_AFTER_RESUME = "LAUNCHER_DEADLINE_AFTER_RESUME"
"""Seconds (optional): the deadline is also no later than this long after the leg's resume.
How a resume rung lands a deadline a few steps into a leg on a backend that cannot hold a
leg at a step (sky): a deadline fixed at launch would have to guess how long the node takes to
start, and a leg of fast steps that started a second early would reach its step limit first."""
HOLD_AT = "LAUNCHER_HOLD_AT_STEP"
"""Step (optional; a resume rung's middle leg): on reaching it the leg waits, training nothing,
until its deadline is within its stop margin, so the deadline lands at this step on any machine
speed and any backend. The runtime holds itself (runtime.session.rules.local_stop), with a `hold` event: a
hold from outside (the launcher freezing the leg when it read the step) came late wherever the
step line or the freeze was slow -- under load a docker leg ran 6 steps past it to its step limit."""
HOLD_UNTIL = "LAUNCHER_HOLD_UNTIL"
"""`sigterm` (optional, with HOLD_AT; a resume rung's leg 0): the hold ends when the SIGTERM comes
(the deadline's margin still bounds it), so the launcher's SIGTERM, sent when it reads the step,
lands at that step however late it reads it. Under load a fast trainer had run two steps on, to an
epoch boundary, and a planted loader bug then showed another face (tests/legs/test_accelerate.py)."""
HOLD_DEADLINE_S = "LAUNCHER_HOLD_DEADLINE_S"
"""Seconds (optional, with HOLD_AT and no HOLD_UNTIL: a resume rung's deadline leg): on reaching
its hold step the leg places its deadline this long plus its stop margin ahead, where that is
sooner than the deadline it has, so the hold waits this long for a real deadline. Without it the
hold waited out the slack that a deadline placed from the resume must leave for the steps before
the hold on a loaded machine: about 2 s of every rehearsal, 176 s of the test suite's worker time."""
DRILL_HANG = "LAUNCHER_DRILL_HANG"
"""`RANK:STEP` (optional; `launcher drill hang --how collective`): after printing that step, that
rank waits for a message no rank sends, inside torch.distributed: a rank blocked in a collective
its peers never join, as a mismatched collective blocks one. Its peers go on to their next
collective and wait there. The launcher's watchdog must find the leg hung by looking at it."""
MEMORY = "LAUNCHER_MEMORY"
"""`predict` or `measure` (set by `runtime.programs.memory`, never on a leg): the trainer's script
runs its first optimizer steps to learn its peak memory, on fake tensors or for real, and the
Session and the framework adapters stand aside (no store, no checkpoint, no evidence): runtime.memory."""
FILES_SHA256 = "LAUNCHER_FILES_SHA256"
"""The reviewed files' sha256 (JSON): the runtime refuses to run other bytes."""
DETERMINISTIC = "LAUNCHER_DETERMINISTIC"
"""1 on the legs of the rungs whose resumes are compared run against run (rehearsal, smoke, the
drill): the runtime turns on torch's deterministic algorithms (warn-only, each op without a
deterministic kernel named), cudnn's deterministic mode, no TF32; the leg also gets
CUBLAS_WORKSPACE_CONFIG. The probe and the run keep the trainer's own settings (they measure
speed)."""
DETERMINISTIC_RUNGS = frozenset({"rehearsal", "smoke", "drill"})
CUBLAS_WORKSPACE = ":4096:8"
STORE_KEY = "LAUNCHER_STORE_KEY"
"""The project's store key (hex): a secret, never recorded."""
HUB_MAX_FILE_BYTES = "LAUNCHER_HUB_MAX_FILE_BYTES"
"""hf:// stores: a file above this many bytes is stored in parts (launcher.yaml hub.max_file_gb)."""
HUB_FILES_PER_COMMIT = "LAUNCHER_HUB_FILES_PER_COMMIT"
"""hf:// stores: the most files one commit holds (hub.files_per_commit)."""
HUB_COMMITS_PER_HOUR = "LAUNCHER_HUB_COMMITS_PER_HOUR"
"""hf:// stores: the most commits one leg makes to the repo in a rolling hour (hub.commits_per_hour)."""
LEG_NAMES = (RUN_ID, LEG, RUNG, STORE, MAX_STEPS, DEADLINE, FILES_SHA256)


def leg_env(
    *,
    run_id: str,
    leg: int,
    rung: str,
    store: str,
    max_steps: int,
    deadline: float,
    files_sha256: dict[str, str],
    on_gpu: bool,
    extra: dict[str, str] | None = None,
    deadline_after_resume: float | None = None,
    hub: dict[str, str] | None = None,
) -> dict[str, str]:
    """One leg's environment, the same on every backend and in `up --dry-run`.

    `extra` is launcher.yaml's `leg_env` (it may not set a LAUNCHER_* name); `hub` its `hub:`
    limits as LAUNCHER_HUB_* (hf:// stores only). A leg with no GPU still runs on the CPU on
    a machine that has GPUs (CUDA_VISIBLE_DEVICES=""): it rehearses the CPU path and must not
    depend on a GPU."""
    cpu_only = {} if on_gpu else {"CUDA_VISIBLE_DEVICES": ""}
    relative = {} if deadline_after_resume is None else {DEADLINE_AFTER_RESUME: f"{deadline_after_resume:.2f}"}
    exact = {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE, DETERMINISTIC: "1"} if rung in DETERMINISTIC_RUNGS else {}
    return {
        **cpu_only,
        **exact,
        **(extra or {}),
        RUN_ID: run_id,
        LEG: str(leg),
        RUNG: rung,
        STORE: store,
        MAX_STEPS: str(max_steps),
        DEADLINE: str(int(deadline)),
        **relative,
        **(hub or {}),
        FILES_SHA256: json.dumps(files_sha256, sort_keys=True),
    }


def resumed_deadline(deadline: float, env: dict[str, str], now: float) -> float:
    """The leg's deadline once it resumed at `now`: LAUNCHER_DEADLINE, or sooner where
    LAUNCHER_DEADLINE_AFTER_RESUME says (a value that is not a number is ignored)."""
    return deadline_after(deadline, env, DEADLINE_AFTER_RESUME, now)


def deadline_after(deadline: float, env: dict[str, str], key: str, now: float) -> float:
    """`deadline`, or `now` plus the seconds the variable `key` gives, if that is sooner (a value
    that is not a non-negative number is ignored)."""
    try:
        after = float(env.get(key, ""))
    except ValueError:
        return deadline
    return min(deadline, now + after) if math.isfinite(after) and after >= 0 else deadline


# --- stop reasons and exit codes --------------------------------------------------------
EXIT_OK = 0
EXIT_FAILED = 1
"""The final checkpoint was not verified, a non-finite loss, a rank timed out."""
EXIT_REFUSED = 3
"""Stale code, a saved position that does not match the data, a store that refuses us."""
STOP_REASONS: dict[str, int] = {
    "max_steps": EXIT_OK,
    "sigterm": EXIT_OK,
    "deadline": EXIT_OK,  # then `done` says whether it verified
    "stale_code": EXIT_REFUSED,
    "cursor_mismatch": EXIT_REFUSED,
    "store_error": EXIT_REFUSED,
    "loader_not_resumable": EXIT_REFUSED,  # a training loader the Lightning adapter cannot make resumable
    "shape_changed": EXIT_REFUSED,  # a framework's checkpoint saved by another world size, accumulation or batch
    "nonfinite_loss": EXIT_FAILED,
    "rank_timeout": EXIT_FAILED,
}
"""Each stop reason a leg prints and the exit code it means (a graceful stop's 0 holds only
if its `done` then says the final checkpoint verified)."""
EXIT_PREEMPTED = 75
"""A sky leg's `run:` script after its trainer stopped on a spot notice (runtime/programs/notice.py): the
managed job's `recover_on_exit_codes` names it, so SkyPilot recovers without counting a failure."""
REFUSED_REASONS = frozenset(r for r, code in STOP_REASONS.items() if code == EXIT_REFUSED)
STOP_CODES = {1: "sigterm", 2: "deadline"}
"""The graceful stops, by the code the ranks agree on with all-reduce(MAX) (0: go on)."""


def exit_code_of(done: dict[str, Any] | None, stop: dict[str, Any] | None) -> int | None:
    """A leg's exit code from its last `done` and `stop` events (None: it said neither):
    for transports that report something else (SkyPilot's tail_logs returns a JobExitCode)."""
    if done is not None:
        return EXIT_OK if done.get("final_checkpoint_verified", True) else EXIT_FAILED
    if stop is not None:
        return EXIT_REFUSED if stop.get("reason") in REFUSED_REASONS else EXIT_FAILED
    return None


# --- events -----------------------------------------------------------------------------
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
    "notice": {"cloud": STR, "detail": STR},
    "log": {"level": STR, "message": STR},
    "done": {"step": INT},
    "state_digest": {"step": INT, "digests": DICT},
    "trains_from": {"step": INT, "digests": DICT},
}
# Fields that need not be there, but that consumers read as this type when they are.
OPTIONAL_FIELDS: dict[str, str] = {
    "t": NUM,
    "rank": INT,
    "node": INT,
    "tokens": INT,
    "tok_s": NUM,
    "step_s": NUM,
    "phases": DICT,
    "lr_expected": NUM,
    "eta_s": OPT_NUM,
    "total_steps": INT,
    "max_steps": INT,
    "params": INT,
    "world_size": INT,
    "mem_max_bytes": OPT_NUM,
    "final_checkpoint_verified": BOOL,
    "failures": LIST,
    "checkpoint": STR,
    "sample_index": INT,
    "batch_hash": STR,
    "lr": NUM,
    "epoch": INT,
    "state_bytes": DICT,
    "tokens_consumed": INT,
    "flops_per_token": OPT_NUM,
    "formula_flops_per_token": NUM,
    "flop_s": NUM,
    "mfu": OPT_NUM,
    "by_dtype": DICT,
    "gpu_phases": DICT,
    "async_save": BOOL,
    "blocked_s": NUM,
    "gpu_util": OPT_DICT,
    "dtype": STR,
    "compiled": BOOL,
    "device_name": STR,
    "digests": DICT,
    "opt_steps": INT,
    "opt_steps_all": INT,
    "fed_state": DICT,
    "rng_in": STR,  # the global RNG's digest at the step's first training forward
    "rows": LIST,  # step: one short digest per fed row (a sample), runtime.session.samples
    "step_batch_fed": BOOL,
    "batch_from": STR,
    "tracked": DICT,
    "deterministic": OPT_DICT,
    "nondeterministic": LIST,
    "rng_set_after_load": LIST,  # resume: RNG streams the loop set between load_state and its first forward
}
NO_SAMPLE_INDEX = "the trainer printed no sample_index on its step events: the data position cannot be checked"


def _is(value: Any, kind: str) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT
    if kind in (NUM, OPT_NUM):
        if value is None:
            return kind == OPT_NUM
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and abs(value) <= 1e300
        )
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
    for key in ("digests", "tracked", "fed_state"):  # name -> a digest; name -> what kind of state it is
        values = record.get(key)
        if isinstance(values, dict) and not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= 64 for k, v in values.items()
        ):
            return f"{kind} event: {key} is not a map of names to short strings"
    sizes = record.get("state_bytes")
    if isinstance(sizes, dict) and not all(_is(v, INT) and v >= 0 for v in sizes.values()):
        return f"{kind} event: a state size is not a byte count"
    return None

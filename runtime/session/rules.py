"""The leg contract as every leg API enforces it: `runtime.session.Session` and the
trainer adapters (runtime/adapters/) share these pieces.

- `stale_code_refused`: the reviewed files' guard a leg runs before anything else
  (`stale_files`: which files differ from the sha256 the launcher reviewed);
- `local_stop`: one rank's stop decision before a step (deadline with room for one
  more push, SIGTERM), which the ranks then agree on;
- `ResumeRefused`: what a tracked object (a loader, a data cursor) raises when the
  state it is asked to load does not describe this run;
- `LegEnd`: the leg's end before its loop is done (a refusal, a non-finite loss, an
  unverified final checkpoint), raised with its exit code and its reason.

The stop reasons and the exit codes they mean are runtime.contract's.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from runtime import contract, events
from runtime.hashing import sha256_file

DEFAULT_MAX_STEPS = 50
"""LAUNCHER_MAX_STEPS when the leg's environment does not set it (a trainer run by hand)."""


class ResumeRefused(RuntimeError):
    """Raised by a tracked object's `load_state_dict` when the saved state does not
    describe this run (another data set, batch size or world size): the leg stops
    with exit 3 and `reason` rather than train on other data."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LegEnd(SystemExit):
    """The leg ends here: a SystemExit with the leg's exit code (runtime.contract, which the
    launcher reads) and the reason its `stop` line gave. Uncaught, the process exits with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.exit_code = code
        self.reason = reason

    def __str__(self) -> str:
        return f"leg ends with exit {self.exit_code}: {self.reason}"


def stale_files(expected_json: str | None, root: Path) -> list[str]:
    """Files whose bytes differ from the reviewed sha256 the launcher passed
    (LAUNCHER_FILES_SHA256, JSON {path: sha256}); [] when none was passed."""
    if not expected_json:
        return []
    stale = []
    for rel, sha in sorted(json.loads(expected_json).items()):
        path = root / rel
        if not path.is_file():
            stale.append(f"{rel} (missing)")
        elif sha256_file(path) != sha:
            stale.append(rel)
    return stale


def stale_code_refused() -> bool:
    """The reviewed files' guard, as every leg runs it: True (with the `stop` line printed)
    when the files here differ from the sha256 the launcher passed."""
    stale = stale_files(os.environ.get(contract.FILES_SHA256), Path.cwd())
    if stale:
        events.emit("stop", reason="stale_code", step=0, error=f"differ from review: {', '.join(stale)}")
    return bool(stale)


def local_stop(
    deadline: float, last_cycle_s: float, step_s: float, sigterm: bool | list[bool], step: int | None = None
) -> int:
    """This rank's stop code (runtime.contract.STOP_CODES; 0: go on): the deadline, with room
    for one more push cycle and a few steps (at least 5 s), comes before a pending SIGTERM.
    `sigterm`: the leg's SIGTERM flag (a list its handler appends to: read again after a hold).
    `step` (the steps done): where LAUNCHER_HOLD_AT_STEP asks, the leg first waits at that step
    until the deadline is due, or until the SIGTERM comes where LAUNCHER_HOLD_UNTIL says so (`hold`)."""
    margin = max(5.0, 2 * last_cycle_s + 3 * step_s)
    if step is not None:
        hold(step, deadline, margin, sigterm)
    if _placed:
        deadline = min(deadline, _placed[0])
    return 2 if time.time() + margin >= deadline else (1 if sigterm else 0)


_held: list[int] = []
_placed: list[float] = []
"""The deadline the hold placed (LAUNCHER_HOLD_DEADLINE_S), once placed: it stands for the rest of the leg."""


def hold(step: int, deadline: float, margin: float, sigterm: bool | list[bool] = False) -> None:
    """Once, at LAUNCHER_HOLD_AT_STEP: sleep until the deadline is within `margin` (or, with
    LAUNCHER_HOLD_UNTIL=sigterm, until the SIGTERM flag is up, if sooner), with a `hold` event
    (its step, the most seconds it waits, what it waits for). Nothing is trained meanwhile, so
    the stop lands right after this step, whatever the machine's speed. Waiting for the deadline,
    it first places it LAUNCHER_HOLD_DEADLINE_S (plus the margin) ahead, where that is sooner."""
    try:
        at = int(os.environ.get(contract.HOLD_AT, ""))
    except ValueError:
        return
    if _held or step < at or not math.isfinite(deadline):
        return
    _held.append(step)
    until = "sigterm" if os.environ.get(contract.HOLD_UNTIL) == "sigterm" else "deadline"
    if until == "deadline":
        placed = contract.deadline_after(deadline, dict(os.environ), contract.HOLD_DEADLINE_S, time.time() + margin)
        if placed < deadline:
            _placed.append(placed)
            deadline = placed
    wait = max(0.0, deadline - margin - time.time()) + 0.05
    events.emit("hold", step=step, seconds=round(wait, 3), deadline=deadline, until=until)
    if until == "deadline":
        time.sleep(wait)
        return
    end = time.time() + wait
    while not sigterm and time.time() < end:
        time.sleep(0.01)


def stray(step: int, world: Any) -> None:
    """At LAUNCHER_DRILL_HANG's rank and step (a drill's, once): block in a collective no peer
    joins, a receive from the next rank, which never sends (until the process group's timeout)."""
    asked = os.environ.get(contract.DRILL_HANG)
    if not asked:  # every step of every leg passes here: no drill, nothing to parse
        return
    try:
        rank, at = (int(part) for part in asked.split(":"))
    except ValueError:
        return
    if world.rank != rank or step != at or not world.distributed:
        return
    import torch
    import torch.distributed as tdist

    events.log(events.INFO, f"drill: rank {rank} blocks in a receive no rank sends", source="drill")
    tdist.recv(torch.zeros(1), src=(rank + 1) % world.world_size, group=world.ctrl)

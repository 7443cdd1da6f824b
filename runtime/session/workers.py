"""Loaders with worker processes under the leg's stop.

A leg is stopped by SIGTERM to its whole process group: the launcher's stop, SkyPilot's cancel,
a spot machine's notice. A DataLoader worker takes SIGTERM's default action and dies; the main
process's SIGCHLD handler then raises "DataLoader worker (pid N) is killed by signal: Terminated"
in the middle of a step, and the leg ends with no final checkpoint (found by the rehearsal's
SIGTERM leg on examples/stateful_loader: exit 1, no `done`). The stop is the main process's
decision: it finishes its step, saves, pushes and verifies, and its workers serve it meanwhile.

So, two guards:
- a tracked loader's workers ignore SIGTERM while the main process is running, and take it
  once the main process is leaving (a flag in shared memory, set by an exit hook): Python's own
  exit terminates daemonic children with SIGTERM and then joins them, and a worker that ignored
  that one too held the leg forever after its `done` (seen: killed at the budget, 360 s);
- once the leg has its SIGTERM, a worker's death is no longer an error in the main process
  (`quiet_sigchld`): the workers of a loader the session does not know of (not tracked, or
  inside a framework) die with the group, and the leg still stops at its step, saves and
  pushes. CPython runs the handlers of signals that arrived together in signal-number order,
  SIGTERM (15) before SIGCHLD (17).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
from typing import Any, Callable

import torch

_leaving: Any = None


def _leave() -> None:
    _leaving.value = 1


def leaving_flag() -> Any:
    """One shared byte per process: 1 once it is exiting (registered after multiprocessing's own
    exit hook, so it runs first)."""
    global _leaving
    if _leaving is None:
        _leaving = multiprocessing.RawValue("b", 0)
        atexit.register(_leave)
    return _leaving


class IgnoreTerm:
    """A worker_init_fn: SIGTERM waits for the main process's exit, then the loader's own init.
    A module-level class, so a loader under the spawn start method can still pickle it."""

    def __init__(self, inner: Callable[[int], Any] | None, leaving: Any) -> None:
        self.inner, self.leaving = inner, leaving

    def __call__(self, worker_id: int) -> None:
        leaving = self.leaving

        def on_term(*_: Any) -> None:
            if leaving.value:  # the main process is exiting: end as SIGTERM would
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        if self.inner is not None:
            self.inner(worker_id)


def shield_workers(obj: Any) -> None:
    """Make a DataLoader's worker processes (if it has any) leave SIGTERM to the main process.
    Takes effect for the workers started after this (track() comes before the first epoch)."""
    if (
        isinstance(obj, torch.utils.data.DataLoader)
        and obj.num_workers > 0
        and not isinstance(obj.worker_init_fn, IgnoreTerm)
    ):
        obj.worker_init_fn = IgnoreTerm(obj.worker_init_fn, leaving_flag())


def quiet_sigchld() -> None:
    """From the leg's SIGTERM on: a child's exit is not an error (torch's SIGCHLD handler,
    which raises in the main process when a loader worker dies, is set aside)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)

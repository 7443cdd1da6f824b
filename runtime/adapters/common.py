"""What every framework adapter (hf.py, lightning.py, accelerate.py) does the same way: read
the leg's environment, refuse stale code, and fetch the store's newest verified checkpoint
(refusing, exit 3, when the store itself refuses us)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from runtime import contract, events
from runtime.checkpoint.disk import write_manifest
from runtime.checkpoint.restore import Restored, restore_newest
from runtime.contract import EXIT_REFUSED
from runtime.session.rules import DEFAULT_MAX_STEPS, stale_code_refused
from runtime.store import StoreError, open_store


class LegAdapter:
    """The leg's facts as attributes (run_id, leg, max_steps, deadline, work, rank, store); the
    adapter sets `pusher` (None on ranks that push nothing) and `resumed_at`."""

    pusher: Any
    resumed_at: int

    def read_leg(self, workdir: str | Path, adapter: str) -> None:
        """The leg environment (defaults when run by hand), then the `session` event and the
        stale-code guard, before anything slow."""
        env = os.environ
        self.run_id = env.get(contract.RUN_ID, "local")
        self.leg = int(env.get(contract.LEG, "0"))
        self.max_steps = int(env.get(contract.MAX_STEPS, str(DEFAULT_MAX_STEPS)))
        self.deadline = float(env.get(contract.DEADLINE, "inf"))
        self.work = Path(workdir).resolve()
        self.rank = int(env.get("RANK", "0"))
        self.store = open_store(env.get(contract.STORE, (self.work / "store").as_uri()), f"runs/{self.run_id}")
        events.emit("session", run_id=self.run_id, leg=self.leg, pid=os.getpid(), adapter=adapter)
        if stale_code_refused():
            sys.exit(EXIT_REFUSED)

    def restore(self, check: Callable[[Path, Any], Any]) -> Restored:
        """The newest verified checkpoint, fetched into work/restore and kept as files (checked by
        `check(folder, seal)`, damage skipped); a store that refuses us stops the leg (exit 3)."""
        try:
            return restore_newest(self.store, self.work / "restore", keep_files=True, check=check)
        except StoreError as err:
            events.emit("stop", reason="store_error", step=0, error=f"{type(err).__name__}: {err}")
            sys.exit(EXIT_REFUSED)

    def push(self, folder: Path, step: int, fmt: str, began: float) -> None:
        """A framework's checkpoint folder of `step` into the storage cycle: its manifest, the
        background push, the `save` event (seconds since `began`)."""
        manifest = write_manifest(folder, step, {"run_id": self.run_id, "format": fmt})
        blocked = self.pusher.submit(folder, manifest)
        events.emit(
            "save",
            step=step,
            bytes=manifest.total_bytes,
            seconds=round(time.perf_counter() - began, 4),
            blocked_s=round(blocked, 4),
        )

    def end(self, reason: str, step: int) -> bool:
        """`stop`, the storage cycle drained, `done`: whether the final checkpoint verified (a leg
        that stops where it resumed had nothing new to push)."""
        events.emit("stop", reason=reason, step=step)
        ok = True
        if self.pusher is not None:
            self.pusher.drain()
            ok = step == self.resumed_at or self.pusher.verified(step)
        events.emit("done", step=step, final_checkpoint_verified=ok)
        return ok


def check_windows(folder: Path, seal: dict[str, Any] | None) -> None:
    """The fetched files against the seal's windows (a framework's own folder: it loads the rest)."""
    from runtime.store.seal import check_windows as check

    if seal is not None:
        check(folder, seal)

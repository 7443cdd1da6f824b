"""What every framework adapter (hf.py, lightning.py, accelerate.py) does the same way: read
the leg's environment, refuse stale code, fetch the store's newest verified checkpoint (refusing,
exit 3, when the store itself refuses us) as the frozen `Resumed` the Session's resume makes
too, and save through the Session's `Saver` (runtime.session.saver): a framework's folder into
the storage cycle, the final verdict."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from runtime import contract, events
from runtime.checkpoint.cycle import Pusher
from runtime.checkpoint.restore import restore_newest
from runtime.contract import EXIT_REFUSED
from runtime.session.resume import Resumed
from runtime.session.rules import DEFAULT_MAX_STEPS, LegEnd, stale_code_refused
from runtime.session.saver import Saver
from runtime.store import StoreError, open_store
from runtime.store.base import MANIFEST


class LegAdapter:
    """The leg's facts as attributes (run_id, leg, max_steps, deadline, work, rank, store), the
    `saver` (its pusher made by `open_saver`: None on ranks that push nothing) and `resumed`
    (where the leg starts: set by `resume_from`)."""

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
        self.restore_dir = self.work / "restore"
        self.saver = Saver()
        self.resumed = Resumed()
        events.emit("session", run_id=self.run_id, leg=self.leg, pid=os.getpid(), adapter=adapter)
        if stale_code_refused():
            raise LegEnd(EXIT_REFUSED, "stale_code")

    def open_saver(self, keep: int, verify_bytes: int, pushes: bool) -> None:
        """The storage cycle's pusher where this rank `pushes` (None elsewhere)."""
        self.saver.pusher = Pusher(self.store, keep=keep, verify_budget=verify_bytes) if pushes else None

    def resume_from(self, check: Callable[[Path, Any], Any]) -> Resumed:
        """The newest verified checkpoint, fetched into `restore_dir`/<its name> and kept as the
        framework's files (checked by `check(folder, seal)`, damage skipped, the manifest dropped);
        the saver starts at its step. `Resumed()` (no checkpoint): start fresh. A store that refuses
        us ends the leg (exit 3)."""
        try:
            restored = restore_newest(self.store, self.restore_dir, keep_files=True, check=check)
        except StoreError as err:
            events.emit("stop", reason="store_error", step=0, error=f"{type(err).__name__}: {err}")
            raise LegEnd(EXIT_REFUSED, "store_error") from err
        if restored.info is None:
            return self.resumed
        info = restored.info
        (self.restore_dir / info.name / MANIFEST).unlink(missing_ok=True)
        self.resumed = Resumed(step=info.step, checkpoint=info.name, skipped=frozenset(restored.skipped))
        self.saver.start_at(info.step)
        return self.resumed

    def push(self, folder: Path, step: int, fmt: str, began: float, state_bytes: dict[str, int] | None = None) -> None:
        """A framework's checkpoint folder of `step` into the storage cycle: its manifest, the
        background push, the `save` event (seconds since `began`; `state_bytes` by kind, measured
        from the state saved: proof 7 sizes the checkpoint by it, not by an assumed optimizer)."""
        self.saver.push_folder(folder, step, {"run_id": self.run_id, "format": fmt}, began, state_bytes)

    def end(self, reason: str, step: int) -> bool:
        """`stop`, the storage cycle drained, `done`: whether the final checkpoint verified (a leg
        that stops where it resumed had nothing new to push)."""
        events.emit("stop", reason=reason, step=step)
        ok = self.saver.final(step)
        events.emit("done", step=step, final_checkpoint_verified=ok)
        return ok


def check_windows(folder: Path, seal: dict[str, Any] | None) -> None:
    """The fetched files against the seal's windows (a framework's own folder: it loads the rest)."""
    from runtime.store.seal import check_windows as check

    if seal is not None:
        check(folder, seal)

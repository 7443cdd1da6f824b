"""What every framework adapter (hf.py, lightning.py, accelerate.py) does the same way: read
the leg's environment, refuse stale code, join the framework's world of ranks, fetch the store's
newest verified checkpoint (refusing, exit 3, when the store itself refuses us or the checkpoint
was saved by another shape of run) as the frozen `Resumed` the Session's resume makes too, and
save through the Session's `Saver` (runtime.session.saver): a framework's folder into the storage
cycle, every rank's own files in it, the final verdict.

On several ranks the framework owns the process group; `join_world` builds our `World` over it
(a gloo control group), and the collectives here follow the Session's (runtime.session.resume):
rank 0 chooses, every rank learns the choice, each node fetches once. Measured before they were
shared (docs/notes-multirank.md): every rank fetching into one `./restore` resumed ranks at
different steps (5 and 7) on one disk; two nodes pushed rank 0's RNG file only, and the other
rank resumed another RNG stream, unnamed."""

from __future__ import annotations

import atexit
import math
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
from runtime.session.world import World
from runtime.store import StoreError, open_store
from runtime.store.base import MANIFEST, CheckpointDamaged

SHAPE_KEYS = ("world_size", "accumulation", "per_rank_batch")
"""The run's shape, saved in every pushed manifest's meta: a checkpoint means something only to a
leg of the same shape (per-rank RNG files, a loader position counted in per-rank batches, an
accumulation window counted in micro-batches)."""


def epoch_of_step(progress: float | None) -> int:
    """The epoch a step trained in, from the HF Trainer's `state.epoch` after it: the epoch plus
    the share of it done, so an epoch's last step reads the next epoch's whole number (16 steps an
    epoch: step 16 reads 1.0, step 17 1.0625). `int()` of it put each epoch's last step in the next
    epoch, and `--at epoch-end` stopped a step before the boundary (resume-matrix, 2026-12-06)."""
    return max(0, math.ceil(progress or 0) - 1)


class LegAdapter:
    """The leg's facts as attributes (run_id, leg, max_steps, deadline, work, rank, store), the
    `world` of ranks (a world of one until `join_world`), the run's `shape` (SHAPE_KEYS, set by the
    adapter before it resumes or pushes), the `saver` (its pusher made by `open_saver`: None on
    ranks that push nothing) and `resumed` (where the leg starts: set by `resume_from`)."""

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
        self.world = World()
        self.shape: dict[str, int] = {}
        self.store = open_store(env.get(contract.STORE, (self.work / "store").as_uri()), f"runs/{self.run_id}")
        self.restore_dir = self.work / "restore"
        self.saver = Saver()
        self.resumed = Resumed()
        events.emit("session", run_id=self.run_id, leg=self.leg, pid=os.getpid(), adapter=adapter)
        if stale_code_refused():
            raise LegEnd(EXIT_REFUSED, "stale_code")

    def join_world(self) -> World:
        """Every rank, at one point, once the framework's process group exists: `world` over it
        (a world of one when there is none). RANK is set where the framework's launcher left it
        unset (Lightning's own sets LOCAL_RANK and NODE_RANK only): every event names its rank."""
        import torch.distributed as tdist

        if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() <= 1:
            self.world = World()
            return self.world
        gloo = tdist.get_backend() == "gloo"
        ctrl = tdist.group.WORLD if gloo else tdist.new_group(backend="gloo")  # collective: every rank
        rank = tdist.get_rank()
        self.world = World(rank, tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), ctrl)
        os.environ.setdefault("RANK", str(rank))
        self.rank = rank
        atexit.register(leave_world, self.world)
        return self.world

    def open_saver(self, keep: int, verify_bytes: int, pushes: bool) -> None:
        """The storage cycle's pusher where this rank `pushes` (None elsewhere)."""
        self.saver.pusher = Pusher(self.store, keep=keep, verify_budget=verify_bytes) if pushes else None

    def resume_from(self, check: Callable[[Path, Any], Any]) -> Resumed:
        """Every rank: the newest verified checkpoint, fetched into `restore_dir`/<its name> and
        kept as the framework's files (checked by `check(folder, seal)`, damage skipped, the
        manifest dropped); the saver starts at its step. Rank 0 chooses and tells every rank; the
        first rank of each other node fetches the same checkpoint onto its own disk. `Resumed()`
        (no checkpoint): start fresh. A store that refuses us, or a checkpoint saved by another
        shape of run (`shape`), ends the leg on every rank (exit 3) before anything trains."""
        world = self.world
        choice: tuple[str, Any, list[str], dict[str, Any]] | None = None
        if world.is_main:
            try:
                restored = restore_newest(self.store, self.restore_dir, keep_files=True, check=check)
                info = restored.info
                found = (info.name, info.step, info.seal) if info is not None else None
                choice = ("ok", found, restored.skipped, dict(info.manifest.meta) if info else {})
            except StoreError as err:  # an auth error must not read as "nothing here"
                choice = ("error", f"{type(err).__name__}: {err}", [], {})
        status, found, skipped, meta = world.broadcast(choice)
        if status == "error":
            self._refuse("store_error", 0, found)
        if found is None:
            self.resumed = Resumed(skipped=frozenset(skipped))
            return self.resumed
        name, step, seal = found
        problem = self._fetch_on_node(name, seal, check) if world.local_rank == 0 and not world.is_main else None
        problems = [p for p in world.gather(problem) if p]  # also the barrier: every node has the files
        if problems:
            self._refuse("store_error", step, problems[0])
        if (changed := shape_change(meta, self.shape)) is not None:
            self._refuse("shape_changed", step, changed)
        if world.local_rank == 0:
            (self.restore_dir / name / MANIFEST).unlink(missing_ok=True)
        self.resumed = Resumed(step=step, checkpoint=name, skipped=frozenset(skipped))
        self.saver.start_at(step)
        return self.resumed

    def _fetch_on_node(self, name: str, seal: Any, check: Callable[[Path, Any], Any]) -> str | None:
        """The chosen checkpoint onto this node's disk, checked as rank 0 checked it: None, or
        why it could not be (the store answered rank 0 a moment ago: a failure here is no choice
        of another checkpoint, every rank ends)."""
        import shutil

        try:
            shutil.rmtree(self.restore_dir / name, ignore_errors=True)
            self.store.fetch(name, self.restore_dir)
            check(self.restore_dir / name, seal)
        except (StoreError, CheckpointDamaged, FileNotFoundError) as err:
            return f"node of rank {self.world.rank} fetching {name}: {type(err).__name__}: {err}"
        return None

    def _refuse(self, reason: str, step: int, error: str) -> None:
        """`stop` with `reason` and the one line saying why, then the leg ends (exit 3)."""
        events.emit("stop", reason=reason, step=step, error=error)
        raise LegEnd(EXIT_REFUSED, reason)

    def collect_rank_files(self, folder: Path, pattern: str) -> list[int]:
        """Every rank, once the framework saved a checkpoint into `folder` on each: each rank's
        own file (`pattern` with `{rank}`, such as "rng_state_{rank}.pth") copied into rank 0's
        `folder` where rank 0's disk lacks it (each node its own disk), then a barrier. The ranks
        whose file rank 0 still lacks, the same list on every rank: a checkpoint without every
        rank's RNG resumes some rank on another stream, so its push is refused."""
        world = self.world
        if not world.distributed:
            return [] if (folder / pattern.format(rank=0)).is_file() else [0]
        lacking = world.broadcast(
            [r for r in range(world.world_size) if not (folder / pattern.format(rank=r)).is_file()]
            if world.is_main
            else None
        )
        own = folder / pattern.format(rank=world.rank)
        sent = own.read_bytes() if world.rank in lacking and own.is_file() else None
        received = world.gather(sent)
        if world.is_main:
            for r in lacking:
                if received[r] is not None:
                    tmp = folder / f".{pattern.format(rank=r)}.part"
                    tmp.write_bytes(received[r])
                    tmp.replace(folder / pattern.format(rank=r))
        missing = [r for r in lacking if received[r] is None]
        world.barrier(f"rank 0 collecting {pattern} into {folder.name}")
        return missing

    def agree_stop(self, code: int) -> int:
        """The largest stop code across ranks (contract.STOP_CODES; 0: go on): every rank stops
        at the same step, so none waits alone in the next step's collective."""
        return int(self.world.max(code))

    def push(self, folder: Path, step: int, fmt: str, began: float, state_bytes: dict[str, int] | None = None) -> None:
        """A framework's checkpoint folder of `step` into the storage cycle: its manifest (the
        run's `shape` in its meta), the background push, the `save` event (seconds since
        `began`; `state_bytes` by kind, measured from the state saved: proof 7 sizes the
        checkpoint by it, not by an assumed optimizer)."""
        meta = {"run_id": self.run_id, "format": fmt, **self.shape}
        self.saver.push_folder(folder, step, meta, began, state_bytes)

    def end(self, reason: str, step: int) -> bool:
        """`stop`, the storage cycle drained, `done`: whether the final checkpoint verified (a leg
        that stops where it resumed had nothing new to push)."""
        events.emit("stop", reason=reason, step=step)
        ok = self.saver.final(step)
        events.emit("done", step=step, final_checkpoint_verified=ok)
        return ok


SHAPE_WORDS = {
    "world_size": ("saved by {} ranks", "this leg has {}"),
    "accumulation": ("saved with {} micro-batches per optimizer step", "this leg has {}"),
    "per_rank_batch": ("saved with a per-rank batch of {}", "this leg has {}"),
}


def shape_change(meta: dict[str, Any], shape: dict[str, int]) -> str | None:
    """The one line naming the first of SHAPE_KEYS whose saved value (`meta`) differs from this
    leg's (`shape`), both values; None where every key known on both sides agrees (a checkpoint
    saved before shapes were recorded is not refused)."""
    for key in SHAPE_KEYS:
        saved, here = meta.get(key), shape.get(key)
        if saved is not None and here is not None and int(saved) != int(here):
            was, now = SHAPE_WORDS[key]
            return f"the checkpoint was {was.format(saved)}, {now.format(here)}: resume it with the same {key}"
    return None


DRAIN_S = 0.25


def leave_world(world: World) -> None:
    """At exit, while the interpreter is whole: leave the framework's group, then wait `DRAIN_S`
    with the GIL free. A rank exited after its `done` by SIGABRT ("terminate called without an
    active exception": torchrun exit 1, a leg whose checkpoint verified read as failed), 1 of 20
    two-rank HF legs under load here, and Accelerate's once: a gloo worker thread that still held
    the last reference to a finished collective (the last all-reduce before the exit) released
    its tensors after teardown began, took the GIL, and was ended by pthread_exit (gdb's trace of
    the same abort: docs/benchmarks.md, "The abort's mechanism"). Unlike the Session's, this
    group outlives `destroy_process_group`: the framework's DDP wrapper holds it until teardown,
    so its threads do too; the wait lets them let go of their work while the GIL can be had."""
    import time

    world.close()
    if world.distributed:
        time.sleep(DRAIN_S)


def check_windows(folder: Path, seal: dict[str, Any] | None) -> None:
    """The fetched files against the seal's windows (a framework's own folder: it loads the rest)."""
    from runtime.store.seal import check_windows as check

    if seal is not None:
        check(folder, seal)

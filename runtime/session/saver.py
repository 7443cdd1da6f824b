"""The leg's saves, as one part every leg API holds: `Saver` is what the Session and the
framework adapters (runtime/adapters/) share (the pusher, the step last handed to it, the step
resumed at, a folder into the storage cycle, the final verdict); `StateSaver` is the Session's
own, which takes the tracked state at a step: a snapshot handed to the background pusher
(async) or a torch.save here (sync); sharded state is every rank's (runtime.session.sharded).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import events
from runtime.checkpoint.cycle import Pusher
from runtime.checkpoint.disk import (
    PendingCheckpoint,
    SnapshotPool,
    save_local,
    snapshot_state,
    tensor_bytes,
    write_manifest,
)
from runtime.checkpoint.node_cycle import Leaders
from runtime.session.step_evidence import state_digests
from runtime.session.world import World
from runtime.store.base import Store


class Saver:
    """The storage cycle from the leg's side. `pusher`: None on ranks that push nothing;
    `pushed_at`: the step last handed to it (or resumed at: nothing new to save there)."""

    def __init__(self, pusher: Pusher | None = None, resumed_at: int = 0) -> None:
        self.pusher = pusher
        self.resumed_at = resumed_at
        self.pushed_at = resumed_at

    def start_at(self, step: int) -> None:
        """The leg resumed at `step` (0: fresh): its state is in the store already."""
        self.resumed_at = self.pushed_at = step

    @property
    def last_cycle_s(self) -> float:
        """The last push cycle's seconds (0 where this rank pushes nothing): the stop's margin."""
        return self.pusher.last_cycle_s if self.pusher is not None else 0.0

    def push_folder(
        self, folder: Path, step: int, meta: dict[str, Any], began: float, state_bytes: dict[str, int] | None = None
    ) -> None:
        """A checkpoint folder written at `step` into the storage cycle: its manifest, the
        background push, the `save` event (seconds since `began`; `state_bytes`: the tensor bytes
        of each kind of state the folder holds, measured by the caller: what proof 7 sizes the
        checkpoint against)."""
        if self.pusher is None:
            raise RuntimeError("push_folder on a rank that pushes nothing")
        manifest = write_manifest(folder, step, meta)
        blocked = self.pusher.submit(folder, manifest)
        events.emit(
            "save",
            step=step,
            bytes=manifest.total_bytes,
            seconds=round(time.perf_counter() - began, 4),
            blocked_s=round(blocked, 4),
            **({"state_bytes": {k: v for k, v in state_bytes.items() if v}} if state_bytes else {}),
        )

    def drain(self) -> None:
        """Every checkpoint handed over through its cycle (nothing here where none is)."""
        if self.pusher is not None:
            self.pusher.drain()

    def final(self, step: int) -> bool:
        """Every push through its cycle; whether `step`'s checkpoint verified (True on a rank
        that pushes nothing, and where the leg stops at the step it resumed at: nothing new)."""
        if self.pusher is None:
            return True
        self.pusher.drain()
        return step == self.resumed_at or self.pusher.verified(step)


@dataclass(frozen=True)
class AtStep:
    """What one checkpoint of the Session holds: the tracked objects and `extra` as they are at
    `step`, every rank's RNG state (gathered), the tokens, the manifest's `meta`."""

    step: int
    tokens: int
    rngs: list[Any]
    tracked: dict[str, Any]
    extra: dict[str, Any]
    meta: dict[str, Any]


class StateSaver(Saver):
    """The Session's saver: the tracked state under `work`/ckpt, then the storage cycle.
    `leaders`: on several nodes with sharded state, the node leaders' group (each node pushes
    its shards: runtime.checkpoint.node_cycle)."""

    def __init__(self, work: Path) -> None:
        super().__init__()
        self.work = work
        self.leaders: Leaders | None = None
        self.pool: SnapshotPool | None = None
        """async saves' reusable host buffers (dropped by `final`)"""

    def open(self, store: Store, world: World, keep: int, verify_bytes: int, replace: frozenset[str]) -> None:
        """The pusher, on the ranks that push: rank 0, and with `leaders` each node's local rank 0.
        `replace`: damaged names in the store a push of the same step may replace."""
        if world.is_main or (self.leaders is not None and world.local_rank == 0):
            self.pusher = Pusher(store, keep=keep, verify_budget=verify_bytes, replace=replace)

    def save(self, at: AtStep, async_save: bool, began: float) -> None:
        """`async_save`: the snapshot copies every tensor (runtime.checkpoint.disk.snapshot_state)
        once the pusher's queue has a place, and its worker serialises it; False: torch.save +
        manifest here. `save`: `seconds` on the critical path since `began`, `bytes` the state's
        tensor bytes (async) or the checkpoint's."""
        if self.pusher is None:
            return
        pusher, step = self.pusher, at.step
        sizes: dict[str, int] = {}

        def digests(state: dict[str, Any]) -> None:  # async: on the pusher's thread, from the snapshot
            events.emit("state_digest", step=step, digests=state_digests(state, list(state)))

        def take() -> dict[str, Any]:
            state = {name: obj.state_dict() for name, obj in at.tracked.items()}
            state.update(rng=at.rngs, step=step, tokens=at.tokens, extra=at.extra)
            sizes.update((name, tensor_bytes(value)) for name, value in state.items() if name != "rng")
            return state

        if async_save:
            pool = self.pool = self.pool or SnapshotPool()
            copied: list[int] = []

            def build() -> PendingCheckpoint:
                snap = snapshot_state(take(), pool)
                copied.append(snap.bytes)
                return PendingCheckpoint(snap, self.work / "ckpt", step, at.meta, before_save=digests)

            blocked = pusher.submit_job(step, build)  # a place in the queue first: two snapshots at most
            nbytes = copied[0]
        else:
            digests(state := take())
            folder, manifest = save_local(state, self.work / "ckpt", step, at.meta)
            blocked = pusher.submit(folder, manifest)
            nbytes = manifest.total_bytes
        events.emit(
            "save",
            step=step,
            bytes=nbytes,
            seconds=round(time.perf_counter() - began, 4),
            blocked_s=round(blocked, 4),
            state_bytes={k: v for k, v in sizes.items() if v},
            params=at.meta.get("params", 0),
            async_save=async_save,
        )

    def final(self, step: int) -> bool:
        verified = super().final(step)
        self.pool = None  # the reusable host buffers go
        return verified

"""The storage cycle of a sharded checkpoint written on several nodes (runtime.checkpoint.dcp).

Each node's shards sit on that node's disk, so each node pushes its own: the local rank 0 of
every node (a *leader*) runs this in its pusher thread, in step order, and the leaders agree
through a gloo group of their own (`World.leaders`), which only the pusher threads use, so it
never meets the training loop's collectives. For one checkpoint:

1. rank 0 clears what an unverified earlier push of this step left; every leader waits for it;
2. each leader hashes its files and pushes them (`Store.push_part`: staged, never listed);
3. rank 0, once every leader's part is there, writes the one manifest over all of them
   (`Store.commit`: the checkpoint exists from here, whole);
4. each leader verifies its own files against its own local bytes (ranged reads, its share of
   the verify budget): only a node holds the bytes its files must equal;
5. rank 0 holds the manifest to cover every shard and every rank (runtime.checkpoint.dcp), seals the
   windows every leader read (`verified.json`), or says why not;
6. each leader deletes its local copy only once the checkpoint is verified; rank 0 prunes.

A leader whose push or verify failed says so in its turn; nobody waits on a leader that gave
up, and the checkpoint never counts.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import events
from runtime.hashing import sha256_file
from runtime.store.base import MANIFEST, FileEntry, Manifest, Store, checkpoint_name


@dataclass
class Leaders:
    """The gloo group of every node's local rank 0, and this rank's place in it."""

    group: Any
    ranks: list[int]
    rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as tdist

        out: list[Any] = [None] * len(self.ranks)
        tdist.all_gather_object(out, obj, group=self.group)
        return out

    def from_main(self, obj: Any) -> Any:
        import torch.distributed as tdist

        box = [obj]
        tdist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


class NodeCheckpoint:
    """A pusher job (runtime.checkpoint.cycle.Pusher): this node's part of checkpoint `step`, written in `folder`."""

    def __init__(self, folder: Path, step: int, meta: dict[str, Any], leaders: Leaders) -> None:
        self.folder, self.step, self.meta, self.leaders = folder, step, meta, leaders
        self.name = checkpoint_name(step)

    def discard(self) -> None:
        """Nothing held in memory: the files stay on disk until verified."""

    def run_cycle(self, store: Store, keep: int, verify_budget: int, replace: frozenset[str]) -> Any:
        from runtime.checkpoint.cycle import CycleResult
        from runtime.checkpoint.verify import verify_checkpoint

        leaders, name = self.leaders, self.name
        began = time.perf_counter()
        pushed = self._push(store, replace)
        if pushed is None:
            return None
        own, manifest = pushed
        push_s = time.perf_counter() - began
        if leaders.is_main:
            events.emit(
                "push",
                step=self.step,
                name=name,
                bytes=manifest.total_bytes,
                seconds=round(push_s, 4),
                nodes=len(leaders.ranks),
                files=len(manifest.files),
            )
        mine = verify_checkpoint(
            store,
            Manifest(name, self.step, own, self.meta),
            self.folder,
            budget_bytes=max(1, verify_budget // len(leaders.ranks)),
        )
        verified = self._seal(store, manifest, mine)
        if verified:
            self._delete_local(store, own, keep)
        return CycleResult(manifest, verified, push_s, mine.seconds)

    def _push(self, store: Store, replace: frozenset[str]) -> tuple[tuple[FileEntry, ...], Manifest] | None:
        """Steps 1-3: clear an earlier attempt, push this node's files, commit the manifest; None if one failed."""
        from runtime.checkpoint.cycle import _clear_unverified

        leaders, name = self.leaders, self.name

        def clear() -> None:
            _clear_unverified(store, name, replace)
            store.drop_parts(name)

        cleared = _attempt(clear) if leaders.is_main else None
        if leaders.from_main(cleared) is not None:
            self._failed("clear", str(cleared))
            return None
        own = tuple(
            FileEntry(p.relative_to(self.folder).as_posix(), p.stat().st_size, sha256_file(p))
            for p in sorted(self.folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST
        )
        pushed = _attempt(lambda: store.push_part(self.folder, name, [e.path for e in own]))
        parts = leaders.gather((pushed, own))
        manifest = Manifest(
            name, self.step, tuple(sorted((e for _, es in parts for e in es), key=lambda e: e.path)), self.meta
        )
        committed = None
        if leaders.is_main:
            errors = [f"node leader {leaders.ranks[i]}: {err}" for i, (err, _) in enumerate(parts) if err]
            committed = "; ".join(errors) if errors else _attempt(lambda: store.commit(manifest))
        if (committed := leaders.from_main(committed)) is not None:
            self._failed("push", str(committed))
            return None
        return own, manifest

    def _seal(self, store: Store, manifest: Manifest, mine: Any) -> bool:
        """Step 5: rank 0 joins every leader's read-back, checks coverage, seals or says why not; whether verified."""
        from runtime.checkpoint.dcp import coverage_failures
        from runtime.store.seal import make_seal

        leaders, name = self.leaders, self.name
        found = leaders.gather((mine.failures, mine.read, mine.bytes_read, mine.windows, mine.seconds))
        verified = None
        if leaders.is_main:
            failures = [f for fs, *_ in found for f in fs]
            failures += coverage_failures(self.folder, {f.path for f in manifest.files}, self.meta.get("world_size"))
            read = [w for _, ws, *_ in found for w in ws]
            nbytes = sum(b for _, _, b, _, _ in found)
            if not failures:
                store.mark_verified(name, make_seal(manifest, read, nbytes, store.key))
            events.emit(
                "verify",
                step=self.step,
                name=name,
                windows=sum(n for *_, n, _ in found),
                bytes_read=nbytes,
                ok=not failures,
                seconds=round(max(s for *_, s in found), 4),
                failures=failures[:5],
                nodes=len(leaders.ranks),
            )
            verified = not failures
        return bool(leaders.from_main(verified))

    def _delete_local(self, store: Store, own: tuple[FileEntry, ...], keep: int) -> None:
        """Step 6, once verified: delete this node's local copy; rank 0 prunes."""
        from runtime.checkpoint.cycle import prune

        shutil.rmtree(self.folder)
        events.emit(
            "delete_local",
            step=self.step,
            name=self.name,
            bytes_freed=sum(e.size for e in own),
            free_bytes=shutil.disk_usage(self.folder.parent).free,
        )
        if self.leaders.is_main:
            deleted, kept = prune(store, self.name, keep)
            events.emit("prune", step=self.step, anchor=self.name, deleted=deleted, kept=kept)

    def _failed(self, stage: str, error: str) -> None:
        if self.leaders.is_main:
            events.emit("push_failed", step=self.step, name=self.name, error=f"{stage}: {error}")
        return None


def _attempt(fn: Any) -> str | None:
    """None when `fn()` went through, else what went wrong (every leader must still take its turn)."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - told to every leader, then reported as an event
        return f"{type(err).__name__}: {err}"
    return None


def node_leaders(world: Any) -> Leaders:
    """Every rank calls this at once (a collective, and the group's creation): the leaders' group."""
    import torch.distributed as tdist

    local = world.gather(world.local_rank)
    ranks = [r for r, lr in enumerate(local) if lr == 0]
    group = tdist.new_group(ranks=ranks, backend="gloo")
    return Leaders(group, ranks, ranks.index(world.rank) if world.rank in ranks else -1)

"""The storage cycle, per push: upload -> verify -> delete local -> free space -> prune.

Policy only: which checkpoint counts, what may be deleted. The store adapters
speak the wire; this never touches HTTP, and they never decide what to prune.
Only verified checkpoints count for resume; prune never deletes the newest
verified checkpoint or anything newer, and refuses outright when asked to prune
relative to one that is not verified.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import events
from runtime.store.base import CheckpointInfo, Manifest, Store, StoreError
from runtime.verify import DEFAULT_BUDGET_BYTES, verify_checkpoint


class PruneRefused(StoreError):
    """Prune was asked to act relative to a checkpoint that is not verified."""


def newest_verified(store: Store) -> CheckpointInfo | None:
    """The checkpoint a resume may use: the newest verified one."""
    verified = [c for c in store.list() if c.verified]
    return verified[-1] if verified else None


def prune(store: Store, anchor: str, keep: int) -> tuple[list[str], list[str]]:
    """Delete old checkpoints, keeping `keep` verified ones up to `anchor` and all newer.

    Returns (deleted, kept). Refuses if `anchor` is not a verified checkpoint.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    listing = store.list()
    by_name = {c.name: c for c in listing}
    anchor_info = by_name.get(anchor)
    if anchor_info is None or not anchor_info.verified:
        raise PruneRefused(f"refusing to prune relative to {anchor}: it is not a verified checkpoint")
    older_verified = [c for c in listing if c.verified and c.step <= anchor_info.step]
    protected = {c.name for c in older_verified[-keep:]} | {c.name for c in listing if c.step >= anchor_info.step}
    deleted = []
    for info in listing:
        if info.name not in protected and info.step < anchor_info.step:
            store.delete(info.name)
            deleted.append(info.name)
    return deleted, [c.name for c in listing if c.name not in deleted]


def _clear_unverified(store: Store, name: str) -> None:
    """An earlier leg may have pushed this step and died before verifying it: that
    copy never counted, so it is replaced. A verified one is never overwritten."""
    for info in store.list():
        if info.name == name:
            if info.verified:
                raise StoreError(f"{name} is already verified in {store.uri}; refusing to overwrite it")
            store.delete(name)


@dataclass
class CycleResult:
    manifest: Manifest
    verified: bool
    push_seconds: float
    verify_seconds: float


def run_cycle(store: Store, local_dir: Path, manifest: Manifest, *, keep: int = 2,
              verify_budget: int = DEFAULT_BUDGET_BYTES, extra: dict[str, Any] | None = None) -> CycleResult:
    """One push through the whole cycle, emitting push/verify/delete_local/prune events."""
    extra = extra or {}
    began = time.perf_counter()
    _clear_unverified(store, manifest.name)
    store.push(local_dir, manifest)
    push_s = time.perf_counter() - began
    events.emit("push", step=manifest.step, name=manifest.name, bytes=manifest.total_bytes,
                seconds=round(push_s, 4), **extra)

    result = verify_checkpoint(store, manifest, local_dir, budget_bytes=verify_budget)
    events.emit("verify", step=manifest.step, name=manifest.name, windows=result.windows,
                bytes_read=result.bytes_read, ok=result.ok, seconds=round(result.seconds, 4),
                failures=result.failures[:5])
    if not result.ok:
        # Keep the local copy: it is the only good one. The stored one never counts.
        return CycleResult(manifest, False, push_s, result.seconds)
    store.mark_verified(manifest.name, {"windows": result.windows, "bytes_read": result.bytes_read,
                                        "verified_at": time.time()})

    freed = manifest.total_bytes
    shutil.rmtree(local_dir)
    free = shutil.disk_usage(local_dir.parent).free
    events.emit("delete_local", step=manifest.step, name=manifest.name, bytes_freed=freed, free_bytes=free)

    deleted, kept = prune(store, manifest.name, keep)
    events.emit("prune", step=manifest.step, anchor=manifest.name, deleted=deleted, kept=kept)
    return CycleResult(manifest, True, push_s, result.seconds)

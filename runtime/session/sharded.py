"""The session's sharded path (runtime.checkpoint.dcp): save at a step, check and load at a resume.

Save, at the step boundary, on the critical path (every rank): the leg's disk gets a hidden
`.step-<N>.partial` folder; every rank writes its shards through DCP and its own state; once
every rank is done, rank 0 digests the state, writes the manifest over every rank's files, gives
the folder its real name and hands it to the pusher (push -> verify -> delete -> prune, as for
one file; the verify also holds the manifest to cover every shard `.metadata` names, and every
rank's own file). On several nodes each node's shards sit on its own disk: every node's local
rank 0 pushes them, and rank 0 seals the whole (runtime.checkpoint.node_cycle).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from runtime import events
from runtime.checkpoint import dcp as sharded
from runtime.checkpoint.cycle import Pusher
from runtime.checkpoint.disk import partial_name, write_manifest
from runtime.checkpoint.node_cycle import Leaders
from runtime.checkpoint.restore import load_tracked
from runtime.session.rules import ResumeRefused
from runtime.session.saver import AtStep
from runtime.session.step_evidence import StepEvidence
from runtime.session.world import World
from runtime.store.base import MANIFEST, CheckpointDamaged, checkpoint_name


def several_nodes(world_size: int) -> bool:
    """Ranks on more than one node (torchrun's LOCAL_WORLD_SIZE short of the world's): each
    node's shards are then pushed from that node (runtime.checkpoint.node_cycle)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))) != world_size


def check(folder: Path, seal: dict[str, Any] | None) -> None:
    """Rank 0's check of a fetched sharded checkpoint, before any rank loads it: every verified
    window re-read, `.metadata` readable without running code and naming only listed files."""
    from runtime.store.seal import check_windows

    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("meta", {}).get("format") != sharded.FORMAT:
        raise CheckpointDamaged(
            f"{folder.name} is not a sharded (DCP) checkpoint, and this session saves sharded state"
        )
    if seal is not None:
        check_windows(folder, seal)
    sharded.read_metadata(folder, {f["path"] for f in manifest["files"]})
    return None


def checkpoint(
    at: AtStep, world: World, work: Path, pusher: Pusher | None, leaders: Leaders | None, began: float
) -> None:
    """Every rank: write the sharded checkpoint of `at`; rank 0 queues it for the storage cycle."""
    step = at.step
    root = work / "ckpt"
    partial = root / partial_name(step)
    if world.local_rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step-*.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir()
    world.barrier(f"local rank 0 making {partial.name}")
    _, _, _, rest = sharded.split_tracked(at.tracked)
    own = {name: obj.state_dict() for name, obj in rest.items()}
    own.update(rng=at.rngs[world.rank], step=step, tokens=at.tokens, extra=at.extra)
    sharded.save(partial, at.tracked, own, world.rank)
    digests = sharded.digests(at.tracked)  # a collective: the full tensors
    world.barrier(f"every rank writing its shards of step {step}")
    meta = {**at.meta, "format": sharded.FORMAT, "world_size": world.world_size}
    if world.is_main:
        from runtime.session.step_evidence import state_digests

        whole = {**own, "rng": at.rngs}
        events.emit("state_digest", step=step, digests={**digests, **state_digests(whole, list(whole))})
    manifest = write_manifest(partial, step, meta) if leaders is None and world.is_main else None
    folder = root / checkpoint_name(step)
    if world.local_rank == 0:
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(partial, folder)
    if pusher is None:
        return
    if leaders is not None:  # several nodes: every node's leader pushes its part (runtime.checkpoint.node_cycle)
        from runtime.checkpoint.node_cycle import NodeCheckpoint

        group = leaders
        blocked = pusher.submit_job(step, lambda: NodeCheckpoint(folder, step, meta, group))
    elif manifest is not None:  # one node: rank 0, the one that pushes
        blocked = pusher.submit(folder, manifest)
    else:
        return
    if world.is_main:
        events.emit(
            "save",
            step=step,
            bytes=sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
            seconds=round(time.perf_counter() - began, 4),
            blocked_s=round(blocked, 4),
            params=at.meta.get("params", 0),
            async_save=False,
            sharded=sharded.FORMAT,
        )


def load(
    world: World, tracked: dict[str, Any], extra: dict[str, Any], evidence: StepEvidence, name: str, restore: Path
) -> dict[str, Any]:
    """Every rank: the checkpoint `name` (fetched into `restore` on each node), loaded through
    DCP into `tracked` and `extra`; the resume event's facts. Refuses (`world_size_changed`)
    another number of ranks."""
    folder = restore / name
    manifest = json.loads((folder / MANIFEST).read_text())
    saved = manifest.get("meta", {}).get("world_size")
    if saved != world.world_size:
        raise ResumeRefused(
            "world_size_changed",
            f"{name} was saved by {saved} ranks; this leg has {world.world_size}: resharding is not supported",
        )
    own = sharded.load(folder, tracked, {f["path"] for f in manifest["files"]}, world.rank)
    # DCP's set_state_dict makes an empty optimizer's state with one step (zero grads, lr 0): not
    # a training step; counted, it hid an optimizer re-created after the resume (1 step in 7).
    evidence.opt_steps = 0
    _, _, _, rest = sharded.split_tracked(tracked)
    facts = load_tracked(rest, own, name, extra, digests=world.is_main)  # what each rank keeps its own
    digests = sharded.digests(tracked)  # a collective: the model and optimizers, whole
    if world.is_main:
        facts["digests"] = {**digests, **facts["digests"]}
    return {"own": own, "facts": {"sharded": sharded.FORMAT, "world_size_saved": saved, **facts}}

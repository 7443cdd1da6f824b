"""The session's resume (runtime.session.Session.resume): open the store and print `start`;
rank 0 restores the newest verified checkpoint that fetches, checks and loads (runtime.checkpoint.restore),
every rank learns which, gets its pusher and health line, and loads that checkpoint's state (the
tracked objects, its RNG stream, the step and the tokens) before the `resume` event.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch

from runtime import contract, events
from runtime.checkpoint.cycle import Pusher
from runtime.checkpoint.dcp import is_sharded
from runtime.checkpoint.disk import load_local
from runtime.checkpoint.node_cycle import node_leaders
from runtime.checkpoint.restore import load_tracked, restore_newest
from runtime.contract import EXIT_REFUSED
from runtime.measure.health import Health
from runtime.session import sharded as sharded_session
from runtime.session.rng import set_rng_state
from runtime.session.rules import ResumeRefused
from runtime.session.workers import quiet_sigchld
from runtime.store import StoreError, open_store


def resume(sess: Any, start_facts: dict[str, Any]) -> int:
    """Print `start`, restore from the newest verified checkpoint; the step to continue from."""
    sess.store = open_store(os.environ.get(contract.STORE, (sess.work / "store").as_uri()), f"runs/{sess.run_id}")
    events.emit(
        "start",
        run_id=sess.run_id,
        leg=sess.leg,
        rung=sess.rung,
        device=sess.device,
        torch=torch.__version__,
        world_size=sess.world.world_size,
        params=sess.params,
        max_steps=sess.max_steps,
        total_steps=sess.total_steps,
        store=sess.store.uri,
        tracked=sess.evidence.kinds,
        deterministic=sess.evidence.determinism.settings,
        **start_facts,
    )
    world, restore = sess.world, sess.work / "restore"
    if sess.sharded is None:
        sess.sharded = any(is_sharded(o) for o in sess.tracked.values())
    several = sess.sharded and sharded_session.several_nodes(world.world_size)
    sess.leaders = (
        node_leaders(world) if several else None
    )  # each node pushes its shards (runtime.checkpoint.node_cycle)
    choice, state = None, None
    if world.is_main:
        try:
            restored = restore_newest(
                sess.store,
                restore,
                map_location=sess.device,
                keep_files=True,
                check=sharded_session.check if sess.sharded else None,
            )
            state = restored.state
            choice = ("ok", restored.info.name if restored.info else None, restored.skipped)
        except StoreError as err:  # an auth error must not read as "nothing here"
            choice = ("error", f"{type(err).__name__}: {err}", [])
    status, name, skipped = world.broadcast(choice)
    if status == "error":
        events.emit("stop", reason="store_error", step=0, error=name)
        sess._exit(EXIT_REFUSED)
    signal.signal(signal.SIGTERM, lambda *_: (sess._sigterm.append(True), quiet_sigchld()))
    sess.pusher = (
        Pusher(sess.store, keep=sess.keep, verify_budget=sess.verify_bytes, replace=frozenset(skipped))
        if world.is_main or (sess.leaders is not None and world.local_rank == 0)
        else None
    )
    sess.health = Health(sess.work, sess.device, sess.health_every) if world.local_rank == 0 else None
    if name is not None:
        load(sess, name, state, restore)
    sess.deadline = contract.resumed_deadline(sess.deadline, dict(os.environ), time.time())
    sess.resumed_at = sess.pushed_at = sess.step_count
    sess._resume_tokens = sess.tokens
    sess._history: list[tuple[int, float, float]] = []
    sess._mem_max: float | None = None
    sess._ckpt_s = sess._last_step_s = 0.0
    return sess.step_count


def load(sess: Any, name: str, state: dict[str, Any] | None, restore: Path) -> None:
    """Every rank: load checkpoint `name` (fetched once per node; `state`: what rank 0 read, if any), print `resume`."""
    world = sess.world
    if world.local_rank == 0 and not world.is_main:
        sess.store.fetch(name, restore)  # once per node: the node's disk is shared by its ranks
    world.barrier(f"local rank 0 fetching {name} from the store")
    try:
        if sess.sharded:  # every rank loads its part (runtime.session.sharded)
            loaded = sharded_session.load(sess, name, restore)
            state, facts = {**loaded["own"], "rng": {world.rank: loaded["own"]["rng"]}}, loaded["facts"]
        elif state is None:
            state, _ = load_local(restore / name, map_location=sess.device, fetched=True)
        world.barrier(f"every rank loading {name}")
        if world.local_rank == 0:
            shutil.rmtree(restore)
        if not sess.sharded:
            facts = load_tracked(sess.tracked, state, name, sess.extra, digests=world.is_main)
    except ResumeRefused as err:
        events.emit("stop", reason=err.reason, step=int((state or {}).get("step", 0)), error=str(err))
        sess._exit(EXIT_REFUSED)
    set_rng_state(state["rng"][world.rank])
    sess.step_count, sess.tokens = int(state["step"]), int(state.get("tokens", 0))
    if world.is_main and not sess.sharded:  # what the first training forward trains from (launcher's read)
        sess.evidence.trains_from(sess.tracked, sess.step_count)
    if sess.lr_schedule is not None:
        facts["lr_expected"] = float(sess.lr_schedule(sess.step_count))
    fields: dict[str, Any] = {"from_step": sess.step_count, "checkpoint": name, "tokens_consumed": sess.tokens}
    if (lr := sess.current_lr()) is not None:
        fields["lr"] = lr
    events.emit("resume", **{**fields, **facts})

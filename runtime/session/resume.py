"""The session's resume (runtime.session.Session.resume), in two collective steps over the
session's inputs: `choose`, where rank 0 restores the newest verified checkpoint that fetches,
checks and loads (runtime.checkpoint.restore) and every rank learns which; and `load`, where every
rank loads that checkpoint's state (the tracked objects, its RNG stream, the step and the
tokens) before the `resume` event. What a leg starts from is `Resumed`, a frozen value; a
store or a state that refuses us ends the leg (`LegEnd`, exit 3).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from runtime import events
from runtime.checkpoint.disk import load_local
from runtime.checkpoint.restore import as_loaded, load_tracked, restore_newest
from runtime.contract import EXIT_REFUSED
from runtime.session import sharded as sharded_session
from runtime.session.rng import set_rng_state
from runtime.session.rules import LegEnd, ResumeRefused
from runtime.session.step_evidence import StepEvidence, state_digest
from runtime.session.world import World
from runtime.store import Store, StoreError


@dataclass(frozen=True)
class Resumed:
    """Where a leg starts: the step and tokens loaded (0: fresh), the checkpoint they came from
    (None: nothing verified to resume), the damaged names a later push of the same step may
    replace, and whether the state is sharded."""

    step: int = 0
    tokens: int = 0
    checkpoint: str | None = None
    skipped: frozenset[str] = frozenset()
    sharded: bool = False
    unloaded: dict[str, str] = field(default_factory=dict)
    """name -> digest of the state the checkpoint holds for a name nothing tracked at the
    resume (rank 0, whole state): saved, never loaded, unless the trainer loads it itself."""


@dataclass(frozen=True)
class Choice:
    """The checkpoint every rank loads (None: start fresh), `state` as rank 0 read it (None
    elsewhere, and for sharded state), and the damaged names skipped on the way."""

    name: str | None
    state: dict[str, Any] | None
    skipped: frozenset[str]


@dataclass(frozen=True)
class Parts:
    """What a resume loads into: the tracked objects, the `extra` values, the step evidence
    (told what the first training forward trains from) and the LR schedule."""

    tracked: dict[str, Any]
    extra: dict[str, Any]
    evidence: StepEvidence
    lr_schedule: Callable[[int], float] | None


def tracked_lr(tracked: dict[str, Any]) -> float | None:
    """The LR of the first tracked optimizer (None: none tracked)."""
    opt = next((o for o in tracked.values() if isinstance(o, torch.optim.Optimizer)), None)
    return float(opt.param_groups[0]["lr"]) if opt is not None else None


def choose(world: World, store: Store, restore: Path, device: str, sharded: bool) -> Choice:
    """Every rank: the checkpoint rank 0 found (fetched, checked, and unless sharded loaded on
    `device`) in `store`. A store error on rank 0 ends every rank's leg (`store_error`)."""
    choice: tuple[str, str | None, list[str]] | None = None
    state = None
    if world.is_main:
        try:
            check = sharded_session.check if sharded else None
            restored = restore_newest(store, restore, map_location=device, keep_files=True, check=check)
            state = restored.state
            choice = ("ok", restored.info.name if restored.info else None, restored.skipped)
        except StoreError as err:  # an auth error must not read as "nothing here"
            choice = ("error", f"{type(err).__name__}: {err}", [])
    status, name, skipped = world.broadcast(choice)
    if status == "error":
        events.emit("stop", reason="store_error", step=0, error=name)
        raise LegEnd(EXIT_REFUSED, "store_error")
    return Choice(name, state, frozenset(skipped))


def load(
    world: World, store: Store, choice: Choice, restore: Path, device: str, parts: Parts, sharded: bool
) -> Resumed:
    """Every rank: load the chosen checkpoint (fetched once per node) into `parts` and this
    rank's RNG streams, print `resume`; where the leg starts. A state that does not describe
    this run (ResumeRefused) ends the leg, exit 3, with its reason."""
    name, state = choice.name, choice.state
    if name is None:
        return Resumed(skipped=choice.skipped, sharded=sharded)
    if world.local_rank == 0 and not world.is_main:
        store.fetch(name, restore)  # once per node: the node's disk is shared by its ranks
    world.barrier(f"local rank 0 fetching {name} from the store")
    try:
        if sharded:  # every rank loads its part (runtime.session.sharded)
            loaded = sharded_session.load(world, parts.tracked, parts.extra, parts.evidence, name, restore)
            state, facts = {**loaded["own"], "rng": {world.rank: loaded["own"]["rng"]}}, loaded["facts"]
        elif state is None:
            state, _ = load_local(restore / name, map_location=device, fetched=True)
        world.barrier(f"every rank loading {name}")
        if world.local_rank == 0:
            shutil.rmtree(restore)
        if not sharded:
            facts = load_tracked(parts.tracked, state, name, parts.extra, digests=world.is_main)
        unloaded = _unloaded(state, parts.tracked) if world.is_main and not sharded else {}
    except ResumeRefused as err:
        events.emit("stop", reason=err.reason, step=int((state or {}).get("step", 0)), error=str(err))
        raise LegEnd(EXIT_REFUSED, err.reason) from err
    set_rng_state(state["rng"][world.rank])
    step, tokens = int(state["step"]), int(state.get("tokens", 0))
    if world.is_main and not sharded:  # what the first training forward trains from (launcher's read)
        parts.evidence.trains_from(parts.tracked, step)
    if parts.lr_schedule is not None:
        facts["lr_expected"] = float(parts.lr_schedule(step))
    fields: dict[str, Any] = {"from_step": step, "checkpoint": name, "tokens_consumed": tokens}
    if (lr := tracked_lr(parts.tracked)) is not None:
        fields["lr"] = lr
    if unloaded:
        fields["not_loaded"] = sorted(unloaded)
    events.emit("resume", **{**fields, **facts})
    return Resumed(step, tokens, name, choice.skipped, sharded, unloaded)


SESSION_KEYS = frozenset({"rng", "step", "tokens", "extra"})


def _unloaded(state: dict[str, Any], tracked: dict[str, Any]) -> dict[str, str]:
    """The checkpoint's objects that nothing tracked at the resume: name -> digest as saved."""
    return {k: state_digest(v) for k, v in state.items() if k not in tracked and k not in SESSION_KEYS}


def tracked_late(resumed: Resumed, name: str, obj: Any, kind: str, step: int) -> None:
    """`track(name=...)` after the resume, of a name the checkpoint holds: its saved state was
    never loaded (an optimizer re-created after `resume()` and tracked then starts with fresh
    moments). Said in a `tracked_late` event, saved digest beside live, for the launcher's
    restore check (launcher.checks.resume.check_saved_not_loaded); the object is left as it is."""
    saved = resumed.unloaded.get(name)
    if saved is None:
        return
    live = state_digest(as_loaded(obj))
    events.emit("tracked_late", name=name, kind=kind, step=step, checkpoint=resumed.checkpoint, saved=saved, live=live)

"""What the Lightning adapter (runtime.adapters.lightning) reads and writes of a Lightning
checkpoint: the check of a fetched one, the RNG streams it keeps (one set per rank), the step a
checkpoint is named by (micro-batches, where the optimizer steps every K), and the loops state
that tells the two saves of an epoch's last step apart; and the hook that makes the training
loaders resumable where Lightning builds them."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from runtime import events
from runtime.adapters.common import check_windows
from runtime.adapters.lightning_data import NotResumable, Seed, resumable
from runtime.contract import EXIT_REFUSED
from runtime.session.rules import LegEnd
from runtime.session.step_evidence import state_digests
from runtime.session.workers import shield_workers
from runtime.store.base import CheckpointDamaged

CKPT_FILE = "lightning.ckpt"
TRACKED = {"model": "model", "optimizer": "optimizer", "scheduler": "scheduler", "data": "data"}
MICRO = "micro_step"
"""The callback state's key of the step a checkpoint is named by: batches trained across legs (the
launcher's step). Lightning's `global_step` counts optimizer steps: with accumulate_grad_batches K
it is the step / K."""


def own_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The adapter's callback state in a checkpoint (the one that holds MICRO), else {}."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and MICRO in state:
            return state
    return {}


def named_step(checkpoint: dict[str, Any]) -> int:
    """The step a checkpoint is saved and named at: its MICRO, else Lightning's global_step (a
    checkpoint of an adapter that did not count micro-batches: one optimizer step a batch)."""
    return int(own_state(checkpoint).get(MICRO, checkpoint.get("global_step", 0)))


def _check(folder: Path, seal: dict[str, Any] | None) -> None:
    """A fetched checkpoint Lightning could load: its bytes as sealed, one file that loads with
    weights_only=True and says the step its name says."""
    check_windows(folder, seal)
    try:
        ckpt = torch.load(folder / CKPT_FILE, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any load failure is damage: the next older one is tried
        raise CheckpointDamaged(f"{CKPT_FILE} does not load with weights_only=True: {type(err).__name__}: {err}")
    named = re.search(r"(\d+)$", folder.name)  # checkpoint_name(step): the step, last
    step = int(named.group(1)) if named else None
    said = named_step(ckpt) if isinstance(ckpt, dict) and "global_step" in ckpt else None
    if said != step:
        raise CheckpointDamaged(f"{CKPT_FILE} says global_step {said}")


def rng_state() -> dict[str, Any]:
    """The global RNG streams, in types torch.load(weights_only=True) reads back."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": [version, list(words), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def rank_rng(saved: Any, rank: int, world_size: int) -> Any:
    """This rank's RNG streams from the callback state's `rng`: a list, one per rank (each rank
    saved its own: rank 0's restored on every rank resumed rank 1 on rank 0's stream, its loss off
    from the first resumed step), or one dict (a checkpoint of one process). A list of another
    length is a checkpoint of another world size: refused, exit 3, one line."""
    if not isinstance(saved, list):
        return saved
    if len(saved) != world_size:
        error = (
            f"the checkpoint holds the RNG of {len(saved)} ranks, this leg has {world_size}: resume it on {len(saved)}"
        )
        events.emit("stop", reason="shape_changed", step=0, error=error)
        raise LegEnd(EXIT_REFUSED, "shape_changed")
    return saved[rank]


def digests_of(model: Any, optimizers: Any, schedulers: Any, loader: Any, rng: Any) -> dict[str, str]:
    return state_digests(
        {"model": model, "optimizer": optimizers, "scheduler": schedulers, "data": loader, "rng": [rng]}, list(TRACKED)
    )


def last_batch_as_mid_epoch(checkpoint: dict[str, Any]) -> bool:
    """A checkpoint saved in `on_train_batch_end` of an epoch's last batch (a stop's save, a
    ModelCheckpoint every n steps landing there), told from ModelCheckpoint's epoch-end save of
    the same step by its loops state: the last batch processed but not completed, the epoch
    started but not processed. Lightning 2.6.6 counts that epoch as done on load (`FitLoop.reset`:
    `is_last_batch`) and then runs the next epoch on the loader state that yielded all of the
    last one: it yields nothing, and the epoch after is trained (an epoch skipped, exit 0;
    Lightning #18060, #19815). With `is_last_batch` cleared here, before the loops are restored,
    Lightning resumes it as any mid-epoch save: the rest of the epoch (nothing), its end, then
    the next epoch from its start. Returns whether it changed the checkpoint."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    batches, epochs = loops.get("epoch_loop.batch_progress"), loops.get("epoch_progress")
    if not isinstance(batches, dict) or not isinstance(epochs, dict) or not batches.get("is_last_batch"):
        return False
    b, e = batches.get("total", {}), epochs.get("total", {})
    if b.get("processed") != b.get("completed", 0) + 1 or e.get("processed") != e.get("started", 0) - 1:
        return False
    batches["is_last_batch"] = False
    return True


def before_first_iter(loop: Any, seed: Seed) -> None:
    """The training loaders made resumable (runtime.adapters.lightning_data) where Lightning has
    just built them, before it loads their saved state and makes their iterator; a loader that
    cannot be ends the leg refused (exit 3), the change it needs named.

    Lightning 2.6.6 creates a restarted epoch's iterator (`setup_data`, right after it loads the
    loader's saved state) before it sets the samplers' epoch (`on_advance_start`): a resume in the
    middle of epoch >= 1 replays epoch 0's order from the saved position (Lightning issue #21938,
    open; seen here with a StatefulDataLoader, whose iterator seeks at creation). The epoch goes
    first here: the value Lightning itself would set, just before that iterator. (A private
    method of the pinned 2.6.6; where it is gone, nothing is changed.)"""
    load = getattr(loop, "_load_combined_loader_states", None)
    if load is None or getattr(load, "_preflight", False):
        return

    def load_then_set_epoch() -> None:
        combined = loop._combined_loader
        try:
            combined.flattened = [resumable(dl, seed) for dl in combined.flattened]
        except NotResumable as err:
            events.emit("stop", reason="loader_not_resumable", step=int(loop.trainer.global_step), error=str(err))
            raise LegEnd(EXIT_REFUSED, "loader_not_resumable") from err
        load()
        for loader in combined.flattened:
            _set_sampler_epoch(loader, loop.epoch_progress.current.processed)
            shield_workers(loader)  # its workers leave SIGTERM to the main process (runtime.session.workers)

    load_then_set_epoch._preflight = True  # type: ignore[attr-defined]
    loop._load_combined_loader_states = load_then_set_epoch

"""A Lightning script on the ladder, in three lines:

    from runtime.adapters.lightning import Preflight                     # 1
    trainer = L.Trainer(..., callbacks=[..., pf := Preflight()])         # 2
    trainer.fit(model, loader, ckpt_path=pf.resume())                    # 3 (was "last")

Lightning keeps doing what it does (the model, optimizers, schedulers and loop counters
in its checkpoint; a StatefulDataLoader's position, Lightning >= 2.2); the callback does
the leg contract around it:
- the training loader is made resumable before Lightning makes its first iterator
  (runtime.adapters.lightning_data): a plain `DataLoader(shuffle=True)` becomes a
  StatefulDataLoader over the same dataset whose order is a function of (seed, epoch), the
  seed kept in the callback's state; a user's own StatefulDataLoader is left alone; a loader
  it cannot rebuild (a custom batch_sampler or sampler, an IterableDataset) ends the leg
  refused (exit 3, `loader_not_resumable`), the change to make named (rung 0 first, where the
  source shows it: runtime.programs.static_lightning).
- `resume()` fetches the newest *verified* checkpoint from the store onto this leg's empty
  disk (damaged ones skipped with `resume_skip`; a file that does not load with
  weights_only=True, or names another step, is damaged) and hands `fit` its path, or None
  to start fresh. Never `ckpt_path="last"`: Lightning picks that by modification time on the
  local disk, and on a fresh machine finds nothing and trains from scratch with a warning.
- At `setup` it puts itself in as the trainer's CheckpointIO, so every checkpoint Lightning
  writes (ModelCheckpoint's cadence, its last.ckpt, an exception save) is written by us: to
  a temp file, fsynced, renamed (2.6.6's own save swallows some PermissionErrors, #21800),
  then pushed, verified by reading back, deleted locally and pruned in the background. A
  second save at a step already saved (save_last after the cadence's) is the same state:
  skipped. ModelCheckpoint's own deletes are no-ops: the store keeps the newest `keep`.
- Lightning saves no RNG: the callback's own state holds the torch, numpy and python
  streams, re-applied at the first batch after a resume, so dropout continues exactly.
- every step prints a `step` event with the hash of the inputs the LightningModule's
  training forwards were fed (runtime.session.batches.FedInputs; the batch handed to
  `training_step` where the module's own forward is never called), the loss it returned,
  the first optimizer's LR and its step count; every checkpoint a `save` event with the
  tensor bytes of the model, optimizer and scheduler state it holds (proof 7) and a
  `state_digest` event (model, optimizers, schedulers, loader position, RNG); a resume the
  digests of each object as Lightning restored it (a module hook that drops the
  scheduler's state shows here). A loader is digested by the position it will yield from
  (epoch, batch, seed): Lightning's state at an epoch's end and the next epoch's fresh
  iterator it resumes with are one position in different bytes.
- it stops at LAUNCHER_MAX_STEPS (counted across legs), before LAUNCHER_DEADLINE and on
  SIGTERM: a final checkpoint from `on_train_batch_end` (the stage Lightning resumes
  mid-epoch from), then `trainer.should_stop`; `done` says whether it verified, and a
  final checkpoint that did not verify exits 1. Lightning's own SIGTERM stop (raise after
  the batch, exit 0, no save) is set aside: the callback's stop is the one.
- a loader's worker processes leave SIGTERM to the main process (runtime.session.workers), and the
  sampler's epoch is set before a restarted epoch's iterator exists (Lightning #21938).
Supported, and executed here: the `lightning` package (lightning.pytorch), one CPU device,
a plain DataLoader(shuffle=True), a StatefulDataLoader with workers. Not supported: several devices or nodes (DDP is not
executed here); `pytorch_lightning` imports (another Callback class); AsyncCheckpointIO
(unwrapped: its save returns before the file exists); ModelCheckpoint(save_last="link")
(a symlink made outside the CheckpointIO); gradient accumulation (a step event per batch
would repeat the optimizer step).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.io import CheckpointIO

from runtime import contract, events
from runtime.adapters.common import LegAdapter, check_windows
from runtime.adapters.lightning_data import NotResumable, Seed, live_states, positions, resumable
from runtime.checkpoint.disk import tensor_bytes
from runtime.contract import EXIT_FAILED, EXIT_REFUSED, STOP_CODES
from runtime.session.batches import FedInputs, batch_digest
from runtime.session.rules import LegEnd, local_stop
from runtime.session.step_evidence import state_digests
from runtime.session.workers import quiet_sigchld, shield_workers
from runtime.store.base import CheckpointDamaged, checkpoint_name

CKPT_FILE = "lightning.ckpt"
TRACKED = {"model": "model", "optimizer": "optimizer", "scheduler": "scheduler", "data": "data"}


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
    if not isinstance(ckpt, dict) or ckpt.get("global_step") != step:
        raise CheckpointDamaged(
            f"{CKPT_FILE} says global_step {ckpt.get('global_step') if isinstance(ckpt, dict) else None}"
        )


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


def digests_of(model: Any, optimizers: Any, schedulers: Any, loader: Any, rng: Any) -> dict[str, str]:
    return state_digests(
        {"model": model, "optimizer": optimizers, "scheduler": schedulers, "data": loader, "rng": [rng]}, list(TRACKED)
    )


def _before_first_iter(loop: Any, seed: Seed) -> None:
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


def _mid_epoch_last_batch(checkpoint: dict[str, Any]) -> bool:
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


class _StoreIO(CheckpointIO):
    """Lightning's CheckpointIO, with our save (the storage cycle) in place of its own."""

    def __init__(self, pf: "Preflight", inner: CheckpointIO) -> None:
        self.pf, self.inner = pf, inner

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.pf.save(checkpoint)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Always weights_only: the bytes came from a store (the resume checked they load so)."""
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=True)

    def remove_checkpoint(self, path: Any) -> None:
        """ModelCheckpoint's top-k prune: the store keeps the newest `keep` verified instead."""

    def teardown(self) -> None:
        self.inner.teardown()


class Preflight(Callback, LegAdapter):
    """The leg contract for a Lightning Trainer. See the module docstring."""

    def __init__(self, workdir: str | Path = ".", keep: int = 2, verify_bytes: int = 2 << 20) -> None:
        self.read_leg(workdir, "lightning")
        self.reason = "max_steps"
        self.finished = False
        self._sigterm: list[bool] = []
        self._rng: dict[str, Any] | None = None  # loaded: re-applied at the first batch
        self._batch: str | None = None
        self._seed = Seed()
        """The data order's seed: this process's torch seed (L.seed_everything's), a resume's saved one."""
        self.fed = FedInputs()
        self._opt_steps = 0
        self._trainer: Any = None
        self._last = time.perf_counter()
        # A flag from now on: Lightning installs its own handler only once `fit` has restored the
        # checkpoint, and chains this one.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.open_saver(keep, verify_bytes, pushes=self.rank == 0)

    def _on_sigterm(self, *_: Any) -> None:
        """Lightning's own handler runs first and sets `received_sigterm`, on which its loop raises
        after `on_train_batch_end`: a signal landing after this callback's hook would end the leg
        with no final checkpoint (seen: `done` unverified at step 6). The stop is ours: at the next
        `on_train_batch_end`, a checkpoint, then `should_stop`."""
        self._sigterm.append(True)
        connector = getattr(self._trainer, "_signal_connector", None)
        if connector is not None:
            connector.received_sigterm = False
        quiet_sigchld()  # a loader worker that dies with the group is no error from now on

    # --- before training ---------------------------------------------------------

    def resume(self) -> str | None:
        """The local path of the newest verified checkpoint in the store (None: start fresh)."""
        resumed = self.resume_from(_check)
        if resumed.checkpoint is None:
            return None
        return str(self.restore_dir / resumed.checkpoint / CKPT_FILE)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        inner = trainer.strategy.checkpoint_io
        inner = getattr(inner, "checkpoint_io", None) or inner if type(inner).__name__ == "AsyncCheckpointIO" else inner
        trainer.strategy.checkpoint_io = _StoreIO(self, inner)
        self._trainer = trainer
        _before_first_iter(trainer.fit_loop, self._seed)
        self.fed.watch(pl_module)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        _mid_epoch_last_batch(checkpoint)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state(), "data_seed": self._seed.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = state_dict.get("rng")
        if "data_seed" in state_dict:
            self._seed.value = int(state_dict["data_seed"])

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.deadline = contract.resumed_deadline(
            self.deadline, dict(os.environ), time.time()
        )  # the checkpoint is loaded
        for opt in trainer.optimizers:
            opt.register_step_post_hook(lambda *_: setattr(self, "_opt_steps", self._opt_steps + 1))
        if self.resumed.checkpoint is not None:
            events.emit(
                "resume",
                from_step=self.resumed.step,
                checkpoint=self.resumed.checkpoint,
                digests=digests_of(*self._live_state(trainer, pl_module), self._rng or rng_state()),
            )
        events.emit(
            "start",
            run_id=self.run_id,
            leg=self.leg,
            rung=os.environ.get(contract.RUNG, "none"),
            device=str(pl_module.device),
            params=sum(p.numel() for p in pl_module.parameters()),
            max_steps=self.max_steps,
            total_steps=int(trainer.max_steps),
            world_size=trainer.world_size,
            store=self.store.uri,
            adapter="lightning",
            tracked=TRACKED,
        )
        self._last = time.perf_counter()

    def _live_state(self, trainer: Any, pl_module: Any) -> tuple[Any, Any, Any, Any]:
        """Each object as Lightning holds it now, in the shapes its checkpoint stores them (the
        loaders by the position they will yield from)."""
        loop = trainer.fit_loop
        return (
            pl_module.state_dict(),
            [o.state_dict() for o in trainer.optimizers],
            [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
            positions(loop, live_states(loop), int(trainer.current_epoch), self._seed.value),
        )

    # --- every step --------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._rng is not None:  # the first batch after a resume: the streams as they were saved
            set_rng_state(self._rng)
            self._rng = None
        self._batch = batch_digest(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step, now = int(trainer.global_step), time.perf_counter()
        step_s, self._last = now - self._last, now
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        fed = self.fed.step_fields()  # the inputs the LightningModule's training forwards were fed this step
        if self.rank == 0 and loss is not None:
            lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0
            fields = fed or ({"batch_hash": self._batch, "batch_from": "step"} if self._batch else {})
            events.emit(
                "step",
                step=step,
                loss=float(loss),
                lr=float(lr),
                step_s=round(step_s, 4),
                epoch=int(trainer.current_epoch),
                opt_steps=self._opt_steps,
                **fields,
            )
        limit = min(self.max_steps, trainer.max_steps) if trainer.max_steps > 0 else self.max_steps
        stop = (
            "max_steps"
            if step >= limit
            else STOP_CODES.get(local_stop(self.deadline, self.saver.last_cycle_s, step_s, self._sigterm, step))
        )
        if stop:
            self.reason = stop
            if step > self.saver.pushed_at:
                trainer.save_checkpoint(self.work / "ckpt" / "final.ckpt")  # through _StoreIO
            trainer.should_stop = True

    def save(self, checkpoint: dict[str, Any]) -> None:
        """One checkpoint Lightning asked for: written here (temp, fsync, rename), then the cycle."""
        step = int(checkpoint["global_step"])
        if step <= self.saver.pushed_at or self.saver.pusher is None:
            return  # this step's state is saved already (or this rank pushes nothing)
        self.saver.pushed_at = step
        began = time.perf_counter()
        dest = self.work / "ckpt" / checkpoint_name(step)
        dest.mkdir(parents=True, exist_ok=True)
        tmp = dest / (CKPT_FILE + ".tmp")
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest / CKPT_FILE)
        schedulers = checkpoint.get("lr_schedulers", [])
        sizes = {"model": checkpoint["state_dict"], "optimizer": checkpoint.get("optimizer_states", [])}
        self.push(
            dest, step, "lightning", began, {k: tensor_bytes(v) for k, v in {**sizes, "scheduler": schedulers}.items()}
        )
        loops = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        own = checkpoint.get("callbacks", {}).get(self.state_key) or {}
        loader = positions(
            self._trainer.fit_loop,
            loops.get("combined_loader", []),
            int(checkpoint.get("epoch", 0)),
            int(own.get("data_seed", self._seed.value)),
        )
        events.emit(
            "state_digest",
            step=step,
            digests=digests_of(
                checkpoint["state_dict"], checkpoint.get("optimizer_states", []), schedulers, loader, own.get("rng")
            ),
        )

    # --- the end -------------------------------------------------------------------

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if int(trainer.global_step) > self.saver.pushed_at:  # stopped by max_epochs: the run is over, save it
            trainer.save_checkpoint(self.work / "ckpt" / "final.ckpt")
        self.finish(int(trainer.global_step))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Lightning's own SIGTERM stop, should it still raise (a rank told by broadcast): the end."""
        if type(exception).__name__ == "SIGTERMException":
            self.reason = "sigterm"
            self.finish(int(trainer.global_step))

    def finish(self, step: int) -> None:
        if self.finished:
            return
        self.finished = True
        if not self.end(self.reason, step):
            raise LegEnd(EXIT_FAILED, "final_checkpoint_unverified")

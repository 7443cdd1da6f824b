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
- `resume()` says this fit resumes from the store: at `setup`, once every rank exists
  (Lightning's own launcher starts the other ranks inside `fit`, so nothing collective can run
  before it), rank 0 picks the newest *verified* checkpoint, each node fetches it onto its own
  empty disk (damaged ones skipped with `resume_skip`; a file that does not load with
  weights_only=True, or names another step, is damaged; one saved by another world size,
  accumulation or per-rank batch refused, exit 3) and Lightning is handed its path where it
  loads one (`resume_start`), or none to start fresh. Never `ckpt_path="last"`: Lightning picks
  that by modification time on the local disk, and on a fresh machine finds nothing and trains
  from scratch with a warning.
- At `setup` it puts itself in as the trainer's CheckpointIO, so every checkpoint Lightning
  writes (ModelCheckpoint's cadence, its last.ckpt, an exception save) is written by us: to
  a temp file, fsynced, renamed (2.6.6's own save swallows some PermissionErrors, #21800),
  then pushed, verified by reading back, deleted locally and pruned in the background. A
  second save at a step already saved (save_last after the cadence's) is the same state:
  skipped. ModelCheckpoint's own deletes are no-ops: the store keeps the newest `keep`.
- Lightning saves no RNG: the callback's own state holds every rank's torch, numpy and python
  streams (gathered as the checkpoint is made), each rank's re-applied at its first batch after
  a resume, so dropout continues exactly on every rank.
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
- a step is a batch (a micro-batch: with accumulate_grad_batches K the optimizer steps every
  K, `opt_steps` says when); checkpoints are named by it. It stops at LAUNCHER_MAX_STEPS
  (counted across legs; a leg resumed there trains nothing), before LAUNCHER_DEADLINE and on
  SIGTERM, at the end of an accumulation window only (Lightning saves no accumulated gradients),
  at one step on every rank (the stop code agreed across ranks): a final checkpoint from
  `on_train_batch_end` (the stage Lightning resumes mid-epoch from), then
  `trainer.should_stop`; `done` says whether it verified, and a final checkpoint that did not
  verify exits 1. Lightning's own SIGTERM handler (a collective inside the handler, once per
  signal, and the signal forwarded to its children: two ranks hung to the leg's budget) is
  replaced at `on_train_start`: the callback's stop is the one.
- a loader's worker processes leave SIGTERM to the main process (runtime.session.workers), and the
  sampler's epoch is set before a restarted epoch's iterator exists (Lightning #21938).
Several ranks: Lightning's own launcher (`devices=N, strategy="ddp"`) and torchrun (one node or
several, each node its own disk); every rank prints its `step` events. The loader state Lightning
saves is rank 0's, loaded on every rank: right where the injected DistributedSampler pads every
rank to one count (one batch index on each); a dataset's own state is not kept per rank.
Supported, and executed here: the `lightning` package (lightning.pytorch), CPU devices (gloo),
a plain DataLoader(shuffle=True), a StatefulDataLoader with workers, accumulate_grad_batches.
Not supported: `pytorch_lightning` imports (another Callback class); AsyncCheckpointIO
(unwrapped: its save returns before the file exists); ModelCheckpoint(save_last="link")
(a symlink made outside the CheckpointIO); sharded strategies (FSDP, DeepSpeed: one file is
written by rank 0 here).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.io import CheckpointIO

from runtime import contract, events
from runtime.adapters.common import LegAdapter
from runtime.adapters.lightning_data import Seed, live_states, positions
from runtime.adapters.lightning_state import (
    CKPT_FILE,
    MICRO,
    TRACKED,
    _check,
    before_first_iter,
    digests_of,
    last_batch_as_mid_epoch,
    named_step,
    own_state,
    rank_rng,
    rng_state,
    set_rng_state,
)
from runtime.checkpoint.disk import tensor_bytes
from runtime.contract import EXIT_FAILED, STOP_CODES
from runtime.memory import mode as memory_mode
from runtime.memory.stand_in import standing_aside
from runtime.session.batches import FedInputs, batch_digest
from runtime.session.rules import LegEnd, local_stop
from runtime.session.workers import quiet_sigchld
from runtime.store.base import checkpoint_name

__all__ = ["CKPT_FILE", "Preflight", "_check", "rng_state", "set_rng_state"]


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


def _first_rank_guess() -> None:
    """RANK for the events printed before the process group exists, where Lightning's own
    launcher left it unset on one node (it sets LOCAL_RANK in the processes it starts); `setup`
    sets the real one."""
    if "RANK" not in os.environ and "LOCAL_RANK" in os.environ and os.environ.get("NODE_RANK", "0") == "0":
        os.environ["RANK"] = os.environ["LOCAL_RANK"]


class Preflight(Callback, LegAdapter):
    """The leg contract for a Lightning Trainer. See the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # runtime.memory: it stands aside
        return standing_aside(Callback) if memory_mode() is not None else super().__new__(cls)

    def __init__(self, workdir: str | Path = ".", keep: int = 2, verify_bytes: int = 2 << 20) -> None:
        _first_rank_guess()
        self.read_leg(workdir, "lightning")
        self.keep, self.verify_bytes = keep, verify_bytes
        self.reason = "max_steps"
        self.finished = False
        self._asked = False  # resume() called: the checkpoint is chosen at setup
        self._sigterm: list[bool] = []
        self._rng: dict[str, Any] | None = None  # loaded: re-applied at the first batch
        self._batch: str | None = None
        self._seed = Seed()
        """The data order's seed: this process's torch seed (L.seed_everything's), a resume's saved one."""
        self.fed = FedInputs()
        self._opt_steps = 0
        self._micro = 0  # batches trained across legs: the step
        self._saved_at = 0  # the step of the last checkpoint made, on every rank
        self._stepped_at = 0  # trainer.global_step at the last window end
        self._trainer: Any = None
        self._last = self._window_began = time.perf_counter()
        # A flag from now on; replaced by the same handler at on_train_start, where Lightning's is.
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, *_: Any) -> None:
        """The stop is ours: at the next window end, agreed across ranks, a checkpoint, then
        `should_stop`. Lightning's own stop (raise after the batch, no save) is kept off."""
        self._sigterm.append(True)
        connector = getattr(self._trainer, "_signal_connector", None)
        if connector is not None:
            connector.received_sigterm = False
        quiet_sigchld()  # a loader worker that dies with the group is no error from now on

    # --- before training ---------------------------------------------------------

    def resume(self) -> None:
        """Resume from the store's newest verified checkpoint: chosen at `setup`, where every
        rank exists, and handed to Lightning there. None for `fit`'s ckpt_path."""
        self._asked = True
        return None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Every rank, once Lightning's process group exists and before it loads a checkpoint: the
        world, the pusher on rank 0, the run's shape, the collective resume, our CheckpointIO."""
        self.join_world()
        self.open_saver(self.keep, self.verify_bytes, pushes=self.world.is_main)
        source = getattr(getattr(trainer.fit_loop, "_data_source", None), "instance", None)
        batch = getattr(source, "batch_size", None)
        self.shape = {"world_size": int(trainer.world_size), "accumulation": int(trainer.accumulate_grad_batches)}
        if isinstance(batch, int):
            self.shape["per_rank_batch"] = batch
        inner = trainer.strategy.checkpoint_io
        inner = getattr(inner, "checkpoint_io", None) or inner if type(inner).__name__ == "AsyncCheckpointIO" else inner
        trainer.strategy.checkpoint_io = _StoreIO(self, inner)
        self._trainer = trainer
        before_first_iter(trainer.fit_loop, self._seed)
        self.fed.watch(pl_module)
        if self._asked:
            self._resume(trainer)

    def _resume(self, trainer: Any) -> None:
        """The collective resume; Lightning loads the chosen file where it loads `fit`'s ckpt_path."""
        resumed = self.resume_from(_check)
        self._micro = self._saved_at = resumed.step if resumed.checkpoint is not None else 0
        if resumed.checkpoint is None:
            return
        path = str(self.restore_dir / resumed.checkpoint / CKPT_FILE)
        connector = trainer._checkpoint_connector

        def this_fit_only(checkpoint_path: Any = None, **kw: Any) -> None:
            del connector.resume_start  # a later validate/test loads what it names
            connector.resume_start(path, **kw)

        connector.resume_start = this_fit_only

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        last_batch_as_mid_epoch(checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's RNG streams (a collective: Lightning makes the checkpoint on every rank)."""
        rngs = self.world.gather(rng_state())
        return {"rng": rngs if self.world.distributed else rngs[0], "data_seed": self._seed.value, MICRO: self._micro}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = rank_rng(state_dict.get("rng"), self.world.rank, self.world.world_size)
        if "data_seed" in state_dict:
            self._seed.value = int(state_dict["data_seed"])

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._saved_at = self._micro  # every rank: the guards below decide alike on each

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)  # ours alone (Lightning's runs a collective in it)
        self.deadline = contract.resumed_deadline(
            self.deadline, dict(os.environ), time.time()
        )  # the checkpoint is loaded
        self._stepped_at = int(trainer.global_step)
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
        if self._micro >= self.max_steps:  # resumed at its last step: nothing to train
            trainer.should_stop = True
        self._last = self._window_began = time.perf_counter()

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
        self._micro += 1
        step, now = self._micro, time.perf_counter()
        step_s, self._last = now - self._last, now
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        fed = self.fed.step_fields()  # the inputs the LightningModule's training forwards were fed this step
        if loss is not None:  # every rank: its own fed batches
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
        if trainer.accumulate_grad_batches > 1 and int(trainer.global_step) == self._stepped_at:
            return  # inside an accumulation window: its gradients are in no checkpoint
        self._stepped_at, window_s, self._window_began = int(trainer.global_step), now - self._window_began, now
        # the next chance to stop is a window away: the deadline's margin counts windows, not batches
        code = self.agree_stop(local_stop(self.deadline, self.saver.last_cycle_s, window_s, self._sigterm, step))
        done = step >= self.max_steps or 0 < trainer.max_steps <= trainer.global_step
        stop = "max_steps" if done else STOP_CODES.get(code)
        if stop:
            self.reason = stop
            if step > self._saved_at:
                trainer.save_checkpoint(self.work / "ckpt" / "final.ckpt")  # through _StoreIO
            trainer.should_stop = True

    def save(self, checkpoint: dict[str, Any]) -> None:
        """One checkpoint Lightning asked for (rank 0): written here (temp, fsync, rename), then the cycle."""
        step = named_step(checkpoint)
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
        own = own_state(checkpoint)
        loader = positions(
            self._trainer.fit_loop,
            loops.get("combined_loader", []),
            int(checkpoint.get("epoch", 0)),
            int(own.get("data_seed", self._seed.value)),
        )
        rng = own.get("rng")
        events.emit(
            "state_digest",
            step=step,
            digests=digests_of(
                checkpoint["state_dict"],
                checkpoint.get("optimizer_states", []),
                schedulers,
                loader,
                rng[0] if isinstance(rng, list) else rng,  # rank 0's: the events of rank 0
            ),
        )

    # --- the end -------------------------------------------------------------------

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._micro > self._saved_at:  # stopped by max_epochs: the run is over, save it
            trainer.save_checkpoint(self.work / "ckpt" / "final.ckpt")
        self.finish(self._micro)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Lightning's own SIGTERM stop, should it still raise (a rank told by broadcast): the end."""
        if type(exception).__name__ == "SIGTERMException":
            self.reason = "sigterm"
            self.finish(self._micro)

    def finish(self, step: int) -> None:
        if self.finished:
            return
        self.finished = True
        if not self.end(self.reason, step):
            raise LegEnd(EXIT_FAILED, "final_checkpoint_unverified")

"""A Hugging Face `transformers.Trainer` script on the ladder, in three changed lines:

    from runtime.adapters.hf import Preflight                  # 1
    pf = Preflight()                                            # 2 (reads the leg environment)
    trainer = Trainer(..., callbacks=[pf])
    trainer.train(resume_from_checkpoint=pf.resume())           # 3

The Trainer keeps doing what it does (model, optimizer, scheduler, RNG, its own
batch skipping on resume); the callback does the leg contract around it:
- `resume()` fetches the newest *verified* checkpoint from the store onto this
  leg's empty disk (damaged ones skipped with `resume_skip`) and hands the Trainer
  its folder, or None to start fresh;
- every step prints a `step` event (loss and LR from the Trainer's log, which the
  callback sets to every step) with the hash of the tensors the model was fed
  that step, measured by the session's own forward hooks (runtime.session.batches.
  FedInputs: torch's global module hooks, so nothing of ours is stored in the model a
  script may `torch.save` whole): what was trained on, not what a sampler claims;
- every checkpoint the Trainer saves goes through the storage cycle (push, verify
  by reading back, delete the local copy, prune) in the background, with the tensor
  bytes of the model and optimizer state it holds (proof 7 sizes the checkpoint by them);
- it stops at LAUNCHER_MAX_STEPS (counted across legs), before LAUNCHER_DEADLINE
  and on SIGTERM, asking the Trainer to save first, and ends with `done`; a final
  checkpoint that did not verify exits 1.
The Trainer loads `optimizer.pt`/`rng_state.pth` with its own loader (transformers
5 checks `torch.load` safety itself); the store's bytes are checked against the
manifest and the verified mark before it sees them.

Under torchrun (1 node x N ranks on one disk, or N nodes each with its own disk) every rank
prints its own `step` events; rank 0 chooses the checkpoint and each node fetches it once
(LegAdapter.resume_from); at each save every rank's `rng_state_<rank>.pth` is gathered into the
folder rank 0 pushes, or the push is refused (two nodes: each writes its RNG file on its own disk,
and transformers resumes a rank whose file is missing on another stream, said at info level only);
the stop is agreed across ranks at every step (each rank deciding alone left one rank in the save's
all_gather and the other in the next backward, until the leg's budget); the run's shape (ranks,
accumulation, per-device batch) is saved and a checkpoint of another shape refused (exit 3).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from runtime import contract, events
from runtime.adapters.common import LegAdapter, check_windows, epoch_of_step
from runtime.checkpoint.disk import tensor_bytes
from runtime.contract import EXIT_FAILED, EXIT_OK, STOP_CODES
from runtime.memory import mode as memory_mode
from runtime.memory.stand_in import standing_aside
from runtime.session.batches import FedInputs
from runtime.session.rules import LegEnd, local_stop
from runtime.session.workers import quiet_sigchld, shield_workers
from runtime.store.base import checkpoint_name


class Preflight(TrainerCallback, LegAdapter):
    """The leg contract for a `transformers.Trainer`. See the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # runtime.memory: it stands aside
        return standing_aside(TrainerCallback) if memory_mode() is not None else super().__new__(cls)

    def __init__(self, workdir: str | Path = ".", keep: int = 2, verify_bytes: int = 2 << 20) -> None:
        self.read_leg(workdir, "transformers")
        self.keep, self.verify_bytes = keep, verify_bytes
        self.reason = "max_steps"
        self.exit_code: int | None = None
        self._sigterm: list[bool] = []
        self.fed = FedInputs()
        self._last = time.perf_counter()
        self._step_s = 0.0
        self._opt_steps: int | None = None

    # --- before training ---------------------------------------------------------

    def resume(self) -> str | None:
        """The local folder of the newest verified checkpoint in the store (None: start fresh),
        on every rank. A leg resumed at or past LAUNCHER_MAX_STEPS ends here, exit 0: the Trainer
        checks its stop only after a step, and trained one past the limit (resumed at 6 with 6:
        step 7 trained, saved and pushed)."""
        resumed = self.resume_from(check_windows)
        if resumed.checkpoint is None:
            return None
        events.emit("resume", from_step=resumed.step, checkpoint=resumed.checkpoint)
        if resumed.step >= self.max_steps:
            raise LegEnd(EXIT_OK if self.end("max_steps", resumed.step) else EXIT_FAILED, "max_steps")
        return str(self.restore_dir / resumed.checkpoint)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Every rank, once the Trainer (and its process group) exists: the world, the pusher on
        rank 0, the run's shape, every step logged."""
        args.logging_strategy, args.logging_steps = "steps", 1  # a `step` event needs every step's loss
        args.logging_first_step = True
        self.join_world()
        self.open_saver(self.keep, self.verify_bytes, pushes=self.world.is_main)
        self.shape = {
            "world_size": int(args.world_size),
            "accumulation": int(args.gradient_accumulation_steps),
            "per_rank_batch": int(args.per_device_train_batch_size),
        }
        if self.world.distributed:
            allow_cpu_index()
        return control

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        """The SIGTERM noted (acted on at the step's end); the loader's workers, started after
        this, leave SIGTERM to this process (runtime.session.workers: a worker dead of the leg's
        SIGTERM raised in the next `all_reduce`, exit 1 without `done`, seen on 2 ranks x 2 workers)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        shield_workers(kwargs.get("train_dataloader"))
        optimizer = kwargs.get("optimizer")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper steps the one inside
        hook = getattr(optimizer, "register_step_post_hook", None)
        if hook is not None:  # this rank's optimizer steps in this leg
            self._opt_steps = 0
            hook(lambda *_: setattr(self, "_opt_steps", (self._opt_steps or 0) + 1))
        self.deadline = contract.resumed_deadline(
            self.deadline, dict(os.environ), time.time()
        )  # the checkpoint is loaded
        if model is not None:
            self.fed.watch(model)
        params = sum(p.numel() for p in model.parameters()) if model is not None else 0
        events.emit(
            "start",
            run_id=self.run_id,
            leg=self.leg,
            rung=os.environ.get(contract.RUNG, "none"),
            device=str(args.device),
            params=params,
            max_steps=self.max_steps,
            total_steps=state.max_steps,
            world_size=args.world_size,
            store=self.store.uri,
            adapter="transformers",
        )
        self._last = time.perf_counter()
        return control

    def _on_sigterm(self, *_: Any) -> None:
        self._sigterm.append(True)
        quiet_sigchld()

    # --- every step --------------------------------------------------------------

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        now = time.perf_counter()
        self._step_s, self._last = now - self._last, now
        code = local_stop(self.deadline, self.saver.last_cycle_s, self._step_s, self._sigterm, state.global_step)
        code = self.agree_stop(code)  # every rank, every step: all stop at one step
        stop = "max_steps" if state.global_step >= min(self.max_steps, state.max_steps) else STOP_CODES.get(code)
        if stop:
            self.reason = stop
            control.should_training_stop = True
            control.should_save = state.global_step > self.saver.pushed_at
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        logs = logs or {}
        if "loss" not in logs:  # every rank: its own fed batches (the loss is the ranks' mean)
            return control
        fields = self.fed.step_fields()  # every training forward since the last step event (each micro-batch)
        events.emit(
            "step",
            step=state.global_step,
            loss=float(logs["loss"]),
            lr=float(logs.get("learning_rate", 0.0)),
            step_s=round(self._step_s, 4),
            epoch=epoch_of_step(state.epoch),
            **({"opt_steps": self._opt_steps} if self._opt_steps is not None else {}),
            **fields,
        )
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """The Trainer just wrote checkpoint-<step>: its files, at one step, into the storage cycle."""
        step = state.global_step
        self.saver.pushed_at = step
        began = time.perf_counter()
        src = Path(args.output_dir) / f"checkpoint-{step}"
        missing = self.collect_rank_files(src, "rng_state_{rank}.pth") if self.world.distributed else []
        if self.saver.pusher is None:
            return control
        if missing:  # the Trainer would resume those ranks on another RNG stream, saying so at info level
            names = ", ".join(f"rng_state_{r}.pth" for r in missing)
            events.emit("push_failed", step=step, error=f"not pushed: {src.name} lacks {names} (every rank's RNG)")
            return control
        dest = self.work / "ckpt" / checkpoint_name(step)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, copy_function=os.link)  # hard links: no second copy of the bytes
        sizes = {}
        for kind in ("model", "optimizer", "lr_scheduler"):
            obj = kwargs.get(kind)
            if obj is not None and hasattr(obj, "state_dict"):
                sizes["scheduler" if kind == "lr_scheduler" else kind] = tensor_bytes(obj.state_dict())
        self.push(dest, step, "transformers", began, sizes)
        return control

    # --- the end -------------------------------------------------------------------

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        ok = self.end(self.reason, state.global_step)
        self.exit_code = EXIT_OK if ok else EXIT_FAILED
        if not ok:
            raise LegEnd(EXIT_FAILED, "final_checkpoint_unverified")
        return control


@functools.cache  # once a process: torch keeps every registered location handler
def allow_cpu_index() -> None:
    """Let `torch.load` restore onto "cpu:<N>": under torchrun on CPU, Accelerate makes the
    Trainer's device cpu:<local rank> and transformers passes it as `map_location` for
    optimizer.pt, which torch refuses ("don't know how to restore data location"): every resume of
    two CPU ranks died there (docs/notes-multirank.md). A CPU storage is where cpu:<N> means."""
    import re

    import torch

    cpu_index = re.compile(r"cpu:\d+")

    def restore(obj: Any, location: str) -> Any:
        return obj if cpu_index.fullmatch(location) else None

    torch.serialization.register_package(99, lambda obj: None, restore)

"""A Hugging Face Accelerate custom loop on the ladder, in four added lines:

    from runtime.adapters.accelerate import Preflight                  # 1
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    pf = Preflight(accelerator)                                         # 2 (reads the leg environment)
    args.resume_from = pf.resume() or args.resume_from                  # 3
    ...
        opt.step(); sched.step(); opt.zero_grad(); step += 1
        pf.step(loss)                                                   # 4

The loop keeps doing what it does: `accelerator.prepare` of everything that has state (before
or after `Preflight`), `load_state(dir)` of the folder `resume()` hands it, its own data skip
(`skip_first_batches` *or* a stateful loader, never both), `save_state(...)` on its own cadence.
Around it:
- `resume()` fetches the newest *verified* checkpoint from the store onto this leg's empty
  disk (damaged ones skipped with `resume_skip`) as the folder `save_state` wrote, named
  `step_N`, or None to start fresh;
- every prepared loader resumes exactly (runtime/adapters/accelerate_loaders.py): its order
  drawn from (seed, epoch), its epoch the loop's, its iterators drawing nothing from the global
  RNG, its workers left alive by the stop's SIGTERM. A plain `DataLoader(shuffle=True)` and no
  `set_epoch` are enough;
- every `save_state` the loop calls goes into a fresh folder (save_state overwrites a folder
  in place and leaves stale files; its automatic naming deletes before the new save exists)
  and through the storage cycle (push, verify by reading back, delete the local copy, prune)
  in the background, with the tensor bytes of what it saved by kind (proof 7 sizes by them);
- every `pf.step()` prints a `step` event (loss, the prepared optimizer's LR) with the hash of
  the tensors the prepared model was fed that step, measured by the session's forward hooks: what was
  trained on, not what a sampler claims; and the step count of the prepared optimizers;
- the RNG `load_state` restored is what the loop goes on with (runtime/adapters/accelerate_rng.py):
  a `set_seed` after `load_state` is not undone but named in the `resume` event
  (`rng_set_after_load`); the one draw of a loader the loop did not prepare (its iterator's
  base seed) is put back after a mid-epoch resume: the straight run drew it at the epoch's start;
- it stops at LAUNCHER_MAX_STEPS (counted across legs), before LAUNCHER_DEADLINE and on SIGTERM
  (Accelerate has no handler: this one sets a flag read at the next `pf.step()`), saving through
  the cycle first, and exits 0 after `done`; a final checkpoint that did not verify exits 1.
The loop's own step limit must not come before LAUNCHER_MAX_STEPS: a loop that ends by itself
ends without `stop`/`done`, and the leg reads as one that died. A leg resumed at or past it ends
at `resume()`, before a step.
On several ranks (torchrun, `accelerate launch --multi_gpu`; one node or several, each node its
own disk) every rank prints its own `step` and `state_digest` events; the checkpoint is chosen by
rank 0 and fetched once per node; the stop is agreed (every rank stops at one step); after
`save_state` every rank's `random_states_{rank}.pkl` is gathered into rank 0's folder, and a
folder lacking one is not pushed (Accelerate resumes a rank without its file on another RNG
and says so only in a log line). The run's shape (processes, accumulation steps, per-rank batch)
is in every pushed checkpoint; a leg of another shape is refused at `resume()`, exit 3.
Under gradient accumulation (`Accelerator(gradient_accumulation_steps=K)` and `accumulate`),
`pf.step()` is called once per micro-batch: the step events count micro-batches and `opt_steps`
the optimizer steps really taken. A save inside a window keeps each rank's accumulated gradients
(`accumulated_grads_{rank}.pt`, put back by `load_state`): save_state keeps the window's count
but not the gradients, and a resume there lost them (the next optimizer step took the window's
remaining micro-batches only). Not supported: `register_for_checkpointing` objects from a store
you do not trust (Accelerate loads them with full pickle; the store's verify hash is what vouches
for the bytes). State digests cover schedulers, stateful loaders and the RNG, not the weights and
moments (the loss comparison covers those).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from runtime import contract, events
from runtime.adapters.accelerate_accum import GRADS, load_accumulated, save_accumulated
from runtime.adapters.accelerate_loaders import exact_epochs, loader_digest, seek_epochs
from runtime.adapters.accelerate_rng import AfterLoad, rng_digests
from runtime.adapters.common import LegAdapter, check_windows
from runtime.checkpoint.disk import tensor_bytes
from runtime.contract import EXIT_FAILED, EXIT_OK, STOP_CODES
from runtime.memory import mode as memory_mode
from runtime.memory.stand_in import standing_aside
from runtime.session.batches import FedInputs
from runtime.session.rules import LegEnd, local_stop
from runtime.session.step_evidence import state_digest
from runtime.session.workers import quiet_sigchld
from runtime.store.base import checkpoint_name


class Preflight(LegAdapter):
    """The leg contract around a prepared `accelerate.Accelerator`. See the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # runtime.memory: it stands aside
        return standing_aside(object) if memory_mode() is not None else super().__new__(cls)

    def __init__(self, accelerator: Any, workdir: str | Path = ".", keep: int = 2, verify_bytes: int = 2 << 20) -> None:
        env = os.environ
        self.acc = accelerator
        self.read_leg(workdir, "accelerate")
        self.join_world()  # Accelerator() made the process group: every rank is here
        self._env_deadline = self.deadline
        self.deadline = contract.resumed_deadline(self._env_deadline, dict(env), time.time())
        self.global_step = 0
        self.restored: Path | None = None
        self._resume_event: dict[str, Any] | None = None
        """The `resume` event, printed at the first training forward after the loop loaded the
        folder (with its digests as loaded, and the RNG streams the loop seeded in between)."""
        self._after: AfterLoad | None = None  # from load_state to the first training forward
        self._sigterm: list[bool] = []
        self._opt_steps = 0
        self._any_opt_steps = 0  # every optimizer's steps, prepared or not
        self._step_s, self._last = 0.0, time.perf_counter()
        self._seed = torch.initial_seed()  # `set_seed(n)` before it: n, the loaders' orders are drawn from
        self._hooked: set[int] = set()
        self._opt_ids: set[int] = set()
        self.fed = FedInputs()
        self.open_saver(keep, verify_bytes, pushes=self.world.is_main)
        self._wrap(accelerator)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        params = sum(p.numel() for m in accelerator._models for p in m.parameters())
        events.emit(
            "start",
            run_id=self.run_id,
            leg=self.leg,
            rung=env.get(contract.RUNG, "none"),
            device=str(accelerator.device),
            params=params,
            max_steps=self.max_steps,
            world_size=accelerator.num_processes,
            store=self.store.uri,
            adapter="accelerate",
            tracked=self._tracked(),
        )

    def _tracked(self) -> dict[str, str]:
        """What `prepare` registered, by kind: what save_state saves and load_state restores."""
        names = {}
        for kind, objs in (
            ("model", self.acc._models),
            ("optimizer", self.acc._optimizers),
            ("scheduler", self.acc._schedulers),
            ("data", self.acc._dataloaders),
        ):
            names.update({(kind if i == 0 else f"{kind}_{i}"): kind for i in range(len(objs))})
        # None prepared: still the slot, so that an optimizer stepping outside `prepare` (seen by the
        # global step hook: `opt_steps` 0 while it steps) is named, not left unasked.
        return names if self.acc._optimizers else {**names, "optimizer": "optimizer"}

    def _wrap(self, accelerator: Any) -> None:
        """The loop's own save_state/load_state calls, through this object; its prepare calls too,
        so that what it prepares after `Preflight(accelerator)` is hooked as what it prepared before."""
        self._save_state, self._load_state = accelerator.save_state, accelerator.load_state
        accelerator.save_state, accelerator.load_state = self.save_state, self.load_state
        for name in ("prepare", "prepare_model", "prepare_optimizer", "prepare_data_loader"):
            setattr(accelerator, name, self._then_hook(getattr(accelerator, name)))
        register_optimizer_step_post_hook(self._any_stepped)
        self._hook_prepared()

    def _then_hook(self, prepare: Any) -> Any:
        def prepared(*args: Any, **kwargs: Any) -> Any:
            out = prepare(*args, **kwargs)
            self._hook_prepared()
            return out

        return prepared

    def _hook_prepared(self) -> None:
        """What each prepared object is watched by, once: the fed-input hash for models, the
        step count for optimizers, exact epochs for loaders."""
        acc = self.acc
        for model in acc._models:
            if self._first_time(model):
                self.fed.watch(model)
        self._opt_ids.update(id(getattr(opt, "optimizer", opt)) for opt in acc._optimizers)
        for i, loader in enumerate(acc._dataloaders):
            exact_epochs(loader, i, self._seed, lambda: self.global_step)

    def _first_time(self, obj: Any) -> bool:
        seen = id(obj) in self._hooked
        self._hooked.add(id(obj))
        return not seen

    def _any_stepped(self, optimizer: Any, *_: Any) -> None:
        """Torch's global step hook (nothing stored in the user's optimizers): every optimizer's
        steps, and those of the prepared ones (the torch optimizer inside: the steps really taken)."""
        self._any_opt_steps += 1
        self._opt_steps += id(optimizer) in self._opt_ids

    def _on_sigterm(self, *_: Any) -> None:  # the leg's stop: noted, acted on at the next pf.step()
        self._sigterm.append(True)
        quiet_sigchld()  # a loader worker that dies with the group is no error from now on

    # --- before training ---------------------------------------------------------------

    def resume(self) -> str | None:
        """The local folder (`.../step_N`, as save_state wrote it) of the newest verified checkpoint
        in the store; None: start fresh."""
        self.shape = self._shape()
        resumed = self.resume_from(check_windows)
        if resumed.checkpoint is None:
            return None
        step = self.global_step = resumed.step
        if step >= self.max_steps:  # nothing left to train: no step past the limit
            events.emit("resume", from_step=step, checkpoint=resumed.checkpoint)
            self._finish("max_steps")
        folder = self.restore_dir / f"step_{step}"
        if self.world.local_rank == 0:  # once per node: its ranks share its disk
            shutil.rmtree(folder, ignore_errors=True)
            (self.restore_dir / resumed.checkpoint).rename(folder)
        self.world.barrier(f"the restored folder named {folder.name}")
        self.restored = folder
        self._resume_event = {"from_step": step, "checkpoint": resumed.checkpoint}
        seek_epochs(self.acc._dataloaders, step)  # and the loader the loop makes to skip into it
        return str(folder)

    def _shape(self) -> dict[str, int]:
        """The run's shape as prepared so far: processes, accumulation steps, the first prepared
        loader's batch on each rank (its total over the ranks, split)."""
        acc = self.acc
        shape = {"world_size": int(acc.num_processes), "accumulation": int(acc.gradient_accumulation_steps)}
        total = getattr(acc._dataloaders[0], "total_batch_size", None) if acc._dataloaders else None
        return shape | ({"per_rank_batch": int(total) // shape["world_size"]} if total else {})

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> Any:
        """Accelerator.load_state, then: the accumulated gradients of a save inside a window put
        back, the deadline counted from the resume, and the RNG it restored checked at the first
        training forward (`_first_forward`)."""
        out = self._load_state(input_dir, **kwargs)
        if self._resume_event is not None and input_dir and Path(input_dir).resolve() == self.restored:
            self._resume_event["digests"] = self._digests(loaded=True)
        if input_dir:
            load_accumulated(self.acc, Path(input_dir) / GRADS.format(rank=self.world.rank))
        self.deadline = contract.resumed_deadline(self._env_deadline, dict(os.environ), time.time())
        match = re.search(r"step_(\d+)", Path(str(input_dir or "")).name)
        at = int(match[1]) if match else self.saver.resumed_at
        loaders = self.acc._dataloaders
        per_epoch = len(loaders[0]) if loaders and hasattr(loaders[0], "__len__") else 0
        if self._after is not None:  # a load_state before, no forward since: its window closed
            self._after.close()
        self._after = AfterLoad(mid_epoch=not per_epoch or bool(at % per_epoch))
        self.fed.first = self._first_forward
        self._last = time.perf_counter()
        return out

    def _first_forward(self) -> None:
        """The first training forward after `load_state` (or the step, where no watched model ran):
        the window runtime/adapters/accelerate_rng.py watches closed, the streams the loop seeded in
        it named in the `resume` event, which is printed now."""
        after, self._after, self.fed.first = self._after, None, None
        seeded = after.close() if after is not None else []
        if self._resume_event is not None and seeded:
            self._resume_event["rng_set_after_load"] = seeded
        self._emit_resume()

    # --- every step ----------------------------------------------------------------------

    def _emit_resume(self) -> None:
        if self._resume_event is not None:
            events.emit("resume", **self._resume_event)
            self._resume_event = None

    def _digests(self, loaded: bool = False) -> dict[str, str]:
        """Digests of the small state save_state saves: schedulers, stateful loaders (as saved only:
        a loaded one says its state at the next iter()) and this process's RNG streams. Weights and
        moments are left to the loss comparison (and would cost a pass over them at every save)."""
        out = {name: state_digest(s.state_dict()) for name, s in zip(self._names("scheduler"), self.acc._schedulers)}
        if not loaded:
            out.update(
                {
                    name: loader_digest(dl)
                    for name, dl in zip(self._names("data"), self.acc._dataloaders)
                    if getattr(dl, "use_stateful_dataloader", False)
                }
            )
        out.update({f"rng.{name}": digest for name, digest in rng_digests().items()})
        return out

    def _names(self, kind: str) -> list[str]:
        return [name for name, k in self._tracked().items() if k == kind]

    def step(self, loss: Any = None) -> None:
        """After the optimizer step: the step event; a stop (max steps, deadline, SIGTERM) saves,
        pushes, waits for the cycle and exits."""
        self._first_forward()  # no watched forward since load_state, or no load_state: the resume said
        self.global_step += 1
        now = time.perf_counter()
        self._step_s, self._last = now - self._last, now
        fields: dict[str, Any] = dict(self.fed.step_fields())  # the prepared model's forwards since the last step
        if self.acc._optimizers or self._any_opt_steps:  # 0 while one steps: not the prepared one
            fields["opt_steps"] = self._opt_steps
        value = float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss or 0.0)
        events.emit(  # on every rank: the launcher checks each rank's own
            "step",
            step=self.global_step,
            loss=value,
            lr=self._lr(),
            step_s=round(self._step_s, 4),
            **fields,
            **self._epoch(),
        )
        code = (
            0
            if self.global_step >= self.max_steps
            else local_stop(self.deadline, self.saver.last_cycle_s, self._step_s, self._sigterm, self.global_step)
        )
        code = self.agree_stop(code)  # every rank stops at the same step, for the same reason
        if code or self.global_step >= self.max_steps:
            self._finish(STOP_CODES.get(code, "max_steps"))

    def _lr(self) -> float:
        """The prepared optimizer's LR; with none prepared, the LR of the optimizer the scheduler drives."""
        opts = list(self.acc._optimizers) or [
            getattr(getattr(s, "scheduler", s), "optimizer", None) for s in self.acc._schedulers
        ]
        groups = getattr(opts[0], "param_groups", None) if opts else None
        return float(groups[0]["lr"]) if groups else 0.0

    def _epoch(self) -> dict[str, int]:
        loaders = self.acc._dataloaders
        n = len(loaders[0]) if loaders and hasattr(loaders[0], "__len__") else 0
        return {"epoch": (self.global_step - 1) // n} if n else {}

    # --- saves -------------------------------------------------------------------------------

    def save_state(self, output_dir: str | None = None, **kwargs: Any) -> str:
        """Accelerator.save_state into a fresh folder of this step (the loop's `output_dir` is
        not written), then the storage cycle. The folder's path is returned, as save_state does."""
        step = self.global_step
        dest = self.work / "ckpt" / checkpoint_name(step)
        if step == self.saver.pushed_at and step > 0:  # already saved at this step (or resumed from it)
            return str(dest)
        began = time.perf_counter()
        self.acc.wait_for_everyone()
        if self.acc.is_local_main_process:  # each node's disk
            shutil.rmtree(dest, ignore_errors=True)
        self.acc.wait_for_everyone()
        events.emit("state_digest", step=step, digests=self._digests())
        self._save_state(str(dest), **kwargs)
        patterns = ["random_states_{rank}.pkl"]
        if save_accumulated(self.acc, dest / GRADS.format(rank=self.world.rank)):
            patterns.append(GRADS)
        self.acc.wait_for_everyone()  # every rank's files written before rank 0 pushes the folder
        missing = {p: m for p in patterns if (m := self.collect_rank_files(dest, p))}
        self.saver.pushed_at = step
        self.shape = self._shape()
        if missing:  # a rank would resume on another RNG (or without its gradients): not pushed
            events.emit("push_failed", step=step, error=f"rank files missing from {dest.name}: {missing}")
        elif self.saver.pusher is not None:
            self.push(dest, step, "accelerate", began, self._state_bytes())
        return str(dest)

    def _state_bytes(self) -> dict[str, int]:
        """The tensor bytes of what save_state saved, by kind: proof 7 sizes the checkpoint by them."""
        return {
            kind: sum(tensor_bytes(obj.state_dict()) for obj in objs)
            for kind, objs in (
                ("model", self.acc._models),
                ("optimizer", self.acc._optimizers),
                ("scheduler", self.acc._schedulers),
            )
        }

    # --- the end -----------------------------------------------------------------------------

    def _finish(self, reason: str) -> None:
        step = self.global_step
        if step > self.saver.pushed_at:
            self.save_state()
        raise LegEnd(EXIT_OK if self.end(reason, step) else EXIT_FAILED, reason)

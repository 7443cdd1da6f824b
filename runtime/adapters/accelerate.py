"""A Hugging Face Accelerate custom loop on the ladder, in four added lines:

    from runtime.adapters.accelerate import Preflight                  # 1
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    pf = Preflight(accelerator)                                         # 2 (reads the leg environment)
    args.resume_from = pf.resume() or args.resume_from                  # 3
    ...
        opt.step(); sched.step(); opt.zero_grad(); step += 1
        pf.step(loss)                                                   # 4

The loop keeps doing what it does: `accelerator.prepare` of everything that has state,
`load_state(dir)` of the folder `resume()` hands it, its own data skip (`skip_first_batches`
*or* a stateful loader, never both), `save_state(...)` on its own cadence. Around it:
- `resume()` fetches the newest *verified* checkpoint from the store onto this leg's empty
  disk (damaged ones skipped with `resume_skip`) as the folder `save_state` wrote, named
  `step_N`, or None to start fresh;
- every `save_state` the loop calls goes into a fresh folder (save_state overwrites a folder
  in place and leaves stale files; its automatic naming deletes before the new save exists)
  and through the storage cycle (push, verify by reading back, delete the local copy, prune)
  in the background;
- every `pf.step()` prints a `step` event (loss, the prepared optimizer's LR) with the hash of
  the tensors the prepared model was fed that step, measured by a forward pre-hook: what was
  trained on, not what a sampler claims; and the step count of the prepared optimizer;
- after a mid-epoch resume, the RNG states `load_state` restored are put back at the first
  training forward: building the skipped loader's iterator draws from the global RNG, which
  the straight-through run drew at the epoch's start (dropout would differ otherwise);
- it stops at LAUNCHER_MAX_STEPS (counted across legs), before LAUNCHER_DEADLINE and on SIGTERM
  (Accelerate has no handler: this one sets a flag read at the next `pf.step()`), saving through
  the cycle first, and exits 0 after `done`; a final checkpoint that did not verify exits 1.
The loop's own step limit must not come before LAUNCHER_MAX_STEPS: a loop that ends by itself
ends without `stop`/`done`, and the leg reads as one that died. Not supported: several nodes
(every rank saves into its own disk's folder; only rank 0 pushes), gradient accumulation counted
in micro-batches (`pf.step()` once per optimizer step), and `register_for_checkpointing` objects
from a store you do not trust (Accelerate loads them with full pickle; the store's verify hash is
what vouches for the bytes). State digests cover schedulers, stateful loaders and the RNG, not
the weights and moments (the loss comparison covers those).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from runtime import contract, events
from runtime.adapters.common import LegAdapter, check_windows
from runtime.contract import EXIT_FAILED, EXIT_OK, STOP_CODES
from runtime.session.batches import FedInputs
from runtime.session.rules import LegEnd, local_stop
from runtime.session.step_evidence import state_digest
from runtime.store.base import checkpoint_name


def _rng_states() -> tuple[Any, Any, Any]:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_states(states: tuple[Any, Any, Any]) -> None:
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


class Preflight(LegAdapter):
    """The leg contract around a prepared `accelerate.Accelerator`. See the module docstring."""

    def __init__(self, accelerator: Any, workdir: str | Path = ".", keep: int = 2, verify_bytes: int = 2 << 20) -> None:
        env = os.environ
        self.acc = accelerator
        self.read_leg(workdir, "accelerate")
        self._env_deadline = self.deadline
        self.deadline = contract.resumed_deadline(self._env_deadline, dict(env), time.time())
        self.global_step = 0
        self.restored: Path | None = None
        self._resume_event: dict[str, Any] | None = None
        """The `resume` event, printed once the loop has loaded the folder (with its digests as loaded)."""
        self._sigterm: list[bool] = []
        self._opt_steps = 0
        self._step_s, self._last = 0.0, time.perf_counter()
        self.open_saver(keep, verify_bytes, pushes=accelerator.is_main_process)
        self._wrap(accelerator)
        signal.signal(signal.SIGTERM, lambda *_: self._sigterm.append(True))
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
        """The loop's own save_state/load_state calls, through this object; the hooks on what it prepared."""
        self._save_state, self._load_state = accelerator.save_state, accelerator.load_state
        accelerator.save_state, accelerator.load_state = self.save_state, self.load_state
        self.fed = FedInputs()
        for model in accelerator._models:
            self.fed.watch(model)
        for opt in accelerator._optimizers:  # the torch optimizer inside: counts the steps really taken
            getattr(opt, "optimizer", opt).register_step_post_hook(self._stepped)
        self._any_opt_steps = 0  # every optimizer's steps, prepared or not
        register_optimizer_step_post_hook(self._any_stepped)

    def _stepped(self, *_: Any) -> None:
        self._opt_steps += 1

    def _any_stepped(self, *_: Any) -> None:
        self._any_opt_steps += 1

    # --- before training ---------------------------------------------------------------

    def resume(self) -> str | None:
        """The local folder (`.../step_N`, as save_state wrote it) of the newest verified checkpoint
        in the store; None: start fresh."""
        resumed = self.resume_from(check_windows)
        if resumed.checkpoint is None:
            return None
        step = resumed.step
        folder = self.restore_dir / f"step_{step}"
        shutil.rmtree(folder, ignore_errors=True)
        (self.restore_dir / resumed.checkpoint).rename(folder)
        self.global_step = step
        self.restored = folder
        self._resume_event = {"from_step": step, "checkpoint": resumed.checkpoint}
        return str(folder)

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> Any:
        """Accelerator.load_state, then: the deadline counted from the resume, and after a resume
        mid-epoch the RNG states it restored put back at the first training forward."""
        out = self._load_state(input_dir, **kwargs)
        if self._resume_event is not None and input_dir and Path(input_dir).resolve() == self.restored:
            self._emit_resume(self._digests(loaded=True))
        self.deadline = contract.resumed_deadline(self._env_deadline, dict(os.environ), time.time())
        match = re.search(r"step_(\d+)", Path(str(input_dir or "")).name)
        at = int(match[1]) if match else self.saver.resumed_at
        loaders = self.acc._dataloaders
        per_epoch = len(loaders[0]) if loaders and hasattr(loaders[0], "__len__") else 0
        if not per_epoch or at % per_epoch:  # mid-epoch (or unknown): the loop's new iterator draws first
            states = _rng_states()
            self.fed.first = lambda: _set_rng_states(states)
        self._last = time.perf_counter()
        return out

    # --- every step ----------------------------------------------------------------------

    def _emit_resume(self, digests: dict[str, str] | None = None) -> None:
        if self._resume_event is not None:
            events.emit("resume", **self._resume_event, **({"digests": digests} if digests else {}))
            self._resume_event = None

    def _digests(self, loaded: bool = False) -> dict[str, str]:
        """Digests of the small state save_state saves: schedulers, stateful loaders (as saved only:
        a loaded one says its state at the next iter()) and this process's RNG streams. Weights and
        moments are left to the loss comparison (and would cost a pass over them at every save)."""
        out = {name: state_digest(s.state_dict()) for name, s in zip(self._names("scheduler"), self.acc._schedulers)}
        if not loaded:
            out.update(
                {
                    name: state_digest(dl.state_dict())
                    for name, dl in zip(self._names("data"), self.acc._dataloaders)
                    if getattr(dl, "use_stateful_dataloader", False)
                }
            )
        torch_rng, np_rng, py_rng = _rng_states()
        out.update(
            {
                "rng.torch": state_digest(torch_rng),
                "rng.numpy": state_digest(list(np_rng)),
                "rng.python": state_digest(list(py_rng)),
            }
        )
        return out

    def _names(self, kind: str) -> list[str]:
        return [name for name, k in self._tracked().items() if k == kind]

    def step(self, loss: Any = None) -> None:
        """After the optimizer step: the step event; a stop (max steps, deadline, SIGTERM) saves,
        pushes, waits for the cycle and exits."""
        self._emit_resume()  # the loop never called load_state on it: said without digests
        self.global_step += 1
        now = time.perf_counter()
        self._step_s, self._last = now - self._last, now
        digest = self.fed.take()
        self.fed.fed_tensors()  # not cross-checked here: the loop hands pf.step() no batch
        if self.acc.is_main_process:
            fields: dict[str, Any] = {"batch_hash": digest, "batch_from": "forward"} if digest else {}
            if self.acc._optimizers or self._any_opt_steps:  # 0 while one steps: not the prepared one
                fields["opt_steps"] = self._opt_steps
            value = float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss or 0.0)
            events.emit(
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
        if self.acc.num_processes > 1:  # every rank stops at the same step, for the same reason
            code = int(self.acc.reduce(torch.tensor([code], device=self.acc.device), reduction="max").item())
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
        if self.acc.is_main_process:
            shutil.rmtree(dest, ignore_errors=True)
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            events.emit("state_digest", step=step, digests=self._digests())
        self._save_state(str(dest), **kwargs)
        self.saver.pushed_at = step
        if self.saver.pusher is not None:
            self.push(dest, step, "accelerate", began)
        return str(dest)

    # --- the end -----------------------------------------------------------------------------

    def _finish(self, reason: str) -> None:
        step = self.global_step
        if step > self.saver.pushed_at:
            self.save_state()
        raise LegEnd(EXIT_OK if self.end(reason, step) else EXIT_FAILED, reason)

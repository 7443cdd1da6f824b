"""The leg API: one object a trainer creates, which owns the leg contract.

    from runtime.session import Session

    sess = Session(ckpt_every=10, total_steps=1000)     # reads the leg's environment
    sess.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
    sess.resume()                                       # newest *verified* checkpoint, or step 0
    while sess.running():                               # deadline, SIGTERM, max steps: agreed by every rank
        x, y = next(batches)
        loss = model(x, y); loss.backward(); opt.step(); sched.step()
        sess.step(loss=loss, batch=x, tokens=x.numel())
    sys.exit(sess.finish())                             # final push, verified; `done`

What it does for the trainer (docs/design.md's leg contract):
- refuses stale code: the reviewed files' sha256 (LAUNCHER_FILES_SHA256) must match (exit 3; runtime.session.rules);
- restores everything tracked (anything with `state_dict`/`load_state_dict`), every RNG
  stream per rank, the step and the tokens, from the newest verified checkpoint that fetches,
  checks and loads (damaged ones skipped with `resume_skip`); an FSDP2 model's state goes
  through torch.distributed.checkpoint, every rank its part (runtime.checkpoint.dcp);
- `step()` prints the `step` event with the hash of the inputs the tracked model was fed
  (runtime.session.step_evidence), snapshots the state on the cadence and runs the storage cycle in the
  background (write, push, verify by reading back, delete the local copy, prune);
- counts the first step's FLOPs, times each step's phases without a device sync (runtime.measure.steptime):
  `flops`, `gpu_phases` on `step`, per window `memory` and `rate` with MFU (runtime.measure.window);
- stops on LAUNCHER_DEADLINE (with room for one more push), SIGTERM, LAUNCHER_MAX_STEPS
  (counted across legs) and a non-finite loss (never pushed; exit 1), one decision for
  every rank under torchrun; `finish()` pushes the final checkpoint, waits for it to
  verify and prints `done`.
Loader workers leave SIGTERM to the leg (runtime.session.workers). Cost per step: bench/session_overhead.py.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from runtime import contract, events
from runtime.checkpoint.disk import PendingCheckpoint, SnapshotPool, save_local, snapshot_state, tensor_bytes
from runtime.contract import EXIT_FAILED, EXIT_REFUSED, STOP_CODES
from runtime.measure.steptime import FlopProbe, StepClock
from runtime.measure.window import emit_memory, emit_rate
from runtime.session import resume as session_resume
from runtime.session import sharded as sharded_session
from runtime.session.rng import rng_state
from runtime.session.rules import DEFAULT_MAX_STEPS, local_stop, stale_code_refused
from runtime.session.step_evidence import StepEvidence, state_digests
from runtime.session.workers import shield_workers
from runtime.session.world import RankTimeout, World, init_world

_no_step_hook: Callable[[], None] = lambda: None  # noqa: E731 - an object with no on_step()


def resolve_device(requested: str = "auto") -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


class Session:
    """One leg of a run, from the trainer's side. See the module docstring."""

    def __init__(
        self,
        *,
        ckpt_every: int = 10,
        keep: int = 2,
        workdir: str | Path = ".",
        device: str = "auto",
        total_steps: int | None = None,
        max_steps: int | None = None,
        verify_bytes: int = 2 << 20,
        metrics_every: int = 10,
        health_every: float = 30.0,
        lr_schedule: Callable[[int], float] | None = None,
        world: World | None = None,
        meta: dict[str, Any] | None = None,
        breakdown: bool = True,
        count_flops: bool = True,
        flops_formula: float | None = None,
        async_save: bool = True,
        sharded: bool | None = None,
    ) -> None:
        env = os.environ
        self.run_id = env.get(contract.RUN_ID, "local")
        self.leg = int(env.get(contract.LEG, "0"))
        self.rung = env.get(contract.RUNG, "none")
        self.max_steps = max_steps or int(env.get(contract.MAX_STEPS, str(DEFAULT_MAX_STEPS)))
        self.deadline = float(env.get(contract.DEADLINE, "inf"))
        self.work = Path(workdir).resolve()
        self.ckpt_every, self.keep, self.verify_bytes = ckpt_every, keep, verify_bytes
        self.metrics_every, self.total_steps = metrics_every, total_steps or self.max_steps
        self.lr_schedule, self.health_every = lr_schedule, health_every
        self.meta = dict(meta or {})
        device = resolve_device(device)
        self.world = world or init_world(device)
        if device == "cuda":
            device = f"cuda:{self.world.local_rank}"
            torch.cuda.set_device(device)
        self.device = device
        self.clock = StepClock(device, breakdown)
        self.flop_probe = FlopProbe(device, count_flops)
        self.flops_formula = flops_formula  # the trainer's own FLOPs/token, shown beside the count MFU rests on
        self.async_save = async_save
        self.sharded = sharded  # through torch.distributed.checkpoint; None: if the model holds DTensors (FSDP2)
        self._snapshot_pool: SnapshotPool | None = None  # async_save's reusable host buffers
        self.flops_per_token: float | None = None
        self.flops_dtype = "fp32"
        self.tracked: dict[str, Any] = {}
        self.evidence = StepEvidence()
        """The batch the model ate, the tracked optimizer's steps, state digests (runtime.session.step_evidence)."""
        self.extra: dict[str, Any] = {}
        """Plain values (numbers, strings, lists, dicts, tensors) saved and restored with the state."""
        self.step_count = self.tokens = 0
        self.exit_code: int | None = None
        self._sigterm: list[bool] = []
        events.emit("session", run_id=self.run_id, leg=self.leg, pid=os.getpid())  # alive: before any slow build
        if stale_code_refused():
            self._exit(EXIT_REFUSED)

    # --- setup ------------------------------------------------------------------

    def _exit(self, code: int) -> None:
        self.world.close()
        sys.exit(code)

    def track(self, **objects: Any) -> "Session":
        """Saved with every checkpoint, restored on resume, by name; `on_step()` is called every step."""
        for name, obj in objects.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"track({name}=...): {type(obj).__name__} has no state_dict/load_state_dict")
            if name in ("rng", "step", "tokens", "extra"):
                raise ValueError(f"track({name}=...): {name!r} is the session's own key")
            self.tracked[name] = obj
            self.evidence.watch(name, obj)
            shield_workers(obj)
        return self

    @property
    def params(self) -> int:
        model = self.tracked.get("model")
        return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0

    @property
    def _optimizer(self) -> Any:
        return next((o for o in self.tracked.values() if isinstance(o, torch.optim.Optimizer)), None)

    def current_lr(self) -> float | None:
        opt = self._optimizer
        return float(opt.param_groups[0]["lr"]) if opt is not None else None

    # --- resume -------------------------------------------------------------------

    def resume(self, **start_facts: Any) -> int:
        """Print `start`, restore from the newest verified checkpoint; the step to continue from
        (runtime.session.resume)."""
        return session_resume.resume(self, start_facts)

    # --- the loop -------------------------------------------------------------------

    def running(self) -> bool:
        """Whether to run one more step: the one stop decision, agreed by every rank."""
        self.flop_probe.abandon()
        if self.exit_code is not None:
            return False
        self._t0 = time.perf_counter()
        self._lr = self.current_lr()
        if self.step_count >= self.max_steps:
            self.reason = "max_steps"
            return False
        local = local_stop(
            self.deadline,
            self.pusher.last_cycle_s if self.pusher else 0.0,
            self._last_step_s,
            self._sigterm,
            self.step_count,
        )
        code = int(self.world.max(local))
        if code:
            self.reason = STOP_CODES[code]
            return False
        self.clock.start(time.perf_counter() - self._t0, self._t0)
        self.flop_probe.begin()
        return True

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or the step's start) to `phase`
        (data, compute, optimizer...): the step event's breakdown. Never syncs the device
        (runtime.measure.steptime)."""
        self.clock.lap(phase)

    def step(
        self,
        loss: Any,
        *,
        batch: Any = None,
        tokens: int = 0,
        lr: float | None = None,
        sample_index: int | None = None,
        epoch: int | None = None,
        **fields: Any,
    ) -> None:
        """One optimizer step is done: print its event, checkpoint on the cadence.

        `loss`: this rank's loss (tensor or float; the event carries the mean over ranks).
        `batch`: what the step read (tensor, array, or a dict/tuple of them) -- hashed here.
        `tokens`: tokens the step consumed across all ranks. `lr`: defaults to the tracked
        optimizer's LR when the step began. `sample_index`, `epoch`: the trainer's own
        position, a second witness beside the hash."""
        local, global_loss, extra = self._close_step(loss, batch, tokens)
        if not math.isfinite(global_loss):  # never push a poisoned state
            events.emit("stop", reason="nonfinite_loss", step=self.step_count, loss=global_loss)
            if self.pusher:
                self.pusher.drain()
            self._exit(EXIT_FAILED)
        step = self.step_count
        for obj in self.tracked.values():
            getattr(obj, "on_step", _no_step_hook)()
        self._history.append((step, self.tokens - self._resume_tokens, time.time()))
        if step % self.metrics_every == 0:
            self._emit_window()
        lr = self._lr if lr is None else lr
        if lr is None:
            raise TypeError("step(lr=...): no optimizer is tracked, so the session cannot read the LR")
        self._witnesses(extra, step, sample_index, epoch)
        per_step = tokens or 0
        events.emit(
            "step",
            step=step,
            loss=round(global_loss, 6),
            loss_local=round(local, 6),
            lr=lr,
            tokens=self.tokens,
            tok_s=round(per_step / self._last_step_s, 1) if self._last_step_s > 0 else None,
            step_s=round(self._last_step_s, 4),
            mem_max_bytes=self._mem_max,
            phases={k: round(v, 5) for k, v in {**self.clock.laps, "ckpt": self._ckpt_s}.items()},
            **extra,
            **self._gpu_phases(),
            **fields,
        )
        self._ckpt_s = 0.0
        if step % self.ckpt_every == 0:
            began = time.perf_counter()
            self.checkpoint()
            self._ckpt_s = time.perf_counter() - began

    def _close_step(self, loss: Any, batch: Any, tokens: int) -> tuple[float, float, dict[str, Any]]:
        """Count the step, hash its batch, mean its loss over ranks, time it; (local loss, mean loss, step fields)."""
        clock = self.clock
        lapped = clock.close_lapped()
        flops = self.flop_probe.end(int(tokens), self.world.world_size, self.step_count + 1)
        local = float(loss.item() if hasattr(loss, "item") else loss)  # waits for the step's queued work
        hashed = time.perf_counter()
        extra = self.evidence.step_fields(batch)  # the batch the model ate; `batch=` a cross-check
        self.step_count += 1
        self.tokens += int(tokens)
        meaned = time.perf_counter()
        global_loss = self.world.mean(local)
        end = time.perf_counter()
        self._last_step_s = end - self._t0
        clock.charge("drain", hashed - lapped)
        clock.charge("session", meaned - hashed)
        clock.charge("sync", end - meaned)
        if flops is not None:
            self._flops_event(flops)
        return local, global_loss, extra

    def _witnesses(self, extra: dict[str, Any], step: int, sample_index: int | None, epoch: int | None) -> None:
        """Add the trainer's own position and the LR schedule's value to the step's fields."""
        if sample_index is not None:
            extra["sample_index"] = int(sample_index)
        if epoch is not None:
            extra["epoch"] = int(epoch)
        if self.lr_schedule is not None:
            extra["lr_expected"] = float(self.lr_schedule(step - 1))

    def checkpoint(self) -> None:
        """Snapshot the state now (on the critical path: the state at one step), then hand the
        rest to the background pusher. `async_save`: the snapshot copies every tensor
        (runtime.checkpoint.disk.snapshot_state) once the pusher's queue has a place, and its worker
        serialises it (`serialized`); False: torch.save + manifest here. Sharded state: every
        rank writes its part here (runtime.session.sharded). `save`: `seconds` on the critical
        path, `bytes` the state's tensor bytes (async) or the checkpoint's."""
        began = time.perf_counter()
        rngs = self.world.gather(rng_state())  # collective: every rank reaches this at the same step
        self.pushed_at = step = self.step_count
        if self.sharded:
            return sharded_session.checkpoint(self, began, rngs)
        if self.pusher is None:
            return
        meta = {"run_id": self.run_id, "params": self.params, **self.meta}
        sizes: dict[str, int] = {}

        def digests(state: dict[str, Any]) -> None:  # async: on the pusher's thread, from the snapshot
            events.emit("state_digest", step=step, digests=state_digests(state, list(state)))

        def take() -> dict[str, Any]:
            state = {name: obj.state_dict() for name, obj in self.tracked.items()}
            state.update(rng=rngs, step=step, tokens=self.tokens, extra=self.extra)
            sizes.update((name, tensor_bytes(value)) for name, value in state.items() if name != "rng")
            return state

        if self.async_save:
            pool = self._snapshot_pool = self._snapshot_pool or SnapshotPool()
            copied: list[int] = []

            def build() -> PendingCheckpoint:
                snap = snapshot_state(take(), pool)
                copied.append(snap.bytes)
                return PendingCheckpoint(snap, self.work / "ckpt", step, meta, before_save=digests)

            blocked = self.pusher.submit_job(step, build)  # a place in the queue first: two snapshots at most
            nbytes = copied[0]
        else:
            digests(state := take())
            folder, manifest = save_local(state, self.work / "ckpt", step, meta)
            blocked = self.pusher.submit(folder, manifest)
            nbytes = manifest.total_bytes
        events.emit(
            "save",
            step=step,
            bytes=nbytes,
            seconds=round(time.perf_counter() - began, 4),
            blocked_s=round(blocked, 4),
            state_bytes={k: v for k, v in sizes.items() if v},
            params=self.params,
            async_save=self.async_save,
        )

    def _gpu_phases(self) -> dict[str, Any]:
        gpu = self.clock.gpu_phases()
        return {"gpu_phases": {k: round(v, 5) for k, v in gpu.items()}} if gpu is not None else {}

    def _flops_event(self, flops: dict[str, Any]) -> None:
        self.flops_per_token = flops.get("flops_per_token")
        self.flops_dtype = flops.get("dtype") or "fp32"
        if self.world.is_main:
            if self.flops_formula:
                flops["formula_flops_per_token"] = float(self.flops_formula)
            events.emit("flops", **flops)

    def _emit_window(self) -> None:
        """Per window (runtime.measure.window): memory (cross-rank MAX), the sustained rate + ETA + MFU; a health line."""
        step = self.step_count
        self._mem_max = emit_memory(self.world, self.device, step)
        emit_rate(
            self.world, self.device, step, self._history, self.total_steps, self.flops_per_token, self.flops_dtype
        )
        if self.health is not None:
            self.health.maybe_emit(step)

    # --- the end ----------------------------------------------------------------------

    def finish(self) -> int:
        """Final checkpoint (whatever stopped the loop, the work is kept), wait for every push
        to go through its cycle, print `done`; the leg's exit code."""
        if self.exit_code is not None:
            return self.exit_code
        step = self.step_count
        events.emit("stop", reason=getattr(self, "reason", "max_steps"), step=step)
        if step > self.pushed_at:
            self.checkpoint()
        ok = True
        if self.pusher is not None:
            self.pusher.drain()  # every snapshot serialised, every checkpoint through its cycle
            self._snapshot_pool = None  # the reusable host buffers go
            ok = step == self.resumed_at or self.pusher.verified(step)
        self.world.barrier("rank 0 finishing its pushes")
        ok = bool(self.world.broadcast(ok))  # only rank 0 can know; every rank exits the same way
        events.emit("done", step=step, final_checkpoint_verified=ok)
        self.exit_code = 0 if ok else EXIT_FAILED
        self.world.close()
        return self.exit_code

    def rank_timeout(self, err: RankTimeout) -> int:
        """Every rank says what it waited for (call from `except RankTimeout`)."""
        events.emit("stop", reason="rank_timeout", error=str(err))
        self.exit_code = EXIT_FAILED
        self.world.close()
        return EXIT_FAILED

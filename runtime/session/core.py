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
- restores everything tracked (anything with `state_dict`/`load_state_dict`), every RNG stream per rank,
  the step and the tokens, from the newest verified checkpoint that fetches, checks and loads (damaged ones
  skipped with `resume_skip`); FSDP2 state through torch.distributed.checkpoint (runtime.checkpoint.dcp);
- `step()` prints the `step` event with the hash of the inputs the tracked model was fed (step_evidence),
  snapshots the state on the cadence and runs the storage cycle in the background;
- counts the first step's FLOPs, times each step's phases without a device sync (runtime.measure.steptime):
  `flops`, `gpu_phases` on `step`, per window `memory` and `rate` with MFU (runtime.measure.window);
- stops on LAUNCHER_DEADLINE (with room for one more push), SIGTERM, LAUNCHER_MAX_STEPS (counted across
  legs) and a non-finite loss (never pushed; exit 1), one decision for every rank under torchrun;
  `finish()` pushes the final checkpoint, waits for it to verify and prints `done`.
Loader workers leave SIGTERM to the leg (runtime.session.workers). Cost per step: bench/session_overhead.py.
Under runtime.programs.memory (LAUNCHER_MEMORY) `Session(...)` is a stand-in that does none of this.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

import torch

from runtime import contract, events
from runtime.checkpoint.cycle import Pusher
from runtime.checkpoint.dcp import is_sharded
from runtime.checkpoint.node_cycle import node_leaders
from runtime.contract import EXIT_FAILED, EXIT_REFUSED, STOP_CODES
from runtime.measure.health import Health
from runtime.measure.steptime import FlopProbe, StepClock
from runtime.measure.window import emit_memory, emit_rate
from runtime.memory import mode as memory_mode
from runtime.session import resume as session_resume
from runtime.session import sharded as sharded_session
from runtime.session.resume import Parts, Resumed, tracked_lr
from runtime.session.rng import rng_state
from runtime.session.rules import DEFAULT_MAX_STEPS, LegEnd, local_stop, stale_code_refused, stray
from runtime.session.saver import AtStep, StateSaver
from runtime.session.step_evidence import StepEvidence
from runtime.session.workers import quiet_sigchld, shield_workers
from runtime.session.world import RankTimeout, World, place
from runtime.store import Store, open_store

_no_step_hook: Callable[[], None] = lambda: None  # noqa: E731 - an object with no on_step()


class Session:
    """One leg of a run, from the trainer's side. See the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # runtime.memory: the Session stands aside
        from runtime.memory.stand_in import MemorySession

        return MemorySession(**kwargs) if memory_mode() is not None and cls is Session else super().__new__(cls)

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
        self.world, self.device = place(device, world)
        self.clock = StepClock(self.device, breakdown)
        self.flop_probe = FlopProbe(self.device, count_flops)
        self.flops_formula = flops_formula  # the trainer's own FLOPs/token, shown beside the count MFU rests on
        self.async_save = async_save
        self.sharded = sharded  # through torch.distributed.checkpoint; None: if the model holds DTensors (FSDP2)
        self.saver = StateSaver(self.work)  # the saves, the storage cycle (runtime.session.saver)
        self.store: Store | None = None  # opened by `resume`
        self.health: Health | None = None  # local rank 0, from `resume`
        self.resumed = Resumed()  # where this leg started (runtime.session.resume), from `resume`
        self.flops_per_token: float | None = None
        self.flops_dtype = "fp32"
        self.tracked: dict[str, Any] = {}
        self.evidence = StepEvidence()  # the batch the model ate, optimizer steps, digests (step_evidence)
        self.extra: dict[str, Any] = {}  # plain values (numbers, strings, lists, tensors) saved with the state
        self.step_count = self.tokens = self._resume_tokens = 0
        self.exit_code: int | None = None
        self.reason = "max_steps"  # why the loop stopped (runtime.contract.STOP_CODES)
        self._sigterm: list[bool] = []
        self._t0 = self._last_step_s = self._ckpt_s = 0.0  # this step's start; the last step's seconds, its save's
        self._lr: float | None = None  # the optimizer's LR as the step began
        self._history: list[tuple[int, float, float]] = []  # (step, tokens since the resume, time): the rate
        self._mem_max: float | None = None
        events.emit("session", run_id=self.run_id, leg=self.leg, pid=os.getpid())  # alive: before any slow build
        if stale_code_refused():
            self._exit(EXIT_REFUSED, "stale_code")

    # --- setup ------------------------------------------------------------------

    def _exit(self, code: int, reason: str) -> NoReturn:
        """The leg ends here, its `stop` line printed: the process group closed, LegEnd raised."""
        self.world.close()
        raise LegEnd(code, reason)

    def _on_sigterm(self, signum: int, frame: Any) -> None:  # the leg's stop: noted, acted on between steps
        self._sigterm.append(True)
        quiet_sigchld()

    @property
    def pusher(self) -> Pusher | None:  # the saver's (None on ranks that push nothing, and before `resume`)
        return self.saver.pusher

    @property
    def pushed_at(self) -> int:  # the step last handed to the storage cycle (or resumed at)
        return self.saver.pushed_at

    @pushed_at.setter
    def pushed_at(self, step: int) -> None:
        self.saver.pushed_at = step

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
            session_resume.tracked_late(self.resumed, name, obj, self.evidence.kinds[name], self.step_count)
        return self

    @property
    def params(self) -> int:
        model = self.tracked.get("model")
        return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0

    def current_lr(self) -> float | None:
        return tracked_lr(self.tracked)

    # --- resume -------------------------------------------------------------------

    def resume(self, **start_facts: Any) -> int:
        """Print `start`, restore from the newest verified checkpoint; the step to continue from
        (runtime.session.resume)."""
        store = self.store = open_store(
            os.environ.get(contract.STORE, (self.work / "store").as_uri()), f"runs/{self.run_id}"
        )
        self._start(store, start_facts)
        world, restore = self.world, self.work / "restore"
        sharded = self.sharded = (
            any(is_sharded(o) for o in self.tracked.values()) if self.sharded is None else self.sharded
        )
        self.saver.leaders = (
            node_leaders(world) if sharded and sharded_session.several_nodes(world.world_size) else None
        )
        parts = Parts(self.tracked, self.extra, self.evidence, self.lr_schedule)
        try:
            choice = session_resume.choose(world, store, restore, self.device, sharded)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self.saver.open(store, world, self.keep, self.verify_bytes, replace=choice.skipped)
            self.health = Health(self.work, self.device, self.health_every) if world.local_rank == 0 else None
            resumed = self.resumed = session_resume.load(world, store, choice, restore, self.device, parts, sharded)
        except LegEnd:
            self.world.close()
            raise
        self.step_count, self.tokens = resumed.step, resumed.tokens
        self.deadline = contract.resumed_deadline(self.deadline, dict(os.environ), time.time())
        self.saver.start_at(self.step_count)
        self._resume_tokens = self.tokens
        self._history, self._mem_max = [], None
        self._ckpt_s = self._last_step_s = 0.0
        return self.step_count

    def _start(self, store: Store, start_facts: dict[str, Any]) -> None:
        events.emit(
            "start",
            run_id=self.run_id,
            leg=self.leg,
            rung=self.rung,
            device=self.device,
            torch=torch.__version__,
            world_size=self.world.world_size,
            params=self.params,
            max_steps=self.max_steps,
            total_steps=self.total_steps,
            store=store.uri,
            tracked=self.evidence.kinds,
            deterministic=self.evidence.determinism.settings,
            **start_facts,
        )

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
        local = local_stop(self.deadline, self.saver.last_cycle_s, self._last_step_s, self._sigterm, self.step_count)
        code = int(self.world.max(local))
        if code:
            self.reason = STOP_CODES[code]
            return False
        self.clock.start(time.perf_counter() - self._t0, self._t0)
        self.flop_probe.begin()
        return True

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or the step's start) to `phase` (data, compute,
        optimizer...): the step event's breakdown. Never syncs the device (runtime.measure.steptime)."""
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
            self.saver.drain()
            self._exit(EXIT_FAILED, "nonfinite_loss")
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
        stray(step, self.world)  # only in `drill hang --how collective`: this rank blocks here
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
        """Snapshot the state now (on the critical path), then hand the rest to the background pusher
        (runtime.session.saver: async or sync). Sharded state: every rank writes its part here."""
        began = time.perf_counter()
        rngs = self.world.gather(rng_state())  # collective: every rank reaches this at the same step
        self.pushed_at = step = self.step_count
        if not self.sharded and self.pusher is None:
            return
        meta = {"run_id": self.run_id, "params": self.params, **self.meta}
        at = AtStep(step, self.tokens, rngs, self.tracked, self.extra, meta)
        if self.sharded:
            sharded_session.checkpoint(at, self.world, self.work, self.pusher, self.saver.leaders, began)
        else:
            self.saver.save(at, self.async_save, began)

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
        events.emit("stop", reason=self.reason, step=step)
        if step > self.pushed_at:
            self.checkpoint()
        ok = self.saver.final(step)  # every snapshot serialised, every checkpoint through its cycle
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

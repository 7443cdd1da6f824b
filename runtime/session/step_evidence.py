"""The session's own evidence of each step and each checkpoint, measured, not declared.

- **The batch the model ate** (`runtime.session.batches.FedInputs`): a step's `batch_hash` is the
  digest of the tracked model's training-forward inputs (`batch_from: "forward"`), less the
  arguments named as carried state (an RNN's `hidden`, a cache), digested apart by name
  (`fed_state`). A `step(batch=...)` becomes a cross-check that only reports (`step_batch_fed`:
  every tensor given was among those fed; a random augmentation feeds the model another batch).
  A loop whose model is not tracked, or never runs a training forward, falls back to the
  `batch=` digest (`batch_from: "step"`).
- **The optimizer in use**: a step post-hook on each tracked optimizer counts its steps
  (`opt_steps`, cumulative in this leg), and torch's global optimizer hook every optimizer's
  steps in the process, tracked or not (`opt_steps_all`). An optimizer re-created after the
  resume is not the tracked one: its steps do not count, and the launcher says so; a loop that
  updates its weights by hand steps none at all, and the launcher says that instead.
- **State digests** (`state_digests`): per tracked object (model, optimizer, scheduler, loader,
  `extra`, each RNG stream) a digest of its saved state, at every checkpoint (the `state_digest`
  event, computed in the background from the snapshot, off the critical path) and of each
  object as loaded at a resume (the `resume` event's `digests`). On a CPU every digest at every
  checkpoint step must equal the straight-through run's: a counter or a plateau scheduler that
  diverges shows in the state the moment it diverges, before any loss does.
- **The state training starts from** (`trains_from`): after a resume, at the first training
  forward, the digests of each tracked model's weights and each optimizer's moments. The
  launcher compares them with its own read of the store's checkpoint: a loop that replaces
  the restored state before it trains (a host-local copy, a newer checkpoint that never
  verified) is named, though the session itself loaded the right one.
"""

from __future__ import annotations

import hashlib
import struct
import weakref
from typing import Any

import numpy as np
import torch

from runtime import events
from runtime.session import global_hooks
from runtime.session.batches import FedInputs, _bytes_of, batch_digest
from runtime.session.determinism import Determinism

KINDS = ("model", "optimizer", "scheduler", "data", "other")


def kind_of(obj: Any) -> str:
    """What a tracked object is, for the report's proofs (2 data, 3 optimizer/scheduler, 4 the rest)."""
    declared = getattr(obj, "state_kind", None)
    if declared in KINDS:
        return declared
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
        return "scheduler"
    if isinstance(obj, torch.utils.data.DataLoader) or hasattr(obj, "sample_index"):
        return "data"
    return "other"


class _Steps:
    """Optimizer steps, counted by torch's global optimizer hook (runtime.session.global_hooks):
    every optimizer's in the process, and the tracked ones' (by identity, weakly). Nothing is
    registered on the user's optimizer, and the hook holds this, not the StepEvidence."""

    def __init__(self) -> None:
        self.all = 0
        self.tracked = 0
        self.optimizers: list[weakref.ref[Any]] = []

    def __call__(self, optimizer: Any) -> None:
        self.all += 1
        if any(ref() is optimizer for ref in self.optimizers):
            self.tracked += 1


class StepEvidence:
    """Hooks on the tracked objects; the evidence fields of each step event."""

    def __init__(self) -> None:
        self.fed = FedInputs()
        self.steps = _Steps()
        global_hooks.count_optimizer_steps(self, self.steps)
        self.kinds: dict[str, str] = {}
        self.determinism = Determinism()
        """The rung's deterministic mode (runtime.session.determinism), on from the session's start."""

    @property
    def opt_steps(self) -> int:
        """The tracked optimizers' steps in this leg."""
        return self.steps.tracked

    @opt_steps.setter
    def opt_steps(self, value: int) -> None:
        """Set both counts (a DCP load that steps an empty optimizer once is no training step)."""
        self.steps.tracked = self.steps.all = value

    def watch(self, name: str, obj: Any) -> None:
        self.kinds[name] = kind = kind_of(obj)
        if isinstance(obj, torch.nn.Module):
            self.fed.watch(obj)
        if kind == "optimizer" and isinstance(obj, torch.optim.Optimizer):
            self.steps.optimizers.append(weakref.ref(obj))

    def trains_from(self, tracked: dict[str, Any], step: int) -> None:
        """After a resume to `step`: at the first training forward, print `trains_from` with
        the digests of the state that forward trains (`trained_state_digests`)."""

        def emit() -> None:
            states = {n: o.state_dict() for n, o in tracked.items() if self.kinds.get(n) in TRAINED_KINDS}
            events.emit("trains_from", step=step, digests=trained_state_digests(states, self.kinds))

        self.fed.first = emit

    def step_fields(self, batch: Any) -> dict[str, Any]:
        """`batch_hash` (and where it came from), `fed_state`, the `batch=` cross-check, `opt_steps`."""
        out = self.fed.step_fields(given=batch)
        if not out and batch is not None and (given := batch_digest(batch)) is not None:
            out.update(batch_hash=given, batch_from="step")
        if any(kind == "optimizer" for kind in self.kinds.values()):
            out["opt_steps"] = self.opt_steps
        out["opt_steps_all"] = self.steps.all
        if ops := self.determinism.take():
            out["nondeterministic"] = ops
        return out


# --- state digests ---------------------------------------------------------------------


def _feed(h: Any, value: Any) -> None:
    """A canonical walk of a state: every key, type, shape and byte, in a fixed order."""
    if isinstance(value, torch.Tensor):
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(_bytes_of(value))  # the batch hash's bytes: on the host, contiguous, bf16 as int16
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(_bytes_of(value))
    elif isinstance(value, dict):
        h.update(b"D%d" % len(value))
        for key in sorted(value, key=repr):
            h.update(repr(key).encode() + b":")
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(b"L%d" % len(value))
        for item in value:
            _feed(h, item)
    elif isinstance(value, float):
        h.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, (bool, int, str, bytes, type(None))):
        h.update(f"{type(value).__name__}:{value!r}".encode())
    elif callable(value):  # a schedule's lambda: its identity is not state
        h.update(b"callable")
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def state_digest(value: Any) -> str:
    """sha256 (hex, 32 chars) of one object's saved state, canonical and exact."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()[:32]


def state_digests(state: dict[str, Any], names: list[str]) -> dict[str, str]:
    """A digest per tracked object and for `extra`; per RNG stream over every rank's state
    (`rng.<stream>`)."""
    out = {name: state_digest(state[name]) for name in names if name in state and name not in ("rng", "step", "tokens")}
    rngs = state.get("rng") or []
    for stream in sorted({k for r in rngs if isinstance(r, dict) for k in r}):
        out[f"rng.{stream}"] = state_digest([r.get(stream) for r in rngs if isinstance(r, dict)])
    return out


TRAINED_KINDS = ("model", "optimizer")


def trained_state_digests(states: dict[str, Any], kinds: dict[str, str]) -> dict[str, str]:
    """What a resumed leg trains from: each model's weights and each optimizer's moments (its
    `state`; not its `param_groups`, whose LR a loop may set before the forward, as nanoGPT
    does). The launcher computes the same from the store's checkpoint (runtime.programs.loadcheck)."""
    out = {}
    for name, kind in kinds.items():
        value = states.get(name)
        if kind == "model" and value is not None:
            out[name] = state_digest(value)
        elif kind == "optimizer" and isinstance(value, dict):
            out[name] = state_digest(value.get("state", {}))
    return out

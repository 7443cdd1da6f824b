"""Every storage a step makes, by what it is for, while it lives: the prediction's accounting.

A dispatch mode (above FakeTensorMode, so it sees every op the script runs and the fake outputs
it returns) files each new storage under a category at birth and drops it when its last
reference dies (a weak reference's callback, as the caching allocator frees a block):

- at birth, by where the op ran: inside `optimizer.step()` -> optimizer; inside autograd's
  backward -> temporaries; inside a module's forward -> activations; anywhere else -> other
  (the batch, a loss computed outside a module, the model while it is being built);
- refiled when it is known for what it is: a module's parameters and buffers at its first
  forward, a parameter's gradient as it is accumulated, the optimizer's state after its step.

The peak is the largest total any device held, with the categories at that moment. A CUDA
block is counted as the caching allocator rounds it (512 bytes); a CPU one exactly. What no op
returns is not seen (but for the kernels runtime.memory.opaque measures: oneDNN's RNN layer): a
kernel's private workspace (cuBLAS, cuDNN), the CUDA context,
NCCL's buffers, the allocator's reserve: the launcher adds those as a stated allowance
(launcher.checks.memfit).

torch's own MemTracker does this too, with per-module statistics this needs none of; it refuses
a module called twice in one step (an evaluation before the first step, a shared block), which
scripts do.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch._guards import active_fake_mode
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_leaves

from runtime.memory.opaque import OPAQUE
from runtime.memory.opaque import extra as opaque_extra

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations", "temporaries", "other")
CUDA_BLOCK = 512
SCALES = (2, 4, 8, 16, 32)
"""Micro-batch multiples the peak is also kept for: at every moment, what was held with the
activations and temporaries (what grows with the micro-batch) taken that many times over."""


def _plain(value: Any) -> list[torch.Tensor]:
    """The tensors that hold memory in `value`: a DTensor's is its local shard, not its global shape."""
    out = []
    for t in tree_leaves(value):
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        if is_traceable_wrapper_subclass(t):
            out += _plain([getattr(t, name) for name in t.__tensor_flatten__()[0]])
        else:
            out.append(t)
    return out


def _bytes(st: torch.UntypedStorage, device: torch.device) -> int:
    n = int(st.nbytes())
    return -(-n // CUDA_BLOCK) * CUDA_BLOCK if device.type == "cuda" else n


class _Held:
    __slots__ = ("bytes", "category", "device", "ref")

    def __init__(self, nbytes: int, category: str, device: str) -> None:
        self.bytes, self.category, self.device = nbytes, category, device
        self.ref: Any = None


class Account(TorchDispatchMode):
    """See the module docstring. `peak()` -> (device, bytes, {category: bytes})."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, _Held] = {}  # id(storage) -> what it holds, while the storage lives
        self.now: dict[str, dict[str, int]] = {}  # device -> category -> bytes
        self.top: dict[str, tuple[int, dict[str, int]]] = {}  # device -> (peak, categories then)
        self.scaled: dict[str, dict[int, int]] = {}  # device -> micro-batch multiple -> peak (SCALES)
        self.seen_modules: set[int] = set()
        self.depth = 0  # modules' forwards under way
        self.in_optimizer = False
        self._hooks: list[Any] = []
        self.fake_mode: Any = None  # the fake mode the step runs in (None: real tensors)
        self._meta: Any = None  # DTensor's own propagation, while it is wrapped (`_propagation`)
        self.propagating = 0  # inside DTensor's sharding propagation (its fake arguments are global-sized)

    # --- the storages -----------------------------------------------------------------------
    def _add(self, st: torch.UntypedStorage, category: str, device: torch.device) -> None:
        key = id(st)
        if key in self.held:
            return
        held = _Held(_bytes(st, device), category, str(device))
        self.held[key] = held
        held.ref = weakref.ref(st, functools.partial(self._drop, key))
        self._move(held, held.bytes, category)

    def _drop(self, key: int, ref: Any = None) -> None:  # a weak reference's callback (`ref`: the dead one)
        held = self.held.pop(key, None)
        if held is not None:
            self._move(held, -held.bytes, held.category)

    def _move(self, held: _Held, nbytes: int, category: str) -> None:
        cats = self.now.setdefault(held.device, dict.fromkeys(CATEGORIES, 0))
        cats[category] += nbytes
        total = sum(cats.values())
        if total > self.top.get(held.device, (0, {}))[0]:
            self.top[held.device] = (total, dict(cats))
        if nbytes > 0:  # a peak is reached at an allocation
            grows = cats["activations"] + cats["temporaries"]
            scaled = self.scaled.setdefault(held.device, dict.fromkeys(SCALES, 0))
            for m in SCALES:
                scaled[m] = max(scaled[m], total + (m - 1) * grows)

    def refile(self, value: Any, category: str) -> None:
        """File `value`'s storages under `category` (counted now if they were not yet)."""
        for t in _plain(value):
            st = t.untyped_storage()
            held = self.held.get(id(st))
            if held is None:
                self._add(st, category, t.device)
            elif held.category != category:
                self._move(held, -held.bytes, held.category)
                held.category = category
                self._move(held, held.bytes, category)

    def resized(self, st: torch.UntypedStorage) -> None:
        """A storage resized in place (FSDP2 frees and refills its unsharded parameters so)."""
        held = self.held.get(id(st))
        if held is None:
            return
        device = torch.device(held.device)
        new = _bytes(st, device)
        self._move(held, new - held.bytes, held.category)
        held.bytes = new

    # --- where an op runs -------------------------------------------------------------------
    def _category(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if torch._C._current_autograd_node() is not None:
            return "temporaries"
        return "activations" if self.depth > 0 else "other"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor (FSDP2's parameters): its local ops come back here, shard-sized
        out = func(*args, **(kwargs or {}))
        if self.propagating or active_fake_mode() is not self.fake_mode:
            return out  # DTensor's sharding propagation: stand-ins of the global shape, never memory
        category = self._category()
        for t in _plain(out):
            self._add(t.untyped_storage(), category, t.device)
        if func in OPAQUE:  # what the real kernel held beyond its outputs while it ran (runtime.memory.opaque)
            self._transient(opaque_extra(func, args, kwargs), out)
        return out

    def _transient(self, nbytes: int, out: Any) -> None:
        tensors = _plain(out)
        if nbytes <= 0 or not tensors:
            return
        held = _Held(nbytes, "temporaries", str(tensors[0].device))
        self._move(held, nbytes, held.category)
        self._move(held, -nbytes, held.category)

    # --- hooks: what a storage turns out to be -------------------------------------------------
    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.depth += 1
        if id(module) in self.seen_modules:
            return
        self.seen_modules.add(id(module))
        for p in module.parameters(recurse=False):
            self.refile(p, "parameters")
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: self.refile(p.grad, "gradients"))
        for b in module.buffers(recurse=False):
            self.refile(b, "buffers")

    def _post_forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.depth = max(0, self.depth - 1)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.refile(p, "parameters")
                if p.grad is not None:
                    self.refile(p.grad, "gradients")
        self.in_optimizer = True

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_optimizer = False
        self.refile([v for state in optimizer.state.values() for v in state.values()], "optimizer")

    def __enter__(self) -> "Account":
        self.fake_mode = active_fake_mode()
        self._hooks = [
            register_module_forward_pre_hook(self._pre_forward),
            register_module_forward_hook(self._post_forward, always_call=True),
            register_optimizer_step_pre_hook(self._pre_step),
            register_optimizer_step_post_hook(self._post_step),
        ]
        resize = self._resize = torch.UntypedStorage.resize_

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = resize(st, size)
            self.resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        self._propagation(True)
        return super().__enter__()

    def _propagation(self, on: bool) -> None:
        """DTensor's sharding propagation makes global-shaped tensors to learn an op's output shape:
        under a fake mode of its own, or (here) the step's. Not counted: nothing of it is memory."""
        try:
            from torch.distributed.tensor._sharding_prop import ShardingPropagator
        except ImportError:
            return
        if not on:
            ShardingPropagator._propagate_tensor_meta_non_cached = self._meta
            return
        meta = self._meta = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate(prop: Any, *args: Any, **kwargs: Any) -> Any:
            self.propagating += 1
            try:
                return meta(prop, *args, **kwargs)
            finally:
                self.propagating -= 1

        ShardingPropagator._propagate_tensor_meta_non_cached = propagate

    def __exit__(self, *exc: Any) -> None:
        for h in self._hooks:
            h.remove()
        torch.UntypedStorage.resize_ = self._resize
        self._propagation(False)
        super().__exit__(*exc)

    def peak(self) -> tuple[str, int, dict[str, int]]:
        """The device that held the most: its name, its peak bytes, the categories at the peak."""
        if not self.top:
            return "cpu", 0, dict.fromkeys(CATEGORIES, 0)
        device, (total, cats) = max(self.top.items(), key=lambda kv: kv[1][0])
        return device, total, cats

    def scaled_peaks(self, device: str) -> dict[str, int]:
        """`device`'s peak were the micro-batch m times larger, for each m of SCALES: an estimate
        that takes the activations and temporaries as growing in proportion to it."""
        return {str(m): b for m, b in self.scaled.get(device, {}).items()}

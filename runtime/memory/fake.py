"""The fake side of a prediction: tensors without storage, and a world of ranks without peers.

- `Valueless`: torch's FakeTensorMode, where a value read back (`loss.item()`, `if found_inf`,
  `.tolist()`, `.numpy()`) reads as zero instead of raising. Nothing is computed, so a script
  whose control flow depends on a value takes the path where every value is 0; the memory a
  step holds rarely does (a loss printed, a scaler's inf check, a clip's norm).
- `fake_world`: this process as rank R of W through torch's fake process group (collectives
  return at once, their outputs shaped as real ones); the script's own `init_process_group`,
  and any framework's, finds it joined. Python objects sent between ranks (a log dir, a seed)
  stay this rank's own: a pickled object's bytes would be a fake tensor's. DDP's gradient
  all-reduce leaves each bucket as it is (the memory a reduced bucket holds).
- DataLoaders are read in the process (no workers): a worker is a fork, fake mode and all, and a
  fake tensor cannot be pickled back to the parent.
- A kernel whose fake misstates its memory (oneDNN's RNN layer: runtime.memory.opaque) returns
  its outputs at the sizes the real kernel makes, measured once per shape.
- A deep copy of a fake is a new fake (torch's own copy refuses a FakeTensor: torchmetrics copies
  its states' defaults so).
- `torch.save` writes nothing: a fake tensor has no bytes, and a save copies to the host anyway.
- Module conversions (`model.to(dtype)`, `.half()`) swap each FakeTensor parameter for a new one
  (Module._apply swaps fake tensors), and torch.utils.swap_tensors refuses a tensor anything
  holds a weak reference to: FakeTensorMode's converter memo does. The memo maps real tensors to
  their fakes for conversions already made; it is emptied before each swap (a real tensor
  converted again gets a new fake of the same shape, which is all a prediction reads).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as tdist
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._pytree import tree_leaves

from runtime.memory.opaque import OPAQUE, measured

_scalar = torch.ops.aten._local_scalar_dense.default


SEEN: set[str] = set()
"""What the script built that the result reports: "ddp" once a model was wrapped in DDP."""

REAL_INDEX_NUMEL = 1 << 20
"""An integer or bool result of at most this many elements, made from real inputs only, is computed
for real (8 MiB of int64 at most): indices, positions, token batches and masks keep their values."""


def _fakes(value: Any) -> bool:
    return any(isinstance(t, FakeTensor) for t in tree_leaves(value))


class Valueless(FakeTensorMode):
    """FakeTensorMode in which reading a value of a fake gives 0 (False for a bool), and small
    integer results of real inputs stay real.

    Why both: a loss read for a print, a scaler's inf check, a clip's norm need no value, and 0
    serves. Index arithmetic does: nanoGPT's `x = torch.stack([data[i:i+T] for i in
    torch.randint(...)])` slices by each index's value, and a slice of a fake index read as 0 is
    empty, so the batch was 0 rows and no activation was counted. Integers made from real inputs
    (a randint, an arange, a token batch cut from a real corpus) are computed for real, up to
    REAL_INDEX_NUMEL elements; floats never are: the model's tensors stay fake at every size."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "cpu" and device.index is not None:
            kwargs = {**kwargs, "device": torch.device("cpu")}  # real tensors ignore a CPU's index, fakes compare it
        if func is _scalar and not isinstance(args[0], FakeTensor):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is _scalar:
            try:  # a value FakeTensorMode kept (a one-element tensor made from a constant: a step count)
                return super().__torch_dispatch__(func, types, args, kwargs)
            except DataDependentOutputException:
                dtype = args[0].dtype
                return False if dtype == torch.bool else (0.0 if dtype.is_floating_point or dtype.is_complex else 0)
        if not _fakes((args, kwargs)):
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if inputs and _small_integers(inputs):  # DeviceMesh's `(mesh == rank).nonzero()`: no fake can size it
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func in OPAQUE and all(t.device.type == "cpu" for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            return _as_measured(func, args, kwargs, out)
        if _fakes((args, kwargs)) or not _small_integers(out):
            return out
        with unset_fake_temporarily():  # a factory of indices (randint, arange): made for real
            return func(*args, **kwargs)


def _as_measured(func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """A kernel whose fake misstates its outputs (runtime.memory.opaque): its outputs as the real
    kernel makes them at these shapes."""
    with unset_fake_temporarily():
        shapes, _ = measured(func, args, kwargs)
    return type(out)(o.new_empty(shape) if tuple(o.shape) != shape else o for o, shape in zip(out, shapes))


def _same(a: Any, b: Any) -> bool:
    """Two views of one storage with one shape, stride, dtype and device: a swap would change nothing."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.untyped_storage() is b.untyped_storage()
        and (a.shape, a.stride(), a.dtype, a.device, a.storage_offset())
        == (b.shape, b.stride(), b.dtype, b.device, b.storage_offset())
    )


def _small_integers(value: Any) -> bool:
    tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(
        not (t.dtype.is_floating_point or t.dtype.is_complex) and t.numel() <= REAL_INDEX_NUMEL for t in tensors
    )


@contextlib.contextmanager
def valueless() -> Iterator[Valueless]:
    """Every tensor made inside is fake (real ones met are converted); values read as zero."""
    mode = Valueless(allow_non_fake_inputs=True)
    swap, tolist, numpy, save = torch.utils.swap_tensors, torch.Tensor.tolist, torch.Tensor.numpy, torch.save

    def swap_tensors(t1: Any, t2: Any) -> None:
        if _same(t1, t2):  # `model.to(the device it is on)`: Module._apply swaps a fake parameter even then
            return
        memo = mode.fake_tensor_converter.meta_converter
        memo.tensor_memo.clear()
        memo.storage_memo.clear()
        swap(t1, t2)

    def as_list(self: torch.Tensor) -> Any:
        return np.zeros(tuple(self.shape), dtype=np.float64).tolist() if isinstance(self, FakeTensor) else tolist(self)

    def as_numpy(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        if not isinstance(self, FakeTensor):
            return numpy(self, *a, **k)
        with unset_fake_temporarily():
            kind = numpy(torch.empty((), dtype=self.dtype)).dtype
        return np.zeros(tuple(self.shape), dtype=kind)

    def no_save(*args: Any, **kwargs: Any) -> None:
        return None  # fake tensors have no bytes to write; a save copies to the host, off the device

    def fake_copy(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:  # torch's refuses fakes
        new = self.new_empty_strided(self.size(), self.stride()).requires_grad_(self.requires_grad)
        memo[id(self)] = new
        return new

    torch.utils.swap_tensors = swap_tensors
    torch.save = no_save
    FakeTensor.__deepcopy__ = fake_copy
    torch.Tensor.tolist = as_list
    torch.Tensor.numpy = as_numpy
    try:
        with mode:
            yield mode
    finally:
        torch.utils.swap_tensors, torch.save = swap, save
        del FakeTensor.__deepcopy__
        torch.Tensor.tolist, torch.Tensor.numpy = tolist, numpy


def _bucket_as_reduced(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations: none
    """DDP's gradient all-reduce in a world without peers: the bucket, reduced in place as NCCL or gloo
    would leave it (the fake process group's future carries no tensor, and DDP's reducer asserts one)."""
    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def fake_world(rank: int, world_size: int) -> None:
    """Join torch's fake process group as `rank` of `world_size`; make later joins no-ops.

    The environment a launcher (torchrun) would give the rank is set first, so a script that
    reads RANK / LOCAL_RANK / WORLD_SIZE sees the world it is predicted for."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size <= 1:
        return  # a plain `python train.py`: no launcher's variables (Accelerate reads LOCAL_RANK as "distributed")
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29500",
    )
    tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    init, new_group = tdist.init_process_group, tdist.new_group

    def joined(*args: Any, **kwargs: Any) -> None:
        if not tdist.is_initialized():
            init(*args, **kwargs)

    def kept(*args: Any, **kwargs: Any) -> None:
        return None

    def fake_group(ranks: Any = None, timeout: Any = None, backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        return new_group(ranks, timeout, "fake", *args, **kwargs)  # a gloo control group would need real peers

    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_init = DDP.__init__

    def ddp_without_peers(self: Any, *args: Any, **kwargs: Any) -> None:
        ddp_init(self, *args, **kwargs)
        self.register_comm_hook(None, _bucket_as_reduced)
        SEEN.add("ddp")  # the result says so

    def broadcast_objects(objects: list[Any], *args: Any, **kwargs: Any) -> None:
        return None  # every rank keeps its own: the objects are this rank's (a log dir, a seed)

    def gather_objects(out: list[Any], obj: Any, *args: Any, **kwargs: Any) -> None:
        out[:] = [obj] * len(out)

    DDP.__init__ = ddp_without_peers
    for where in (tdist, tdist.distributed_c10d):
        where.broadcast_object_list = broadcast_objects
        where.all_gather_object = gather_objects
        where.init_process_group = joined
        where.destroy_process_group = kept
        where.new_group = fake_group

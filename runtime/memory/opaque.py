"""Kernels whose fake implementation does not describe their memory, measured for real, once per shape.

oneDNN's LSTM/GRU layer on a CPU (`aten.mkldnn_rnn_layer`) keeps a training workspace its fake
(meta) implementation returns as empty: 97,804,288 bytes for one layer of width 1024 over 24
steps of 64, given as shape (0,). Its backward allocates scratch of its own that no op returns.
An account of the ops' outputs sees neither, and predicted examples/plain_loop 68-70 % low.

For these ops only, on a CPU, the kernel is run for real once per shape, on zeros of the fake
arguments' shapes and dtypes (the values are never read back), under the profiler: its outputs'
true sizes replace the fake ones, and what it held beyond its outputs while it ran is the
transient the account adds. This allocates that one layer's memory for the moment it runs, never
the model's. A GPU's RNN (cuDNN) is not measured here: a CPU has none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from runtime.memory import profiled_peak

_aten = torch.ops.aten
OPAQUE = frozenset({_aten.mkldnn_rnn_layer.default, _aten.mkldnn_rnn_layer_backward.default})

_MEASURED: dict[Any, tuple[list[tuple[int, ...]], int]] = {}


def _key(func: Any, args: Any, kwargs: Any) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), str(x.dtype))
        return tuple(x) if isinstance(x, list) else x

    return (str(func), tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in (kwargs or {}).items())))


def measured(func: Any, args: Any, kwargs: Any) -> tuple[list[tuple[int, ...]], int]:
    """(the outputs' true shapes, bytes held beyond the outputs while it ran), for `func` on
    arguments shaped like these; run once per shape (the caller has left fake mode)."""
    key = _key(func, args, kwargs)
    if key not in _MEASURED:
        _MEASURED[key] = _run(func, args, kwargs)
    return _MEASURED[key]


def extra(func: Any, args: Any, kwargs: Any) -> int:
    """What `measured` found the kernel held beyond its outputs (0 where it was not measured)."""
    return _MEASURED.get(_key(func, args, kwargs), ([], 0))[1]


def _run(func: Any, args: Any, kwargs: Any) -> tuple[list[tuple[int, ...]], int]:
    from torch.profiler import ProfilerActivity, profile

    def real(x: Any) -> Any:
        return torch.zeros(tuple(x.shape), dtype=x.dtype) if isinstance(x, torch.Tensor) else x

    real_args, real_kwargs = tree_map(real, (list(args), dict(kwargs or {})))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = func(*real_args, **real_kwargs)
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    peak, _ = profiled_peak(prof)
    held = sum(t.untyped_storage().nbytes() for t in outs)
    return [tuple(t.shape) for t in outs], max(0, peak - held)

"""Will it fit? A trainer's peak memory per rank, learnt from its own script before a GPU is rented.

`runtime.programs.memory` runs the user's own script (the leg's command: the real model at the
real size, the real optimizer, the real loop) until its second optimizer step ends, in one of two
ways, with LAUNCHER_MEMORY telling the Session and the framework adapters to stand aside (no
store, no checkpoint, no evidence: `stand_in.MemorySession`, `LegAdapter.memory`):

- `predict` (`fake`): every tensor is a FakeTensor (torch's FakeTensorMode: shapes, dtypes,
  devices, no storage), so a 7B-class geometry builds and steps on a laptop's CPU in seconds,
  allocating nothing. Our own account (runtime.memory.account) follows every storage the step
  creates and frees and files it under parameters, buffers, gradients, optimizer state,
  activations (forward) or temporaries (backward); its peak is the prediction. On several ranks each rank is predicted
  alone, as that rank, through torch's fake process group (no communication: DDP keeps full
  states on every rank, FSDP2 shards them by the world size it is told).
- `measure` (`measure`): the same steps run for real on this host's CPU, and the CPU allocator's
  own accounting gives the peak (c10's running total of every allocation and free, on every
  thread, as the profiler's memory events record it: `count_every_thread`, `profiled_peak`): the
  independent measurement the prediction is scored against (bench/memory_predict.py).

The second step matters: AdamW's state is created by the first `step()`, so the first forward and
backward run without it; the second holds parameters, optimizer state, activations and
gradients at once.

Why two optimizer steps and not "the first N": a script with gradient accumulation runs several
forwards and backwards per optimizer step; counting optimizer steps (a global post-hook) counts
the same on every loop, framework or not.
"""

from __future__ import annotations

import os
from typing import Any

from runtime import contract

PREDICT = "predict"
MEASURE = "measure"
MODES = (PREDICT, MEASURE)
OPTIMIZER_STEPS = 2
"""Optimizer steps a prediction or a measurement runs: the second is the first with optimizer state."""


def mode() -> str | None:
    """`predict` or `measure` under runtime.programs.memory; None on a leg."""
    value = os.environ.get(contract.MEMORY, "")
    return value if value in MODES else None


def count_every_thread() -> bool:
    """Have c10's CPU memory reporter keep its running total on every thread, not only on threads
    the profiler runs on (its `caffe2_report_cpu_memory_usage` flag, set through the C symbol; no
    Python API sets it). Without it a free made on another thread is lost: gloo's worker thread often
    drops the last reference to a collective's tensor, and the profiler then shows that tensor live
    to the end of the run (DDP's flattened parameters, FSDP2's gathered buffers: the "bimodal"
    peaks of several ranks were this). False where this torch does not export the flag."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True
    except (OSError, ValueError):
        return False
    return True


def profiled_peak(prof: Any) -> tuple[int, int]:
    """(peak bytes, allocations) from a torch profiler's memory events (`profile_memory=True`): the
    highest running total of CPU bytes c10's memory reporter gave at any allocation or free the
    profiler recorded, less what it held before the first; on every thread's frees where
    `count_every_thread()` was called first, else on the profiled threads' only."""
    from torch._C._profiler import _EventType

    events, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.total_allocated))
    if not events:
        return 0, 0
    events.sort()
    before = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - before, sum(1 for _, size, _ in events if size > 0)

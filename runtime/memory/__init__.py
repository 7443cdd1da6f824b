"""Will it fit? A trainer's peak memory per rank, learnt from its own script before a GPU is rented.

`runtime.programs.memory` runs the user's own script (the leg's command: the real model at the
real size, the real optimizer, the real loop) until its second optimizer step ends, in one of two
ways, with LAUNCHER_MEMORY telling the Session and the framework adapters to stand aside (no
store, no checkpoint, no evidence: `stand_in.MemorySession`, `LegAdapter.memory`):

- `predict` (`fake`): every tensor is a FakeTensor (torch's FakeTensorMode: shapes, dtypes,
  devices, no storage), so a 7B-class geometry builds and steps on a laptop's CPU in seconds,
  allocating nothing. torch's MemTracker follows every storage the step creates and frees and
  files it under parameters, buffers, gradients, optimizer state, activations (forward) or
  temporaries (backward); its peak is the prediction. On several ranks each rank is predicted
  alone, as that rank, through torch's fake process group (no communication: DDP keeps full
  states on every rank, FSDP2 shards them by the world size it is told).
- `measure` (`measure`): the same steps run for real on this host's CPU, and the CPU allocator's
  own accounting (the profiler's memory events: every allocation and free c10 makes) gives the
  peak: the independent measurement the prediction is scored against (bench/memory_predict.py).

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


def profiled_peak(prof: Any) -> tuple[int, int]:
    """(peak bytes, allocations) from a torch profiler's memory events (`profile_memory=True`): every
    CPU allocation and free c10 made while it ran, in time order, summed from where it started."""
    mem = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    mem = sorted((e for e in mem if str(e.device_type()).endswith("CPU")), key=lambda e: e.start_ns())
    now = peak = 0
    for e in mem:
        now += e.nbytes()
        peak = max(peak, now)
    return peak, sum(1 for e in mem if e.nbytes() > 0)

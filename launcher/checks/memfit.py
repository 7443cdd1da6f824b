"""Will it fit: a rank's predicted peak (runtime.programs.memory) plus what no prediction sees,
against the memory of the GPU asked for. docs/memory.md.

The prediction counts every tensor the step's ops make and free (the caching allocator's
`max_memory_allocated`, in effect). What it cannot see is added as an allowance, each part with
where its figure comes from:

- the CUDA context (the driver's, cuBLAS/cuDNN handles, loaded kernels): outside the caching
  allocator, so never in `max_memory_allocated`, always in the card's used memory;
- the allocator's reserve and fragmentation: `max_memory_reserved` over `max_memory_allocated`;
- NCCL's buffers on several ranks: cudaMalloc'd by NCCL itself, outside the allocator;
- the largest under-prediction this project has measured on a GPU so far (none until a GPU leg
  has measured its peak: then the allowance grows by it).

None of these figures was measured on a GPU here (no GPU was lent when they were written); each
says so, and the first GPU measurement replaces guesswork with the project's own error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIB = 2**20
GIB = 2**30

GPU_MEMORY_MIB: dict[str, int] = {
    "T4": 15360,
    "L4": 23034,
    "A10G": 23028,
    "V100": 16384,
    "V100-32GB": 32768,
    "A100": 40960,
    "A100-80GB": 81920,
    "L40S": 46068,
    "H100": 81559,
    "H200": 143771,
    "B200": 183359,
}
"""The memory a card shows CUDA (nvidia-smi's memory.total), by SkyPilot's accelerator name, as
public logs of each part print it (a T4's "16 GB" is 15360 MiB to CUDA). Not read from a device
here; scripts/gpu-efficiency.sh records the lent card's own total."""

CONTEXT_MIB = 512
"""The CUDA context, outside the caching allocator. Not measured here: torch 2.x with lazy module
loading (CUDA_MODULE_LOADING=LAZY, torch's default since 1.13 on CUDA >= 11.7) typically holds
300-500 MiB; 512 is the high end of that."""
RESERVE = 0.10
"""The caching allocator's reserve and fragmentation, as a share of the predicted peak. The one GPU
measurement on record (docs/reports/h200-probe: an H200, fp32, the GPT-2-small shape) reserved
9.5 % over its peak allocated; every GPU leg's `memory` event carries both peaks."""
NCCL_MIB = 256
"""NCCL's own buffers on each GPU of a world of several ranks (NCCL_BUFFSIZE, 4 MiB, per channel
and peer, allocated by NCCL itself). Not measured here."""


@dataclass(frozen=True)
class Allowance:
    """What the prediction cannot see, in bytes, each part named."""

    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{name} {gib(b)}" for name, b in self.parts.items() if b)


def allowance(peak: int, world_size: int, margin: float = 0.0) -> Allowance:
    """The allowance for a rank predicted at `peak` bytes in a world of `world_size`; `margin`: the
    largest under-prediction measured on a GPU in this project so far (0.1 = 10 %)."""
    parts = {
        "CUDA context": CONTEXT_MIB * MIB,
        f"allocator reserve {RESERVE:.0%}": int(peak * RESERVE),
        "NCCL buffers": NCCL_MIB * MIB if world_size > 1 else 0,
        f"largest GPU error so far {margin:.0%}": int(peak * margin),
    }
    return Allowance({k: v for k, v in parts.items() if v})


def gib(n: int | float) -> str:
    """Bytes as GiB (MiB under one GiB: a small model's parts are not all 0.00 GiB)."""
    return f"{n / GIB:,.2f} GiB" if abs(n) >= GIB else f"{n / MIB:,.1f} MiB"


def gpu_memory(gpu: str) -> int | None:
    """Bytes a card of SkyPilot type `gpu` ("T4", "a100-80gb") shows CUDA; None if not listed."""
    mib = GPU_MEMORY_MIB.get(gpu.strip().upper())
    return mib * MIB if mib is not None else None


@dataclass(frozen=True)
class Fit:
    """One rank's prediction against one GPU."""

    gpu: str
    capacity: int | None
    rank: int
    world_size: int
    peak: int
    categories: dict[str, int]
    allowance: Allowance

    @property
    def needed(self) -> int:
        return self.peak + self.allowance.total

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.needed <= self.capacity

    def line(self) -> str:
        """The numbers in one line: what the refusal, the dry run and `launcher memory` print."""
        big = sorted(((k, v) for k, v in self.categories.items() if v >= MIB), key=lambda kv: -kv[1])
        cats = ", ".join(f"{k} {gib(v)}" for k, v in big) or "all parts under 1 MiB"
        where = f"rank {self.rank} of {self.world_size}" if self.world_size > 1 else "the one rank"
        room = f"{self.gpu}'s {gib(self.capacity)}" if self.capacity is not None else f"{self.gpu} (memory not listed)"
        verdict = {True: "fits", False: "does not fit", None: "cannot be judged"}[self.fits]
        return (
            f"{where}: predicted peak {gib(self.peak)} ({cats}) + allowance {gib(self.allowance.total)} "
            f"({self.allowance.describe()}) = {gib(self.needed)} against {room}: {verdict}"
        )


def fits(gpu: str, results: list[dict[str, Any]], margin: float = 0.0) -> list[Fit]:
    """Each predicted rank (runtime.programs.memory's results) against a `gpu` card."""
    capacity = gpu_memory(gpu)
    out = []
    for r in results:
        peak, world = int(r["peak_bytes"]), int(r["world_size"])
        categories = {k: int(v) for k, v in r.get("categories", {}).items()}
        out.append(Fit(gpu.upper(), capacity, int(r["rank"]), world, peak, categories, allowance(peak, world, margin)))
    return out

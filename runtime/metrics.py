"""Throughput, ETA, memory and loss-continuity arithmetic: pure functions the
trainer emits and the launcher's checks and report reuse.

Sustained rate is counter-based over a long window (tokens consumed / wall
time between two step events), not a mean of per-step rates: the periodic
costs a short window misses (checkpoint saves, data stalls) are part of what
the run will really pay, and the first steps (allocator and kernel warm-up)
are left out. The guide's 20-step mean was 6 % optimistic for exactly these
two reasons.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

WARMUP_FRACTION = 0.1
MIN_WARMUP_STEPS = 20  # allocator/autotuner transients last ~15-20 steps (bench/sustained_rate.py)
SE_BLOCKS = 5


@dataclass(frozen=True)
class Rate:
    """A sustained throughput measured between two step events."""

    tok_s: float
    first_step: int
    last_step: int
    seconds: float
    rel_err: float | None = None
    """Standard error of the rate relative to it, from 5 equal blocks of the window
    (None when the window is too short): how far a reader may trust the figure."""

    @property
    def window_steps(self) -> int:
        return self.last_step - self.first_step


def warmup_steps(n_steps: int) -> int:
    """How many leading steps a window skips: 10 %, at least 20 (always leaving 2)."""
    return min(max(MIN_WARMUP_STEPS, int(n_steps * WARMUP_FRACTION)), max(0, n_steps - 2))


def sustained_rate(steps: Sequence[tuple[int, float, float]]) -> Rate | None:
    """(step, cumulative tokens, wall time) per step event -> the rate after warm-up.

    Counter-based: (tokens_last - tokens_first) / (t_last - t_first) over the
    window that starts after the warm-up steps."""
    if len(steps) < 3:
        return None
    window = steps[warmup_steps(len(steps)) :]
    first, last = window[0], window[-1]
    seconds = last[2] - first[2]
    if seconds <= 0 or last[1] <= first[1]:
        return None
    return Rate((last[1] - first[1]) / seconds, first[0], last[0], seconds, _block_rel_err(window))


def _block_rel_err(window: Sequence[tuple[int, float, float]]) -> float | None:
    if len(window) < 2 * SE_BLOCKS + 1:
        return None
    edges = [window[round(i * (len(window) - 1) / SE_BLOCKS)] for i in range(SE_BLOCKS + 1)]
    rates = [(b[1] - a[1]) / (b[2] - a[2]) for a, b in zip(edges, edges[1:]) if b[2] > a[2]]
    if len(rates) < 2:
        return None
    mean = sum(rates) / len(rates)
    var = sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)
    return (var / len(rates)) ** 0.5 / mean


def eta_seconds(rate: Rate, step: int, total_steps: int, tokens_per_step: float) -> float:
    """Seconds to reach `total_steps` from `step` at the sustained rate."""
    return max(0, total_steps - step) * tokens_per_step / rate.tok_s


@dataclass(frozen=True)
class Continuity:
    """Loss across a restart, against a noise band measured from the run itself."""

    delta: float
    """First resumed loss minus the last loss before the restart: the jump across it."""
    band: float
    """1.5 x the largest jump between two consecutive ordinary steps just before the restart."""
    window: int

    @property
    def ok(self) -> bool:
        return abs(self.delta) <= self.band


def loss_continuity(before: Sequence[float], after: Sequence[float], window: int = 10) -> Continuity | None:
    """Is the jump across the restart no bigger than the jumps between ordinary steps?

    The band is measured from the run itself, so it is wide while the loss falls
    steeply (early training) and narrow on a plateau; a model restored wrong
    (weights reset, another run's state) jumps far outside it. The first resumed
    loss is computed with the restored weights before any resumed update."""
    pre = list(before)[-window:]
    if len(pre) < 3 or not after:
        return None
    jumps = [abs(b - a) for a, b in zip(pre, pre[1:])]
    return Continuity(after[0] - pre[-1], max(1.5 * max(jumps), 1e-6), len(pre))


def host_rss_bytes() -> int:
    """Resident memory of this process (the 'device' memory of a CPU leg)."""
    with open(f"/proc/{os.getpid()}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

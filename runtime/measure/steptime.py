"""Where a step's time goes, measured without slowing the step; and its FLOPs.

`StepClock` charges host time to phases (`Session.lap("data")`, ...). On a GPU it
also records one CUDA event per lap -- no host sync: the events are read when the
step's own sync has already happened (the session reads the loss with `.item()`,
which waits for everything queued before it, optimizer included), and a step
whose events are not complete yet simply carries no device times. The old lap
called `torch.cuda.synchronize()` three times a step, which removed the very
CPU/GPU overlap it was measuring (bench/breakdown_overhead.py).

Host phases: what the trainer lapped (data, compute, optimizer, ...), `sync`
(the cross-rank all-reduces: the stop decision and the loss mean), `drain`
(the host waiting for the device to finish the step's queued work), `session`
(hashing the batch) and `other` (the trainer's code after its last lap).
Device phases (`gpu_phases`): the device's seconds between consecutive laps.

`FlopProbe` counts the leg's first step's FLOPs (runtime.measure.flops) and says which
dtype its products ran in and on what device.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from runtime.measure.flops import StepFlops, matmul_dtype


class StepClock:
    def __init__(self, device: str, enabled: bool = True) -> None:
        self.cuda = device.startswith("cuda") and enabled
        self.enabled = enabled
        self.laps: dict[str, float] = {}
        self._events: list[tuple[str, Any]] = []
        self._pool: list[Any] = []
        self._mark = self._t0 = time.perf_counter()

    def _event(self) -> Any:
        ev = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def start(self, sync_s: float, began: float) -> None:
        """The step begins (the stop decision took `sync_s` of it)."""
        self._t0 = began
        self.laps = {"sync": sync_s}
        self._mark = time.perf_counter()
        if self.cuda:
            self._pool.extend(ev for _, ev in self._events)
            self._events = [("", self._event())]

    def lap(self, phase: str) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self._mark
        self._mark = now
        if self.cuda:
            self._events.append((phase, self._event()))

    def charge(self, phase: str, seconds: float) -> None:
        self.laps[phase] = self.laps.get(phase, 0.0) + seconds

    def close_lapped(self) -> float:
        """The trainer's code after its last lap (`other`); returns now."""
        now = time.perf_counter()
        if self.enabled:
            self.charge("other", now - self._mark)
        self._mark = now
        return now

    def gpu_phases(self) -> dict[str, float] | None:
        """Device seconds per lapped phase, if the step's events are complete (never waits)."""
        if not self.cuda or len(self._events) < 2 or not self._events[-1][1].query():
            return None
        out: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self._events, self._events[1:]):
            out[phase] = out.get(phase, 0.0) + a.elapsed_time(b) / 1000.0
        return out


class FlopProbe:
    """Counts one step (the leg's first) and answers the `flops` event's fields."""

    def __init__(self, device: str, enabled: bool = True) -> None:
        self.device, self.pending = device, enabled
        self._counter: StepFlops | None = None

    def abandon(self) -> None:
        """running() again without a step between: that count is void."""
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None

    def begin(self) -> None:
        self.abandon()
        if self.pending:
            try:
                self._counter = StepFlops().__enter__()
            except Exception:  # noqa: BLE001 - no count rather than no training
                self.pending = False

    def end(self, tokens: int, world_size: int, step: int) -> dict[str, Any] | None:
        counter, self._counter = self._counter, None
        if counter is None:
            return None
        counter.__exit__(None, None, None)
        self.pending = False
        if not tokens or not counter.total:
            return {
                "step": step,
                "flops_per_token": None,
                "method": "counted",
                "note": "the step ran no counted product" if tokens else "the step reported no tokens",
            }
        dominant = counter.dominant_dtype() or "fp32"
        # every rank runs the same model on its share of the step's tokens
        return {
            "step": step,
            "flops_per_token": counter.total * world_size / tokens,
            "method": "counted",
            "by_dtype": dict(counter.by_dtype),
            "dtype": matmul_dtype(dominant, self.device),
            "device_name": device_name(self.device),
            "incomplete": counter.errors[:3] or None,
        }


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"

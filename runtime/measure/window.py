"""What the session prints once per metrics window (every `metrics_every` steps),
beside the per-step line:

- `memory`: this rank's allocated, reserved, peak allocated and peak reserved bytes since the last
  window (CUDA's allocator, or the host RSS on a CPU), and their MAX across ranks;
- `rate`: the sustained rate over the steps so far (runtime.metrics), the ETA to
  `total_steps`, and, once the leg's first step's FLOPs were counted, FLOP/s and
  MFU against the device's dense peak (runtime.peaks).
"""

from __future__ import annotations

from typing import Any

import torch

from runtime import events
from runtime.measure.flops import compiled_graphs
from runtime.measure.steptime import device_name
from runtime.metrics import host_rss_bytes, sustained_rate
from runtime.peaks import gpu_of_device_name, peak_flops
from runtime.session.world import World


def device_memory(device: str) -> tuple[int, int, int]:
    """(allocated, reserved, peak since the last call): a window, not a lifetime peak."""
    return device_memory_peaks(device)[:3]


def device_memory_peaks(device: str) -> tuple[int, int, int, int]:
    """(allocated, reserved, peak allocated, peak reserved) since the last call: the caching
    allocator's two peaks, what a memory prediction is scored against (docs/memory.md)."""
    if device.startswith("cuda"):
        out = (
            torch.cuda.memory_allocated(),
            torch.cuda.memory_reserved(),
            torch.cuda.max_memory_allocated(),
            torch.cuda.max_memory_reserved(),
        )
        torch.cuda.reset_peak_memory_stats()
        return out
    rss = host_rss_bytes()
    return rss, rss, rss, rss


def emit_memory(world: World, device: str, step: int) -> float:
    """The `memory` event (a collective: every rank calls it at the same step); the peak's MAX across ranks."""
    allocated, reserved, peak, peak_reserved = device_memory_peaks(device)
    peak_max = world.max(peak)
    events.emit(
        "memory",
        step=step,
        kind="cuda" if device.startswith("cuda") else "host_rss",
        allocated=allocated,
        reserved=reserved,
        peak=peak,
        allocated_max=world.max(allocated),
        reserved_max=world.max(reserved),
        peak_max=peak_max,
        peak_reserved=peak_reserved,
        peak_reserved_max=world.max(peak_reserved),
    )
    return peak_max


def emit_rate(
    world: World,
    device: str,
    step: int,
    history: list[tuple[int, float, float]],
    total_steps: int,
    flops_per_token: float | None,
    flops_dtype: str,
) -> None:
    """The `rate` event (main rank only) once `history` ((step, tokens since resume, time) per
    step) holds a sustained rate: tokens/s, the ETA and the efficiency at that rate."""
    rate = sustained_rate(history)
    if rate is None or not world.is_main:
        return
    per_step = (history[-1][1] - history[0][1]) / max(1, len(history) - 1)
    eta = max(0, total_steps - step) * per_step / rate.tok_s
    events.emit(
        "rate",
        step=step,
        tok_s=round(rate.tok_s, 1),
        window_first=rate.first_step,
        window_last=rate.last_step,
        seconds=round(rate.seconds, 3),
        rel_err=rate.rel_err,
        total_steps=total_steps,
        eta_s=round(eta, 1),
        **efficiency(rate.tok_s, flops_per_token, flops_dtype, device, world.world_size),
    )


def efficiency(tok_s: float, flops_per_token: float | None, dtype: str, device: str, world_size: int) -> dict[str, Any]:
    """FLOP/s at this rate and MFU against the device's dense peak (runtime.peaks); {} before
    the FLOPs are counted."""
    if not flops_per_token:
        return {}
    flop_s = tok_s * flops_per_token
    gpu = gpu_of_device_name(device_name(device)) if device.startswith("cuda") else None
    peak, why = peak_flops(gpu, dtype)
    out: dict[str, Any] = {
        "flops_per_token": round(flops_per_token, 1),
        "flop_s": round(flop_s, 1),
        "dtype": dtype,
        "compiled": compiled_graphs() > 0,
    }
    if peak is None:
        return {**out, "mfu": None, "mfu_note": why}
    return {**out, "mfu": round(flop_s / (peak * world_size), 5), "peak_flop_s": peak}

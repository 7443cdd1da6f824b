"""Headroom, the other way from the guard: where a run that fits spends compute to save memory it
does not need. Two statements, each said only where the script does the thing and the
prediction fits (where it does not fit, the refusal speaks):

- **Activation checkpointing.** The script checkpoints (runtime.memory.recompute counted the
  calls); the same prediction with checkpointing undone says whether it would fit without it.
  Either way it is said: the compute it costs (each checkpointed block's forward runs again in
  the backward), or that it is needed.
- **Gradient accumulation.** The script runs several backward passes per optimizer step; the
  prediction's account kept, at every moment, the peak with the activations and temporaries (what
  grows with the micro-batch) taken 2, 4, 8, 16, 32 times over (runtime.memory.account.SCALES):
  the largest multiple, up to the accumulation, that fits is a larger micro-batch with fewer
  accumulation steps for the same optimizer step. An estimate, linear in the micro-batch, and
  said as one.
"""

from __future__ import annotations

from typing import Any, Callable

from launcher.checks.memfit import Fit, fits, gib, gpu_memory

THIRD = "up to a third more of those blocks' compute per step: a forward is about a third of a forward and backward"


def headroom(
    ranks: list[dict[str, Any]], now: list[Fit], gpu: str, margin: float, undone: Callable[[], list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """The statements that apply, by name; `undone` predicts the same ranks with checkpointing undone."""
    if not ranks or not now or any(f.fits is not True for f in now):
        return {}
    out = {}
    ckpt = _checkpointing(ranks, now, gpu, margin, undone)
    if ckpt:
        out["checkpointing"] = ckpt
    micro = _micro_batch(ranks, gpu, margin)
    if micro:
        out["micro_batch"] = micro
    return out


def _checkpointing(
    ranks: list[dict[str, Any]], now: list[Fit], gpu: str, margin: float, undone: Callable[[], list[dict[str, Any]]]
) -> dict[str, Any] | None:
    calls = max(int(r.get("checkpointed") or 0) for r in ranks)
    if not calls:
        return None
    plain = fits(gpu, undone(), margin)
    if not plain:
        return None
    worst = max(plain, key=lambda f: f.needed)
    ok = all(f.fits for f in plain)
    peak = max(f.peak for f in now)
    said = (
        f"headroom: activation checkpointing is on ({calls} checkpointed calls in the first "
        f"{ranks[0].get('optimizer_steps')} optimizer steps); without it rank {worst.rank} would peak at "
        f"{gib(worst.peak)} (against {gib(peak)} with it), {gib(worst.needed)} with the allowance, against "
        f"{worst.gpu}'s {gib(worst.capacity or 0)}: "
    )
    said += (
        f"it fits without checkpointing, whose only effect here is compute: each checkpointed block's forward "
        f"runs again in the backward ({THIRD})"
        if ok
        else "it is needed (the run would not fit without it)"
    )
    return {"calls": calls, "peak": peak, "plain_peak": worst.peak, "plain_needed": worst.needed, "fits_without": ok,
            "line": said}  # fmt: skip


def _micro_batch(ranks: list[dict[str, Any]], gpu: str, margin: float) -> dict[str, Any] | None:
    steps = min(int(r.get("optimizer_steps") or 0) for r in ranks)
    accumulation = min(int(r.get("backwards") or 0) for r in ranks) // steps if steps else 0
    capacity = gpu_memory(gpu)
    if accumulation < 2 or capacity is None:
        return None
    best = None
    for m in sorted({int(k) for r in ranks for k in r.get("scaled_peaks") or {}}):
        if m > accumulation:
            break
        larger = fits(
            gpu, [{**r, "peak_bytes": int((r.get("scaled_peaks") or {}).get(str(m), 0))} for r in ranks], margin
        )
        if any(f.peak <= 0 or not f.fits for f in larger):
            break
        best = {"multiple": m, "peak": max(f.peak for f in larger), "needed": max(f.needed for f in larger)}
    if best is None:
        said = (
            f"headroom: gradient accumulation of {accumulation} micro-batches a step; a micro-batch twice this "
            f"one would not fit {gpu.upper()}'s {gib(capacity)} (an estimate): the accumulation is needed"
        )
        return {"accumulation": accumulation, "multiple": None, "line": said}
    m = best["multiple"]
    said = (
        f"headroom: gradient accumulation of {accumulation} micro-batches a step; a micro-batch {m}x this one "
        f"would peak at about {gib(best['peak'])}, {gib(best['needed'])} with the allowance, against "
        f"{gpu.upper()}'s {gib(capacity)}: it fits, so {m}x the micro-batch and {accumulation // m} accumulation "
        f"step(s) would make the same optimizer step in fewer, larger kernels (an estimate: the activations and "
        f"temporaries taken as growing in proportion to the micro-batch)"
    )
    return {"accumulation": accumulation, **best, "line": said}

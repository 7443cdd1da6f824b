"""The checkpoint cadence that loses the fewest GPU-hours, and whether a final push fits a
preemption notice: the arithmetic, from measured inputs (issue 33; sources and the worked
example in docs/notes-preemption.md).

Inputs, all seconds: C, what one checkpoint costs on the training's critical path; R, what
an interruption costs before the next leg trains again (relaunch, load, the first step);
M, the mean time between interruptions; tau, the compute between checkpoints (the cadence).
Interruptions are taken as Poisson, as Young (1974) and Daly (2006) do.

- Young's interval: sqrt(2 C M). Daly's higher-order one: sqrt(2 C M) (1 + sqrt(C/2M)/3 +
  (C/2M)/9) - C while C < 2M, else M.
- Goodput, the fraction of billed time that becomes kept training: to first order
  1 - (C/tau + (tau/2 + L + R)/M), where L is the seconds from a checkpoint's step to its
  *verified* mark (work since the newest verified checkpoint is what an interruption loses);
  under Daly's model, tau / (M e^(R/M) (e^((tau+C)/M) - 1)) (with L = 0: it has no upload).
- Billed time for the same kept work is kept / goodput: the difference between two cadences,
  times the GPUs and the price, is what the cadence is worth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from launcher.errors import ConfigError

NOTICE_S: dict[str, float] = {"aws": 110.0, "gcp": 25.0, "azure": 25.0, "k8s": 0.0}
"""`--notice` presets: the seconds a trainer has between the notice and the kill. Our estimates,
not SkyPilot's figures: the provider's notice (AWS 120 s, GCP 30 s, Azure 30 s at least) minus a
5 s metadata poll and a 5 s margin; Kubernetes 0, since SkyPilot 0.14.1 delivers the pod's
SIGTERM to its own agent, not to the trainer (docs/notes-preemption.md, sections 1-2)."""


@dataclass(frozen=True)
class SpotConfig:
    """launcher.yaml `spot:`: what the report's cadence arithmetic assumes about interruptions."""

    mtbf_hours: float | None = None
    """Mean hours between interruptions of one instance (the report divides by the instances a
    leg holds). Null: the provider's published figure (launcher.report.notice.MTBF_HOURS: AWS
    3650, GCP 160, Azure 160 as a placeholder), which is optimistic for GPU spot capacity."""

    def __post_init__(self) -> None:
        m = self.mtbf_hours
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.01 <= m <= 1e7):
            raise ConfigError("spot.mtbf_hours", f"must be 0.01 to 10000000 hours, got {m!r}")


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")


def young(c: float, m: float) -> float:
    """Young's first-order optimum interval between checkpoints, seconds."""
    _positive(c=c, m=m)
    return math.sqrt(2.0 * c * m)


def daly(c: float, m: float) -> float:
    """Daly's higher-order optimum interval, seconds (M itself once C >= 2M)."""
    _positive(c=c, m=m)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def goodput_first_order(tau: float, c: float, r: float, m: float, lag: float = 0.0) -> float:
    """1 - waste: checkpoints C/tau, and per interruption half an interval, the lag to verified
    and the restart, (tau/2 + lag + R)/M. Never below 0."""
    _positive(tau=tau, c=c, m=m)
    if r < 0 or lag < 0:
        raise ValueError("restart and lag seconds must not be negative")
    return max(0.0, 1.0 - (c / tau + (tau / 2.0 + lag + r) / m))


def goodput(tau: float, c: float, r: float, m: float) -> float:
    """Daly's expected goodput at interval tau: tau / (M e^(R/M) (e^((tau+C)/M) - 1))."""
    _positive(tau=tau, c=c, m=m)
    if r < 0:
        raise ValueError("restart seconds must not be negative")
    return tau / (m * math.exp(r / m) * math.expm1((tau + c) / m))


@dataclass(frozen=True)
class Cadence:
    """The current cadence against Young's, for `kept_hours` of training on `gpus` GPUs."""

    c: float
    r: float
    m: float
    tau_now: float
    tau_young: float
    tau_daly: float
    goodput_now: float
    goodput_young: float
    billed_gpu_hours_now: float
    billed_gpu_hours_young: float
    usd_difference: float | None

    @property
    def gpu_hours_difference(self) -> float:
        """GPU-hours the current cadence bills beyond Young's for the same kept training."""
        return self.billed_gpu_hours_now - self.billed_gpu_hours_young


def compare(
    c: float,
    r: float,
    m: float,
    tau_now: float,
    kept_hours: float,
    gpus: int,
    usd_per_gpu_hour: float | None = None,
    lag: float = 0.0,
) -> Cadence:
    """The report's cadence section: both intervals, first-order goodput at each (with the lag
    to verified), and what the difference bills."""
    if kept_hours <= 0 or gpus <= 0:
        raise ValueError("kept hours and GPUs must be positive")
    tau_y = young(c, m)
    now, best = goodput_first_order(tau_now, c, r, m, lag), goodput_first_order(tau_y, c, r, m, lag)
    billed_now = math.inf if now == 0 else kept_hours * gpus / now
    billed_best = math.inf if best == 0 else kept_hours * gpus / best
    usd = None if usd_per_gpu_hour is None else (billed_now - billed_best) * usd_per_gpu_hour
    return Cadence(c, r, m, tau_now, tau_y, daly(c, m), now, best, billed_now, billed_best, usd)


def fits_notice(final_path_s: float, notice_s: float) -> tuple[bool, float]:
    """Does the final checkpoint (snapshot + write + push + verify, measured) reach verified
    inside the notice? (fits, margin in seconds: negative when it does not)."""
    if final_path_s < 0 or notice_s < 0:
        raise ValueError("seconds must not be negative")
    margin = notice_s - final_path_s
    return margin >= 0, margin


def notice_warning(request: Any, preflight: dict[str, Any] | None, pick: Any) -> list[str]:
    """The run on sky is spot first: warn when the passing report's final checkpoint does not fit
    a preemption notice (of the pick's cloud, where SkyPilot named one; else of any provider).
    `request` is the launch's launcher.plan.Request; the dry run and the launch show the same line."""
    notice = (preflight or {}).get("notice")
    if request.rung.name != "run" or request.backend != "sky" or not notice:
        return []
    cloud = str(pick.cloud).lower() if pick is not None else None
    short = [
        f
        for f in notice["per_provider"]
        if f["notice_s"] > 0 and not f["fits"] and (cloud is None or f["provider"] == cloud)
    ]
    if not short:
        return []
    names = " or ".join(f"{f['label']}'s ({f['notice_s']:g} s)" for f in short)
    lost = (
        f"; a preemption there loses up to {notice['lost_steps_max']:,} steps at the current cadence"
        if notice.get("lost_steps_max")
        else ""
    )
    return [
        f"warning: on spot, the final checkpoint needs {notice['needed_s']:.1f} s ({notice['run']} leg "
        f"{notice['leg']}): it does not fit {names} notice{lost}"
    ]

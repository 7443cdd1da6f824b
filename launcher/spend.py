"""Quota periods and the pre-launch arithmetic (what a rung would cost, what is left)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from launcher.config import WEEKDAYS, Config, GpuSpec
from launcher.ladder import Rung
from launcher.ledger import Ledger


def period_start(cfg: Config, now: datetime | None = None) -> datetime | None:
    """Start (UTC) of the quota period containing `now`; None when the quota has no period."""
    now = now or datetime.now(timezone.utc)
    if cfg.quota.period == "none":
        return None
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if cfg.quota.period == "month":
        return midnight.replace(day=1)
    back = (now.weekday() - WEEKDAYS.index(cfg.quota.reset_weekday)) % 7
    return midnight - timedelta(days=back)


@dataclass(frozen=True)
class Projection:
    """The arithmetic `up --dry-run` prints before anything is launched."""

    rung_gpu_hours: float
    used_gpu_hours: float
    quota_gpu_hours: float | None
    period_from: datetime | None
    legs: int
    budget_minutes: float
    gpus: int
    nodes: int

    @property
    def remaining(self) -> float | None:
        return None if self.quota_gpu_hours is None else self.quota_gpu_hours - self.used_gpu_hours

    @property
    def fits(self) -> bool:
        return self.remaining is None or self.rung_gpu_hours <= self.remaining

    def describe(self) -> str:
        cost = (f"{self.legs} legs x {self.budget_minutes:g} min x {self.gpus} GPUs x {self.nodes} nodes = "
                f"{self.rung_gpu_hours:.2f} GPU-h at most")
        if self.quota_gpu_hours is None:
            return cost + "; no GPU-hour quota configured"
        since = self.period_from.strftime("%Y-%m-%d") if self.period_from else "ever"
        verdict = "fits" if self.fits else "does NOT fit"
        return (f"{cost}; quota {self.quota_gpu_hours:g} GPU-h, used {self.used_gpu_hours:.2f} since {since}, "
                f"remaining {self.remaining:.2f}: {verdict}")


def used_gpu_hours(ledger: Ledger | None, since: datetime | None) -> float:
    if ledger is None:
        return 0.0
    start = since.timestamp() if since else 0.0
    return sum(r["billed_gpu_hours"] or 0.0 for r in ledger.runs() if r["started_at"] >= start)


def project(cfg: Config, ledger: Ledger | None, rung: Rung, gpus: GpuSpec | None, nodes: int) -> Projection:
    rung_cfg = cfg.rung(rung.name) if rung.name != "static" else None
    minutes = rung_cfg.budget_minutes if rung_cfg else 0.0
    count = gpus.count if gpus else 0
    hours = rung.legs * minutes / 60.0 * count * nodes
    since = period_start(cfg)
    return Projection(hours, used_gpu_hours(ledger, since), cfg.quota.gpu_hours, since, rung.legs, minutes, count,
                      nodes)

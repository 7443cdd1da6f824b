"""Quota periods and the pre-launch arithmetic (what a rung would cost, what is left):
the policy of what may be spent. What was spent and what is held is the ledger's
(launcher.ledger.db); a dead launcher's hold is settled by launcher.ops.reconcile."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from launcher.config.schema import WEEKDAYS, Config, GpuSpec
from launcher.errors import Refused
from launcher.ladder import Rung
from launcher.ledger.db import Ledger
from launcher.ops.reconcile import clean_up, end_dead_runs, process_start, settle_dead


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
        cost = (
            f"{self.legs} legs x {self.budget_minutes:g} min x {self.gpus} GPUs x {self.nodes} nodes = "
            f"{self.rung_gpu_hours:.2f} GPU-h at most"
        )
        if self.quota_gpu_hours is None:
            return cost + "; no GPU-hour quota configured"
        since = self.period_from.strftime("%Y-%m-%d") if self.period_from else "ever"
        verdict = "fits" if self.fits else "does NOT fit"
        return (
            f"{cost}; quota {self.quota_gpu_hours:g} GPU-h, used {self.used_gpu_hours:.2f} since {since}, "
            f"remaining {self.remaining:.2f}: {verdict}"
        )


def used_gpu_hours(ledger: Ledger | None, since: datetime | None) -> float:
    """Billed plus still-reserved GPU-hours in the period."""
    if ledger is None:
        return 0.0
    used, _, held, _ = ledger.period_totals(since)
    return used + held


def project(cfg: Config, ledger: Ledger | None, rung: Rung, gpus: GpuSpec | None, nodes: int) -> Projection:
    rung_cfg = cfg.rung(rung.name) if rung.name != "static" else None
    minutes = rung_cfg.budget_minutes if rung_cfg else 0.0
    count = gpus.count if gpus else 0
    hours = rung.legs * minutes / 60.0 * count * nodes
    since = period_start(cfg)
    return Projection(
        hours, used_gpu_hours(ledger, since), cfg.quota.gpu_hours, since, rung.legs, minutes, count, nodes
    )


# --- the guard: check and reserve in one transaction ---------------------------


@dataclass(frozen=True)
class Reservation:
    id: int
    gpu_hours: float
    usd: float
    arithmetic: str
    remaining_gpu_hours: float | None


@dataclass(frozen=True)
class QuotaDecision:
    """The quota guard's answer for one rung: what it reserves, the arithmetic, and the
    refusal (None: it fits, or `--allow-overdraft` lets it over, recorded as an overdraft)."""

    gpu_hours: float
    usd: float
    arithmetic: str
    overdraft: bool
    remaining_gpu_hours: float | None
    refusal: Refused | None


def _free(cfg: Config, used: float, used_usd: float, held: float, held_usd: float, price: float | None) -> float:
    """GPU-hours the quota and the USD budget still allow (inf: no cap)."""
    free = math.inf
    if cfg.quota.gpu_hours is not None:
        free = cfg.quota.gpu_hours - used - held
    if cfg.quota.budget_usd is not None and price:
        free = min(free, (cfg.quota.budget_usd - used_usd - held_usd) / price)
    return free


def decide(
    cfg: Config,
    totals: tuple[float, float, float, float],
    proj: Projection,
    price: float | None,
    allow_overdraft: bool,
    at_least: float | None = None,
) -> QuotaDecision:
    """The guard's arithmetic on the period's (used, used USD, held, held USD): used + reserved
    + this rung against the quota and the USD budget. The one place it is decided: `reserve`
    applies it inside its transaction, `preview` (the launch plan, the dry run) in one rolled back.

    `at_least` (GPU-hours; the run): when the rung does not fit, reserve what is left
    instead, provided it is at least this much (the run's legs then stop at the quota)."""
    used, used_usd, held, held_usd = totals
    free = _free(cfg, used, used_usd, held, held_usd, price)
    capped = at_least is not None and not allow_overdraft and at_least <= free < proj.rung_gpu_hours
    if capped:
        proj = dataclasses.replace(proj, rung_gpu_hours=free)
    usd = proj.rung_gpu_hours * (price or 0.0)
    total = used + held + proj.rung_gpu_hours
    since = proj.period_from.strftime("%Y-%m-%d") if proj.period_from else "all time"
    line = (
        f"used {used:.2f} + reserved {held:.2f} + this rung {proj.rung_gpu_hours:.2f} "
        f"({proj.legs} legs x {proj.budget_minutes:g} min x {proj.gpus} GPUs x {proj.nodes} nodes) "
        f"= {total:.2f} GPU-h"
    )
    quota = cfg.quota.gpu_hours
    over = []
    if quota is not None and total > quota + 1e-9:
        over.append(f"{line} > quota {quota:g} GPU-h (period from {since})")
    budget = cfg.quota.budget_usd
    if budget is not None and used_usd + held_usd + usd > budget + 1e-9:
        over.append(
            f"${used_usd:.2f} + ${held_usd:.2f} + ${usd:.2f} = ${used_usd + held_usd + usd:.2f} > budget ${budget:g}"
        )
    refusal = None
    if over and not allow_overdraft:
        refusal = Refused(
            "quota: " + "; ".join(over),
            hint="wait for the next period, lower the rung's budget, or pass --allow-overdraft (recorded)",
        )
    arithmetic = f"{line} <= quota {quota:g} GPU-h" if quota is not None else f"{line}; no GPU-hour quota"
    if capped:
        arithmetic += "; the run holds what is left: its legs stop at the quota with a final checkpoint"
    if over:  # recorded as an overdraft when --allow-overdraft lets it through; else what the refusal says
        arithmetic = ("OVERDRAFT: " if allow_overdraft else "over: ") + "; ".join(over)
    remaining = None if quota is None else max(0.0, quota - used - held)
    return QuotaDecision(proj.rung_gpu_hours, usd, arithmetic, bool(over), remaining, refusal)


def reserve(
    cfg: Config,
    ledger: Ledger,
    run_id: str,
    rung: str,
    proj: Projection,
    price: float | None,
    allow_overdraft: bool,
    at_least: float | None = None,
) -> Reservation:
    """The guard. Reconcile, decide (`decide`) and reserve — one BEGIN IMMEDIATE transaction,
    so concurrent launchers never reserve more than the quota. Refuses with exit 3,
    arithmetic in one line."""
    with ledger.transaction():
        dead = settle_dead(ledger)
        got = decide(cfg, ledger.period_totals(proj.period_from), proj, price, allow_overdraft, at_least)
        if got.refusal is not None:
            raise got.refusal
        rid = ledger.reserve(
            run_id,
            rung,
            socket.gethostname(),
            os.getpid(),
            process_start(os.getpid()),
            got.gpu_hours,
            got.usd,
            got.overdraft,
            got.arithmetic,
        )
    clean_up(dead, ledger)
    return Reservation(int(rid), got.gpu_hours, got.usd, got.arithmetic, got.remaining_gpu_hours)


def preview(
    cfg: Config,
    ledger: Ledger | None,
    proj: Projection,
    price: float | None,
    allow_overdraft: bool,
    at_least: float | None = None,
) -> QuotaDecision:
    """What `reserve` would decide now, written nowhere: the reconciliation and the totals in a
    transaction that is rolled back (no ledger: nothing used or held yet)."""
    if ledger is None:
        return decide(cfg, (0.0, 0.0, 0.0, 0.0), proj, price, allow_overdraft, at_least)
    with ledger.rolled_back():
        settle_dead(ledger)
        return decide(cfg, ledger.period_totals(proj.period_from), proj, price, allow_overdraft, at_least)


@dataclass(frozen=True)
class LegGrant:
    """What the quota lets the run's next leg spend."""

    gpu_hours: float
    """GPU-hours the leg may bill (inf: no cap)."""
    billed_gpu_hours: float
    """What the run's legs billed so far."""
    left_gpu_hours: float
    """What the quota and budget still allow in the period, this run's bills counted (inf: no cap)."""


def hold_leg(
    cfg: Config,
    ledger: Ledger,
    reservation_id: int,
    run_id: str,
    want_gpu_hours: float,
    price: float | None,
    allow_overdraft: bool = False,
) -> LegGrant:
    """Before each leg of the run: the run's reservation becomes what its legs billed plus
    this leg's share, at most what the quota and budget still allow once every other
    launcher's bills and holds are counted (one transaction, like `reserve`)."""
    since = period_start(cfg)
    with ledger.transaction():
        billed, billed_usd = ledger.legs_billed(run_id)
        used, used_usd, held, held_usd = ledger.period_totals(since)
        mine = ledger.reservation(reservation_id)
        others, others_usd = held - mine["gpu_hours"], held_usd - mine["usd"]
        left = _free(cfg, used + billed, used_usd + billed_usd, others, others_usd, price)
        grant = want_gpu_hours if allow_overdraft else max(0.0, min(want_gpu_hours, left))
        hold = billed + (grant if math.isfinite(grant) else 0.0)
        ledger.set_hold(reservation_id, hold, billed_usd + (grant * (price or 0.0) if math.isfinite(grant) else 0.0))
    return LegGrant(grant, float(billed), left)


def settle(ledger: Ledger, reservation_id: int, run_id: str) -> None:
    """Replace the reservation with what the run's legs billed."""
    with ledger.transaction():
        billed, usd = ledger.legs_billed(run_id)
        ledger.settle_reservation(reservation_id, billed, usd, "billed")


def summary(cfg: Config, ledger: Ledger, gpus: GpuSpec | None, nodes: int = 1) -> dict[str, Any]:
    """`launcher spend`: the period's used / reserved / remaining, by rung, and what each rung would cost."""
    from launcher.ladder import RUNGS

    reconciled = len(end_dead_runs(ledger))
    since = period_start(cfg)
    used, used_usd, held, held_usd = ledger.period_totals(since)
    by_rung = ledger.spend_by_rung(since)
    quota = cfg.quota.gpu_hours
    remaining = None if quota is None else quota - used - held
    price = cfg.prices.get(gpus.name) if gpus else None
    next_rungs = []
    for rung in RUNGS[1:]:
        spec = gpus if rung.needs_gpu else None
        proj = project(cfg, ledger, rung, spec, nodes if rung.needs_gpu else 1)
        next_rungs.append(
            {
                "rung": rung.name,
                "gpu_hours": round(proj.rung_gpu_hours, 4),
                "usd": None if price is None else round(proj.rung_gpu_hours * price, 4),
                "fits": remaining is None or proj.rung_gpu_hours <= remaining + 1e-9,
                "arithmetic": proj.describe(),
            }
        )
    return {
        "period": cfg.quota.period,
        "period_from": since.isoformat() if since else None,
        "quota_gpu_hours": quota,
        "used_gpu_hours": round(used, 4),
        "reserved_gpu_hours": round(held, 4),
        "remaining_gpu_hours": None if remaining is None else round(remaining, 4),
        "budget_usd": cfg.quota.budget_usd,
        "used_usd": round(used_usd, 4),
        "reserved_usd": round(held_usd, 4),
        "by_rung": by_rung,
        "next": next_rungs,
        "reconciled_now": reconciled,
    }

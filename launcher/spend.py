"""Quota periods and the pre-launch arithmetic (what a rung would cost, what is left)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

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
    """Billed plus still-reserved GPU-hours in the period."""
    if ledger is None:
        return 0.0
    used, _, held, _ = period_totals(ledger.conn, since)
    return used + held


def project(cfg: Config, ledger: Ledger | None, rung: Rung, gpus: GpuSpec | None, nodes: int) -> Projection:
    rung_cfg = cfg.rung(rung.name) if rung.name != "static" else None
    minutes = rung_cfg.budget_minutes if rung_cfg else 0.0
    count = gpus.count if gpus else 0
    hours = rung.legs * minutes / 60.0 * count * nodes
    since = period_start(cfg)
    return Projection(hours, used_gpu_hours(ledger, since), cfg.quota.gpu_hours, since, rung.legs, minutes, count,
                      nodes)


# --- the guard: check and reserve in one transaction ---------------------------

@dataclass(frozen=True)
class Reservation:
    id: int
    gpu_hours: float
    usd: float
    arithmetic: str
    remaining_gpu_hours: float | None


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether a process of this machine is alive (one owned by another user counts);
    given its start time, a reused pid is not it."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OverflowError:
        return False
    return started is None or process_start(pid) in (None, started)


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    from launcher.backends.leash import proc_stat

    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _alive(host: str, pid: int, started: int | None) -> bool:
    import socket

    if host != socket.gethostname():
        return True  # another machine's launcher: not ours to judge
    return pid_alive(pid, started)


@dataclass(frozen=True)
class DeadRun:
    """A run whose launcher died: ended in the ledger now; its legs are cleaned up after."""

    run_id: str
    legs: list[dict[str, Any]]


def reconcile(db: Any) -> list[DeadRun]:
    """End what a dead launcher left: settle its reservation with what its legs billed
    where they ended, else with the full reservation (the instance may have run to its
    budget); close its open legs and the run ("launcher died"), at the last sign of life
    (its newest log line). The caller removes what the legs left (launcher.reconcile)."""
    import os
    import time

    stale = [r for r in db.execute("SELECT * FROM reservations WHERE settled_at IS NULL").fetchall()
             if not _alive(r["host"], r["pid"], r["pid_start"])]
    dead = []
    for r in stale:
        legs = [dict(leg) for leg in db.execute("SELECT * FROM legs WHERE run_id=?", (r["run_id"],)).fetchall()]
        open_legs = [leg for leg in legs if leg["ended_at"] is None]
        billed = sum(leg["billed_gpu_hours"] or 0.0 for leg in legs)
        usd = sum(leg["cost_usd"] or 0.0 for leg in legs)
        if open_legs:  # a leg never recorded its end: assume it ran to its budget
            billed, usd = max(billed, r["gpu_hours"]), max(usd, r["usd"])
        db.execute("UPDATE reservations SET settled_at=?, settled_gpu_hours=?, settled_usd=?, settled_how=? "
                   "WHERE id=?", (time.time(), billed, usd, "reconciled (launcher died)", r["id"]))
        last_sign = max([r["created_at"]] + [leg["ended_at"] or leg["started_at"] for leg in legs]
                        + [os.path.getmtime(leg["log_path"]) for leg in legs if os.path.isfile(leg["log_path"])])
        for leg in open_legs:
            db.execute("UPDATE legs SET ended_at=?, killed=1, end_reason='launcher died' WHERE run_id=? AND leg=?",
                       (last_sign, r["run_id"], leg["leg"]))
        db.execute("UPDATE runs SET billed_gpu_hours=COALESCE(billed_gpu_hours, ?), cost_usd=COALESCE(cost_usd, ?), "
                   "ended_at=COALESCE(ended_at, ?), verdict=COALESCE(verdict, 'launcher died') WHERE id=?",
                   (billed, usd, last_sign, r["run_id"]))
        dead.append(DeadRun(r["run_id"], open_legs))
    return dead


def period_totals(db: Any, since: datetime | None) -> tuple[float, float, float, float]:
    """(used GPU-h, used USD, reserved GPU-h, reserved USD) in the period."""
    start = since.timestamp() if since else 0.0
    used, used_usd = db.execute(
        "SELECT COALESCE(SUM(billed_gpu_hours), 0), COALESCE(SUM(cost_usd), 0) FROM runs "
        "WHERE started_at >= ? AND billed_gpu_hours IS NOT NULL", (start,)).fetchone()  # ended or reconciled
    held, held_usd = db.execute(
        "SELECT COALESCE(SUM(gpu_hours), 0), COALESCE(SUM(usd), 0) FROM reservations WHERE settled_at IS NULL"
    ).fetchone()
    return float(used), float(used_usd), float(held), float(held_usd)


def _free(cfg: Config, used: float, used_usd: float, held: float, held_usd: float, price: float | None) -> float:
    """GPU-hours the quota and the USD budget still allow (inf: no cap)."""
    free = math.inf
    if cfg.quota.gpu_hours is not None:
        free = cfg.quota.gpu_hours - used - held
    if cfg.quota.budget_usd is not None and price:
        free = min(free, (cfg.quota.budget_usd - used_usd - held_usd) / price)
    return free


def reserve(cfg: Config, ledger: Ledger, run_id: str, rung: str, proj: Projection, price: float | None,
            allow_overdraft: bool, at_least: float | None = None) -> Reservation:
    """The guard. Reconcile, check used + reserved + this rung against the quota and
    the USD budget, and reserve — one BEGIN IMMEDIATE transaction, so concurrent
    launchers never reserve more than the quota. Refuses with exit 3, arithmetic in one line.

    `at_least` (GPU-hours; the run): when the rung does not fit, reserve what is left
    instead, provided it is at least this much (the run's legs then stop at the quota)."""
    import os
    import socket
    import time

    from launcher.errors import Refused

    with ledger.transaction() as db:
        dead = reconcile(db)
        used, used_usd, held, held_usd = period_totals(db, proj.period_from)
        free = _free(cfg, used, used_usd, held, held_usd, price)
        capped = at_least is not None and not allow_overdraft and at_least <= free < proj.rung_gpu_hours
        if capped:
            proj = dataclasses.replace(proj, rung_gpu_hours=free)
        usd = proj.rung_gpu_hours * (price or 0.0)
        total = used + held + proj.rung_gpu_hours
        since = proj.period_from.strftime("%Y-%m-%d") if proj.period_from else "all time"
        line = (f"used {used:.2f} + reserved {held:.2f} + this rung {proj.rung_gpu_hours:.2f} "
                f"({proj.legs} legs x {proj.budget_minutes:g} min x {proj.gpus} GPUs x {proj.nodes} nodes) "
                f"= {total:.2f} GPU-h")
        quota = cfg.quota.gpu_hours
        over = []
        if quota is not None and total > quota + 1e-9:
            over.append(f"{line} > quota {quota:g} GPU-h (period from {since})")
        budget = cfg.quota.budget_usd
        if budget is not None and used_usd + held_usd + usd > budget + 1e-9:
            over.append(f"${used_usd:.2f} + ${held_usd:.2f} + ${usd:.2f} = ${used_usd + held_usd + usd:.2f} "
                        f"> budget ${budget:g}")
        if over and not allow_overdraft:
            raise Refused("quota: " + "; ".join(over), hint="wait for the next period, lower the rung's budget, "
                          "or pass --allow-overdraft (recorded)")
        arithmetic = (f"{line} <= quota {quota:g} GPU-h" if quota is not None else f"{line}; no GPU-hour quota")
        if capped:
            arithmetic += "; the run holds what is left: its legs stop at the quota with a final checkpoint"
        if over:
            arithmetic = "OVERDRAFT: " + "; ".join(over)
        rid = db.execute(
            "INSERT INTO reservations (run_id, rung, created_at, host, pid, pid_start, gpu_hours, usd, overdraft, "
            "arithmetic) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rung, time.time(), socket.gethostname(), os.getpid(), process_start(os.getpid()),
             proj.rung_gpu_hours, usd, int(bool(over)), arithmetic)).lastrowid
    from launcher.reconcile import clean_up

    clean_up(dead, ledger)
    remaining = None if quota is None else max(0.0, quota - used - held)
    return Reservation(int(rid), proj.rung_gpu_hours, usd, arithmetic, remaining)


@dataclass(frozen=True)
class LegGrant:
    """What the quota lets the run's next leg spend."""

    gpu_hours: float
    """GPU-hours the leg may bill (inf: no cap)."""
    billed_gpu_hours: float
    """What the run's legs billed so far."""
    left_gpu_hours: float
    """What the quota and budget still allow in the period, this run's bills counted (inf: no cap)."""


def hold_leg(cfg: Config, ledger: Ledger, reservation_id: int, run_id: str, want_gpu_hours: float,
             price: float | None, allow_overdraft: bool = False) -> LegGrant:
    """Before each leg of the run: the run's reservation becomes what its legs billed plus
    this leg's share, at most what the quota and budget still allow once every other
    launcher's bills and holds are counted (one transaction, like `reserve`)."""
    since = period_start(cfg)
    with ledger.transaction() as db:
        billed, billed_usd = db.execute("SELECT COALESCE(SUM(billed_gpu_hours), 0), COALESCE(SUM(cost_usd), 0) "
                                        "FROM legs WHERE run_id=?", (run_id,)).fetchone()
        used, used_usd, held, held_usd = period_totals(db, since)
        mine = db.execute("SELECT gpu_hours, usd FROM reservations WHERE id=?", (reservation_id,)).fetchone()
        others, others_usd = held - mine["gpu_hours"], held_usd - mine["usd"]
        left = _free(cfg, used + billed, used_usd + billed_usd, others, others_usd, price)
        grant = want_gpu_hours if allow_overdraft else max(0.0, min(want_gpu_hours, left))
        hold = billed + (grant if math.isfinite(grant) else 0.0)
        db.execute("UPDATE reservations SET gpu_hours=?, usd=? WHERE id=?",
                   (hold, billed_usd + (grant * (price or 0.0) if math.isfinite(grant) else 0.0), reservation_id))
    return LegGrant(grant, float(billed), left)


def settle(ledger: Ledger, reservation_id: int, run_id: str) -> None:
    """Replace the reservation with what the run's legs billed."""
    import time

    with ledger.transaction() as db:
        billed, usd = db.execute("SELECT COALESCE(SUM(billed_gpu_hours), 0), COALESCE(SUM(cost_usd), 0) FROM legs "
                                 "WHERE run_id=?", (run_id,)).fetchone()
        db.execute("UPDATE reservations SET settled_at=?, settled_gpu_hours=?, settled_usd=?, settled_how='billed' "
                   "WHERE id=?", (time.time(), billed, usd, reservation_id))


def settle_leg(ledger: Ledger, run_id: str, leg: int, ended_at: float, reason: str,
               granularity_s: float = 60.0) -> None:
    """A dead launcher's leg, once its end is known (its cluster downed now, or SkyPilot's
    record): billed from its start to then, at the price it was launched at; the run and
    its reservation settled again with the sum of the run's legs."""
    import time

    from launcher.backends.base import billed_seconds

    with ledger.transaction() as db:
        row = db.execute("SELECT l.started_at, l.hourly_usd, r.gpu_count, r.nodes FROM legs l "
                         "JOIN runs r ON r.id = l.run_id WHERE l.run_id=? AND l.leg=?", (run_id, leg)).fetchone()
        if row is None:
            return
        seconds = billed_seconds(max(0.0, ended_at - row["started_at"]), granularity_s) * row["nodes"]
        hours = seconds / 3600.0 * row["gpu_count"]
        usd = None if row["hourly_usd"] is None else seconds / 3600.0 * row["hourly_usd"]
        db.execute("UPDATE legs SET ended_at=?, billed_gpu_hours=?, cost_usd=COALESCE(?, cost_usd), end_reason=? "
                   "WHERE run_id=? AND leg=?", (ended_at, hours, usd, reason, run_id, leg))
        billed, cost = db.execute("SELECT COALESCE(SUM(billed_gpu_hours), 0), SUM(cost_usd) FROM legs "
                                  "WHERE run_id=?", (run_id,)).fetchone()
        db.execute("UPDATE runs SET billed_gpu_hours=?, cost_usd=? WHERE id=?", (billed, cost, run_id))
        db.execute("UPDATE reservations SET settled_at=?, settled_gpu_hours=?, settled_usd=?, settled_how=? "
                   "WHERE run_id=?", (time.time(), billed, cost or 0.0,
                                      "reconciled (launcher died; billed to the cluster's end)", run_id))


def summary(cfg: Config, ledger: Ledger, gpus: GpuSpec | None, nodes: int = 1) -> dict[str, Any]:
    """`launcher spend`: the period's used / reserved / remaining, by rung, and what each rung would cost."""
    from launcher.ladder import RUNGS

    from launcher.reconcile import end_dead_runs

    reconciled = len(end_dead_runs(ledger))
    since = period_start(cfg)
    used, used_usd, held, held_usd = period_totals(ledger.conn, since)
    start = since.timestamp() if since else 0.0
    by_rung = {r["rung"]: {"gpu_hours": r["h"], "usd": r["usd"], "runs": r["n"]} for r in ledger.conn.execute(
        "SELECT rung, COALESCE(SUM(billed_gpu_hours), 0) AS h, COALESCE(SUM(cost_usd), 0) AS usd, COUNT(*) AS n "
        "FROM runs WHERE started_at >= ? GROUP BY rung ORDER BY rung", (start,)).fetchall()}
    quota = cfg.quota.gpu_hours
    remaining = None if quota is None else quota - used - held
    price = cfg.prices.get(gpus.name) if gpus else None
    next_rungs = []
    for rung in RUNGS[1:]:
        spec = gpus if rung.needs_gpu else None
        proj = project(cfg, ledger, rung, spec, nodes if rung.needs_gpu else 1)
        next_rungs.append({"rung": rung.name, "gpu_hours": round(proj.rung_gpu_hours, 4),
                           "usd": None if price is None else round(proj.rung_gpu_hours * price, 4),
                           "fits": remaining is None or proj.rung_gpu_hours <= remaining + 1e-9,
                           "arithmetic": proj.describe()})
    return {"period": cfg.quota.period, "period_from": since.isoformat() if since else None,
            "quota_gpu_hours": quota, "used_gpu_hours": round(used, 4), "reserved_gpu_hours": round(held, 4),
            "remaining_gpu_hours": None if remaining is None else round(remaining, 4),
            "budget_usd": cfg.quota.budget_usd, "used_usd": round(used_usd, 4), "reserved_usd": round(held_usd, 4),
            "by_rung": by_rung, "next": next_rungs, "reconciled_now": reconciled}

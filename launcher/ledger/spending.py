"""The Ledger's spending statements (`Spending`, the base class launcher.ledger.db.Ledger
inherits them from): the quota's reservations held, grown and settled; what runs and legs
billed, in a period and by rung; and what a dead launcher left unrecorded (its legs and run
ended, a leg billed again once its cluster's end is known). Only the SQL of spending: what may
be spent is launcher.ops.spend's policy.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from typing import Callable, ContextManager

from launcher.ledger.rows import LegBilling, PeriodTotals, ReservationRow, RungSpend


def period_totals(db: sqlite3.Connection, since: datetime | None) -> PeriodTotals:
    """(used GPU-h, used USD, reserved GPU-h, reserved USD) in the period from `since`
    (None: all time): what the runs billed, plus every reservation not yet settled."""
    start = since.timestamp() if since else 0.0
    used, used_usd = db.execute(
        "SELECT COALESCE(SUM(billed_gpu_hours), 0), COALESCE(SUM(cost_usd), 0) FROM runs "
        "WHERE started_at >= ? AND billed_gpu_hours IS NOT NULL",
        (start,),
    ).fetchone()  # ended or reconciled
    held, held_usd = db.execute(
        "SELECT COALESCE(SUM(gpu_hours), 0), COALESCE(SUM(usd), 0) FROM reservations WHERE settled_at IS NULL"
    ).fetchone()
    return PeriodTotals(float(used), float(used_usd), float(held), float(held_usd))


class Spending:
    """The spending statements of the Ledger (which opens `_db` and gives `transaction`)."""

    _db: sqlite3.Connection
    transaction: Callable[[], ContextManager[sqlite3.Connection]]

    # --- spending: reservations and bills (the policy is launcher.ops.spend's) --------

    def period_totals(self, since: datetime | None) -> PeriodTotals:
        """Billed and still-reserved GPU-hours and USD in the period from `since`."""
        return period_totals(self._db, since)

    def spend_by_rung(self, since: datetime | None) -> dict[str, RungSpend]:
        """Each rung's bills and run count since `since` (None: all time)."""
        start = since.timestamp() if since else 0.0
        return {
            r["rung"]: {"gpu_hours": r["h"], "usd": r["usd"], "runs": r["n"]}
            for r in self._db.execute(
                "SELECT rung, COALESCE(SUM(billed_gpu_hours), 0) AS h, COALESCE(SUM(cost_usd), 0) AS usd, COUNT(*) AS n "
                "FROM runs WHERE started_at >= ? GROUP BY rung ORDER BY rung",
                (start,),
            ).fetchall()
        }

    def run_holds(self, run_id: str) -> tuple[float, float]:
        """(GPU-hours the run's unsettled reservations hold, GPU-hours its run row billed)."""
        held = self._db.execute(
            "SELECT COALESCE(SUM(gpu_hours), 0) FROM reservations WHERE run_id=? AND settled_at IS NULL", (run_id,)
        ).fetchone()[0]
        own = self._db.execute("SELECT COALESCE(billed_gpu_hours, 0) FROM runs WHERE id=?", (run_id,)).fetchone()
        return held, (own[0] if own else 0.0)

    def legs_billed(self, run_id: str) -> tuple[float, float]:
        """(GPU-hours, USD) the run's legs billed so far."""
        billed, usd = self._db.execute(
            "SELECT COALESCE(SUM(billed_gpu_hours), 0), COALESCE(SUM(cost_usd), 0) FROM legs WHERE run_id=?", (run_id,)
        ).fetchone()
        return billed, usd

    def any_unsettled(self) -> bool:
        """Whether any reservation is held (one indexed read)."""
        return self._db.execute("SELECT 1 FROM reservations WHERE settled_at IS NULL LIMIT 1").fetchone() is not None

    def unsettled_reservations(self) -> list[ReservationRow]:
        return [dict(r) for r in self._db.execute("SELECT * FROM reservations WHERE settled_at IS NULL").fetchall()]

    def reservation(self, reservation_id: int) -> ReservationRow:
        return dict(self._db.execute("SELECT * FROM reservations WHERE id=?", (reservation_id,)).fetchone())

    def reserve(
        self,
        run_id: str,
        rung: str,
        host: str,
        pid: int,
        pid_start: int | None,
        gpu_hours: float,
        usd: float,
        overdraft: bool,
        arithmetic: str,
    ) -> int:
        """Hold GPU-hours and USD for a run; returns the reservation's id."""
        with self.transaction() as db:
            return int(
                db.execute(
                    "INSERT INTO reservations (run_id, rung, created_at, host, pid, pid_start, gpu_hours, usd, overdraft, "
                    "arithmetic) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, rung, time.time(), host, pid, pid_start, gpu_hours, usd, int(overdraft), arithmetic),
                ).lastrowid
            )

    def set_hold(self, reservation_id: int, gpu_hours: float, usd: float) -> None:
        with self.transaction() as db:
            db.execute("UPDATE reservations SET gpu_hours=?, usd=? WHERE id=?", (gpu_hours, usd, reservation_id))

    def settle_reservation(self, reservation_id: int, gpu_hours: float, usd: float, how: str) -> None:
        """Replace the hold with what was spent; `how`: billed | reconciled (...)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE reservations SET settled_at=?, settled_gpu_hours=?, settled_usd=?, settled_how=? WHERE id=?",
                (time.time(), gpu_hours, usd, how, reservation_id),
            )

    def settle_run_reservations(self, run_id: str, gpu_hours: float, usd: float, how: str) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE reservations SET settled_at=?, settled_gpu_hours=?, settled_usd=?, settled_how=? "
                "WHERE run_id=?",
                (time.time(), gpu_hours, usd, how, run_id),
            )

    # --- what a dead launcher left -------------------------------------------------

    def end_orphan_leg(self, run_id: str, leg: int, ended_at: float) -> None:
        """A leg whose launcher died before recording its end: killed, "launcher died"."""
        with self.transaction() as db:
            db.execute(
                "UPDATE legs SET ended_at=?, killed=1, end_reason='launcher died' WHERE run_id=? AND leg=?",
                (ended_at, run_id, leg),
            )

    def end_orphan_run(self, run_id: str, gpu_hours: float, usd: float, ended_at: float) -> None:
        """End a dead launcher's run where it is still open; what it recorded stays."""
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET billed_gpu_hours=COALESCE(billed_gpu_hours, ?), "
                "cost_usd=COALESCE(cost_usd, ?), ended_at=COALESCE(ended_at, ?), "
                "verdict=COALESCE(verdict, 'launcher died') WHERE id=?",
                (gpu_hours, usd, ended_at, run_id),
            )

    def leg_billing(self, run_id: str, leg: int) -> LegBilling | None:
        row = self._db.execute(
            "SELECT l.started_at, l.hourly_usd, r.gpu_count, r.nodes FROM legs l "
            "JOIN runs r ON r.id = l.run_id WHERE l.run_id=? AND l.leg=?",
            (run_id, leg),
        ).fetchone()
        return None if row is None else dict(row)

    def rebill_leg(
        self,
        run_id: str,
        leg: int,
        ended_at: float,
        gpu_hours: float,
        usd: float | None,
        reason: str,
        billed_s: float | None = None,
    ) -> tuple[float, float | None]:
        """Bill a leg to `ended_at` and the run to the sum of its legs; returns (GPU-h, USD) of the run."""
        with self.transaction() as db:
            db.execute(
                "UPDATE legs SET ended_at=?, billed_gpu_hours=?, cost_usd=COALESCE(?, cost_usd), "
                "billed_s=?, end_reason=? WHERE run_id=? AND leg=?",
                (ended_at, gpu_hours, usd, billed_s, reason, run_id, leg),
            )
            billed, cost = db.execute(
                "SELECT COALESCE(SUM(billed_gpu_hours), 0), SUM(cost_usd) FROM legs WHERE run_id=?", (run_id,)
            ).fetchone()
            db.execute("UPDATE runs SET billed_gpu_hours=?, cost_usd=? WHERE id=?", (billed, cost, run_id))
        return billed, cost

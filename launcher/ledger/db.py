"""The SQLite ledger: every run, leg, reviewed-file hash, command line and
billed GPU-hour. Every SQL statement of the launcher is here or in the Ledger's
spending side, launcher.ledger.spending (the tables and their migrations in
launcher.ledger.schema; what reads return in launcher.ledger.rows);
launcher.ops.spend decides what may be spent, this records it.

WAL mode, one transaction per fact: a kill -9 at any moment leaves either no
row or a complete one (SQLite's atomic commit does the work; nothing here
writes a row in two steps). A run row is complete when inserted: it holds every
launch fact; its end columns stay NULL until the run ends, which is how a run
whose launcher died reads ("running", never ended).
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator

from launcher.errors import Refused
from launcher.ledger.holders import OPENED, describe_holders
from launcher.ledger.rows import (
    LEG_NUMBERS,
    RUN_NUMBERS,
    ImageRow,
    LegRow,
    Review,
    RunRow,
    StopRow,
    clean,
    json_or_none,
)
from launcher.ledger.schema import SCHEMA_VERSION, create_or_migrate
from launcher.ledger.spending import Spending

LOCK_WAIT_S = 5.0
"""How long a command waits for another launcher's write before it says who holds the ledger."""


class Ledger(Spending):
    """The project's ledger at `<state_dir>/ledger.db`: `with Ledger(path) as ledger:`
    closes it on the way out (or call `close`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        OPENED.append(path)
        self._db = sqlite3.connect(path, timeout=LOCK_WAIT_S, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise Refused(
                f"ledger {path} has schema v{version}; this launcher reads up to v{SCHEMA_VERSION}",
                hint="upgrade preflight-launcher",
            )
        self._db.execute("PRAGMA foreign_keys=ON")
        if version == SCHEMA_VERSION:
            return  # nothing to write: a reader never waits on another launcher's write lock
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self.transaction() as db:
            create_or_migrate(db, version)

    @classmethod
    def open_existing(cls, path: Path) -> "Ledger | None":
        """Open the ledger if one exists; reading never creates one."""
        if path.exists() and not path.is_file():
            raise Refused(f"{path} is not a ledger file", hint="move it aside; the ledger is a SQLite file")
        return cls(path) if path.is_file() else None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, for read-only queries (writes go through `transaction`)."""
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: all of it lands, or none of it. Inside a transaction
        already open on this ledger it is part of that one (which commits or rolls back)."""
        if self._db.in_transaction:
            yield self._db
            return
        self._begin()
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _begin(self) -> None:
        """BEGIN IMMEDIATE: the write lock, or a one-line refusal naming who holds it."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                raise Refused(
                    f"the ledger {self.path} is locked{describe_holders(self.path)} (waited {LOCK_WAIT_S:g} s)",
                    hint="wait for it to finish, or stop it, then run this again",
                ) from None
            raise

    @contextmanager
    def rolled_back(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... ROLLBACK, always: what a transaction would decide, with nothing
        written (the dry run's quota guard runs the real one's reconciliation and arithmetic).
        A `transaction` inside it is part of it, and rolled back with it."""
        if self._db.in_transaction:
            raise RuntimeError("rolled_back() inside a transaction would undo the enclosing one")
        self._begin()
        try:
            yield self._db
        finally:
            self._db.execute("ROLLBACK")

    # --- reviews -------------------------------------------------------------

    def record_review(self, digest: str, files: dict[str, str]) -> int:
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO reviews (created_at, digest, files) VALUES (?, ?, ?)",
                (time.time(), digest, json.dumps(files, sort_keys=True)),
            )
            return int(cur.lastrowid)

    def latest_review(self) -> Review | None:
        row = self._db.execute("SELECT * FROM reviews ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        return Review(row["id"], row["created_at"], row["digest"], json.loads(row["files"]))

    # --- runs and legs -------------------------------------------------------

    def begin_run(self, run: dict[str, Any], files: dict[str, str]) -> None:
        """Insert the run row and the hash of every file it runs, atomically."""
        cols = ", ".join(run)
        marks = ", ".join("?" for _ in run)
        with self.transaction() as db:
            db.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", tuple(run.values()))
            db.executemany(
                "INSERT INTO run_files (run_id, path, sha256) VALUES (?, ?, ?)",
                [(run["id"], p, h) for p, h in sorted(files.items())],
            )

    def begin_leg(self, leg: dict[str, Any]) -> None:
        row = dict(leg, command=json.dumps(leg["command"]), env=json.dumps(leg["env"], sort_keys=True))
        if row.get("nodes") is not None:
            row["nodes"] = json.dumps(row["nodes"])
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.transaction() as db:
            db.execute(f"INSERT INTO legs ({cols}) VALUES ({marks})", tuple(row.values()))

    NOTED = ("request_id", "instance", "hourly_usd", "cost_source", "watchdog")

    def note_leg(self, run_id: str, leg: int, **fields: Any) -> None:
        """What a leg learned after it began: its request's id, the managed job's id as its
        instance, the price of the resources it landed on, what its watchdog saw."""
        if not fields or not set(fields) <= set(self.NOTED):
            raise ValueError(f"note_leg: only {self.NOTED}, got {sorted(fields)}")
        sets = ", ".join(f"{k}=?" for k in fields)
        with self.transaction() as db:
            db.execute(f"UPDATE legs SET {sets} WHERE run_id=? AND leg=?", (*fields.values(), run_id, leg))

    def end_leg(
        self,
        run_id: str,
        leg: int,
        *,
        ended_at: float,
        exit_code: int | None,
        killed: bool,
        end_reason: str,
        billed_gpu_hours: float,
        cost_usd: float | None,
        cost_source: str | None = None,
        placement: dict[str, str] | None = None,
        nodes: list[dict[str, Any]] | None = None,
        billed_s: float | None = None,
    ) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE legs SET ended_at=?, exit_code=?, killed=?, end_reason=?, billed_gpu_hours=?, cost_usd=?,"
                " billed_s=?, cost_source=COALESCE(?, cost_source), placement=COALESCE(?, placement),"
                " nodes=COALESCE(?, nodes) WHERE run_id=? AND leg=?",
                (
                    ended_at,
                    exit_code,
                    int(killed),
                    end_reason,
                    billed_gpu_hours,
                    cost_usd,
                    billed_s,
                    cost_source,
                    json.dumps(placement, sort_keys=True) if placement else None,
                    json.dumps(nodes) if nodes else None,
                    run_id,
                    leg,
                ),
            )

    def add_checks(self, run_id: str, checks: list[dict[str, Any]]) -> None:
        with self.transaction() as db:
            start = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM checks WHERE run_id=?", (run_id,)).fetchone()[0]
            db.executemany(
                "INSERT INTO checks (run_id, seq, name, ok, detail, evidence, kind, leg, facts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        start + i,
                        c["name"],
                        int(c["ok"]),
                        c["detail"],
                        json.dumps(c.get("evidence", [])),
                        c.get("kind"),
                        c.get("leg"),
                        json.dumps(c.get("facts") or {}),
                    )
                    for i, c in enumerate(checks)
                ],
            )

    def end_run(self, run_id: str, *, ended_at: float, exit_code: int, verdict: str, cost_source: str) -> None:
        """Close the run; its billed GPU-hours and cost are the sum of its legs'."""
        with self.transaction() as db:
            billed, cost = db.execute(
                "SELECT COALESCE(SUM(billed_gpu_hours), 0), SUM(cost_usd) FROM legs WHERE run_id=?", (run_id,)
            ).fetchone()
            legs = sorted(
                {
                    r[0]
                    for r in db.execute(
                        "SELECT DISTINCT cost_source FROM legs WHERE run_id=? AND cost_source IS NOT NULL", (run_id,)
                    )
                }
            )
            if legs:  # what the legs were priced by, where they say
                cost_source = " + ".join(legs)
            db.execute(
                "UPDATE runs SET ended_at=?, exit_code=?, verdict=?, billed_gpu_hours=?, cost_usd=?,"
                " cost_source=? WHERE id=?",
                (ended_at, exit_code, verdict, billed, cost, cost_source, run_id),
            )

    # --- reading -------------------------------------------------------------

    def runs(self, limit: int | None = None, run_id: str | None = None) -> list[RunRow]:
        """Runs, newest first, each with its legs, files and checks. A row damaged by hand
        (a JSON column that does not parse, a number that is text) is read as far as it
        goes: the bad value becomes None and the row says so under `damaged`."""
        sql, args = "SELECT * FROM runs", ()
        if run_id is not None:
            sql, args = sql + " WHERE id=?", (run_id,)
        sql += " ORDER BY started_at DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        out = []
        for row in self._db.execute(sql, args).fetchall():
            run = self._run_head(row)
            rid = row["id"]
            run["legs"] = [
                self._leg_row(dict(r))
                for r in self._db.execute("SELECT * FROM legs WHERE run_id=? ORDER BY leg", (rid,))
            ]
            run["checks"] = [
                clean(dict(r, ok=bool(r["ok"]), facts=r["facts"] or "{}"), ("leg",), {"evidence": list, "facts": dict})
                for r in self._db.execute("SELECT * FROM checks WHERE run_id=? ORDER BY seq", (rid,))
            ]
            out.append(run)
        return out

    def _run_head(self, row: Any) -> dict[str, Any]:
        """A run row read as `runs` reads it, with its files; its legs and checks left to the caller."""
        run = clean(dict(row), RUN_NUMBERS, {})
        run["preflight"] = json_or_none(run.get("preflight"))
        files = self._db.execute("SELECT path, sha256 FROM run_files WHERE run_id=? ORDER BY path", (row["id"],))
        run["files"] = {str(r["path"]): str(r["sha256"]) for r in files}
        return run

    @staticmethod
    def _leg_row(row: dict[str, Any]) -> LegRow:
        leg = clean(row, LEG_NUMBERS, {"command": list, "env": dict})
        leg["killed"] = bool(leg["killed"])
        leg["placement"] = json_or_none(leg.get("placement"))
        leg["nodes"] = json_or_none(leg.get("nodes"))
        leg["watchdog"] = json_or_none(leg.get("watchdog"))
        return leg

    def straight_legs(self, project: str, limit: int = 20) -> list[tuple[RunRow, LegRow]]:
        """The project's straight-through legs that ended, newest first, each with its run (legs and
        checks left out, its files in): the candidates a CPU drill may reuse as its oracle
        (launcher.rungs.oracle decides which, if any, is provably its own straight run)."""
        rows = self._db.execute(
            "SELECT l.* FROM legs l JOIN runs r ON r.id = l.run_id WHERE r.project=? AND l.role='straight'"
            f" AND l.ended_at IS NOT NULL ORDER BY l.started_at DESC LIMIT {int(limit)}",
            (project,),
        ).fetchall()
        out = []
        for leg in rows:
            run = self._run_head(self._db.execute("SELECT * FROM runs WHERE id=?", (leg["run_id"],)).fetchone())
            out.append((run | {"legs": [], "checks": []}, self._leg_row(dict(leg))))
        return out

    def leg_records(self, run_id: str) -> list[LegRow]:
        """The run's legs, read as `runs` reads them."""
        return [self._leg_row(dict(r)) for r in self._db.execute("SELECT * FROM legs WHERE run_id=?", (run_id,))]

    # --- graceful stops ---------------------------------------------------------

    def request_stop(self, run_id: str, leg: int | None, timeout_s: float) -> int:
        with self.transaction() as db:
            return int(
                db.execute(
                    "INSERT INTO stops (run_id, leg, requested_at, timeout_s) VALUES (?, ?, ?, ?)",
                    (run_id, leg, time.time(), timeout_s),
                ).lastrowid
            )

    def stop_requested(self, run_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM stops WHERE run_id=? LIMIT 1", (run_id,)).fetchone() is not None

    def end_stop(self, stop_id: int, **fields: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in fields)
        with self.transaction() as db:
            db.execute(f"UPDATE stops SET ended_at=?, {cols} WHERE id=?", (time.time(), *fields.values(), stop_id))

    def stops(self, run_id: str) -> list[StopRow]:
        return [dict(r) for r in self._db.execute("SELECT * FROM stops WHERE run_id=? ORDER BY id", (run_id,))]

    # --- images --------------------------------------------------------------

    def record_image(self, image: dict[str, Any]) -> int:
        row = dict(image, files=json.dumps(image["files"], sort_keys=True))
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.transaction() as db:
            return int(db.execute(f"INSERT INTO images ({cols}) VALUES ({marks})", tuple(row.values())).lastrowid)

    def set_pushed(self, image_row: int, ref: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE images SET pushed_ref=? WHERE id=?", (ref, image_row))

    def images(self, files_digest: str | None = None) -> list[ImageRow]:
        """Built images, newest first (only those baked from `files_digest` if given)."""
        sql, args = "SELECT * FROM images", ()
        if files_digest is not None:
            sql, args = sql + " WHERE files_digest=?", (files_digest,)
        rows = self._db.execute(sql + " ORDER BY id DESC", args).fetchall()
        return [dict(r, files=json.loads(r["files"])) for r in rows]

    def integrity_ok(self) -> bool:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

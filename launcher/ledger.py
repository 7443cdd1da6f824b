"""The SQLite ledger: every run, leg, reviewed-file hash, command line and
billed GPU-hour.

WAL mode, one transaction per fact: a kill -9 at any moment leaves either no
row or a complete one (SQLite's atomic commit does the work; nothing here
writes a row in two steps). A run row is complete when inserted: it holds every
launch fact; its end columns stay NULL until the run ends, which is how a run
whose launcher died reads ("running", never ended).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 8
# Forward migrations, applied in order to ledgers written by older versions.
MIGRATIONS = {
    2: ["ALTER TABLE runs ADD COLUMN image TEXT"],
    3: ["ALTER TABLE legs ADD COLUMN task_sha256 TEXT"],
    4: ["ALTER TABLE legs ADD COLUMN pid INTEGER"],  # the stops table is created whole by SCHEMA
    5: ["ALTER TABLE reservations ADD COLUMN pid_start INTEGER"],
    6: ["ALTER TABLE legs ADD COLUMN role TEXT"],
    7: ["ALTER TABLE legs ADD COLUMN hourly_usd REAL", "ALTER TABLE legs ADD COLUMN cost_source TEXT",
        "ALTER TABLE legs ADD COLUMN placement TEXT"],
    8: ["ALTER TABLE runs ADD COLUMN preflight TEXT"],
}
LOCK_WAIT_S = 5.0
"""How long a command waits for another launcher's write before it says who holds the ledger."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS reviews (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at  REAL NOT NULL,
    digest      TEXT NOT NULL,
    files       TEXT NOT NULL              -- JSON {path: sha256}
);
CREATE TABLE IF NOT EXISTS runs (
    id          TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    rung        TEXT NOT NULL,
    backend     TEXT NOT NULL,
    gpu_name    TEXT,
    gpu_count   INTEGER NOT NULL,
    nodes       INTEGER NOT NULL,
    store_uri   TEXT NOT NULL,
    review_id   INTEGER REFERENCES reviews(id),
    files_digest TEXT NOT NULL,
    config_sha256 TEXT NOT NULL,
    started_at  REAL NOT NULL,
    ended_at    REAL,
    exit_code   INTEGER,
    verdict     TEXT,                      -- pass | fail | error (NULL while running)
    billed_gpu_hours REAL,
    cost_usd    REAL,
    cost_source TEXT,                      -- config prices | catalog | none
    image       TEXT,                      -- image id (sha256:...) the legs ran, docker/sky backends
    preflight   TEXT                       -- rung run: JSON, the report that let it launch or why it skipped one
);
CREATE TABLE IF NOT EXISTS reservations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    rung        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,          -- the launcher holding it: a dead pid = a stale reservation
    pid_start   INTEGER,                   -- that process's start time (clock ticks since boot): a reused pid is not it
    gpu_hours   REAL NOT NULL,
    usd         REAL NOT NULL,
    overdraft   INTEGER NOT NULL DEFAULT 0,
    arithmetic  TEXT NOT NULL,             -- the guard's line, as printed
    settled_at  REAL,
    settled_gpu_hours REAL,
    settled_usd REAL,
    settled_how TEXT                       -- billed | reconciled (launcher died)
);
CREATE TABLE IF NOT EXISTS images (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tag         TEXT NOT NULL,
    image_id    TEXT NOT NULL,             -- sha256:... as the engine names it
    base        TEXT NOT NULL,
    lock        TEXT NOT NULL,
    files_digest TEXT NOT NULL,
    files       TEXT NOT NULL,             -- JSON {path: sha256}: what is baked into /app
    runtime_digest TEXT NOT NULL,
    built_at    REAL NOT NULL,
    seconds     REAL NOT NULL,
    pushed_ref  TEXT                       -- repo@sha256:... once pushed
);
CREATE TABLE IF NOT EXISTS run_files (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    path        TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    PRIMARY KEY (run_id, path)
);
CREATE TABLE IF NOT EXISTS legs (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    leg         INTEGER NOT NULL,
    backend     TEXT NOT NULL,
    instance    TEXT NOT NULL,             -- local dir / container / cluster name
    command     TEXT NOT NULL,             -- JSON list: the exact argv
    env         TEXT NOT NULL,             -- JSON {name: value}, secrets redacted
    log_path    TEXT NOT NULL,
    started_at  REAL NOT NULL,
    ended_at    REAL,
    exit_code   INTEGER,
    killed      INTEGER NOT NULL DEFAULT 0,
    end_reason  TEXT,
    billed_gpu_hours REAL,
    cost_usd    REAL,
    task_sha256 TEXT,                      -- the rendered SkyPilot task YAML (sky backend)
    pid         INTEGER,                   -- local backend: the leg's process (group) id, for `launcher stop`
    role        TEXT,                      -- NULL for a leg of the run timeline, straight for the uninterrupted reference run
    hourly_usd  REAL,                      -- one instance per hour, host VM included, where the backend priced it (sky)
    cost_source TEXT,                      -- skypilot optimizer | config prices | none
    placement   TEXT,                      -- JSON {cloud, region, zone, instance_type}: where the leg ran (sky)
    PRIMARY KEY (run_id, leg)
);
CREATE TABLE IF NOT EXISTS stops (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs(id),
    leg         INTEGER,                   -- the leg signalled (NULL: between legs)
    requested_at REAL NOT NULL,            -- from here on the run launches no new leg
    timeout_s   REAL NOT NULL,
    ended_at    REAL,
    outcome     TEXT,                      -- graceful | killed after timeout | no leg running (NULL: in progress)
    final_step  INTEGER,                   -- the step the leg stopped at
    checkpoint  TEXT,                      -- newest verified checkpoint in the store afterwards
    verified    INTEGER,
    loadable    INTEGER,                   -- fetched whole, hashes matched, state deserialized
    detail      TEXT
);
CREATE TABLE IF NOT EXISTS checks (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    ok          INTEGER NOT NULL,
    detail      TEXT NOT NULL,
    evidence    TEXT NOT NULL,             -- JSON list of pointers {leg, line, text}
    PRIMARY KEY (run_id, seq)
);
"""


OPENED: list[Path] = []
"""Ledgers this process opened: an error about a locked one can then say who holds it."""


def lock_holders(path: Path) -> list[tuple[int, str]]:
    """(pid, command line) of processes holding a POSIX lock on the ledger or its WAL files
    (Linux /proc/locks; [] elsewhere)."""
    inodes = set()
    for p in (path, path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        try:
            st = p.stat()
        except OSError:
            continue
        inodes.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    holders: dict[int, str] = {}
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.replace("->", "").split()
        try:
            pid, dev = int(parts[4]), parts[5].split(":")
            key = (int(dev[0], 16), int(dev[1], 16), int(dev[2]))
        except (IndexError, ValueError):
            continue
        if key in inodes and pid != os.getpid():
            found.append((parts[3] == "WRITE", pid))
    writers = {pid for write, pid in found if write}  # in WAL mode only a writer blocks a writer
    for pid in sorted(writers or {pid for _, pid in found}):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        holders[pid] = cmd[:160]
    return sorted(holders.items())


def describe_holders(path: Path) -> str:
    found = lock_holders(path)
    return (" by " + "; ".join(f"pid {pid} ({cmd})" for pid, cmd in found)) if found else ""


RUN_NUMBERS = ("gpu_count", "nodes", "started_at", "ended_at", "exit_code", "billed_gpu_hours", "cost_usd")
LEG_NUMBERS = ("leg", "started_at", "ended_at", "exit_code", "billed_gpu_hours", "cost_usd", "pid", "killed",
               "hourly_usd")


def _clean(row: dict[str, Any], numbers: tuple[str, ...], json_cols: dict[str, type]) -> dict[str, Any]:
    """A row as readers expect it; what was damaged is set to None (or empty) and named."""
    damaged = []
    for col in numbers:
        value = row.get(col)
        if value is not None and (isinstance(value, (bytes, str)) or value != value):
            damaged.append(col)
            row[col] = None
    for col, kind in json_cols.items():
        try:
            value = json.loads(row[col])
            if not isinstance(value, kind):
                raise ValueError
            row[col] = value
        except (TypeError, ValueError, RecursionError):
            damaged.append(col)
            row[col] = kind()
    for col in ("id", "run_id", "rung", "backend", "instance", "log_path", "verdict", "files_digest"):
        if col in row and row[col] is not None and not isinstance(row[col], str):
            damaged.append(col)
            row[col] = str(row[col])
    if damaged:
        row["damaged"] = damaged
    return row


def _json_or_none(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Review:
    """A recorded `launcher review`: the reviewed files and their sha256."""

    id: int
    created_at: float
    digest: str
    files: dict[str, str]


class Ledger:
    """The project's ledger at `<state_dir>/ledger.db`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        OPENED.append(path)
        self._db = sqlite3.connect(path, timeout=LOCK_WAIT_S, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            from launcher.errors import Refused

            raise Refused(f"ledger {path} has schema v{version}; this launcher reads up to v{SCHEMA_VERSION}",
                          hint="upgrade preflight-launcher")
        self._db.execute("PRAGMA foreign_keys=ON")
        if version == SCHEMA_VERSION:
            return  # nothing to write: a reader never waits on another launcher's write lock
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self.transaction():
            fresh = self._db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name='runs'").fetchone()[0] == 0
            if not fresh:
                for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                    for stmt in MIGRATIONS[target]:
                        # ALTER TABLE <table> ADD COLUMN <col>: a missing table is created whole below,
                        # a column already there is left as it is
                        table, column = stmt.split()[2], stmt.split()[5]
                        cols = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                        if cols and column not in cols:
                            self._db.execute(stmt)
            for stmt in filter(str.strip, SCHEMA.split(";")):
                self._db.execute(stmt)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @classmethod
    def open_existing(cls, path: Path) -> "Ledger | None":
        """Open the ledger if one exists; reading never creates one."""
        if path.exists() and not path.is_file():
            from launcher.errors import Refused

            raise Refused(f"{path} is not a ledger file", hint="move it aside; the ledger is a SQLite file")
        return cls(path) if path.is_file() else None

    def close(self) -> None:
        self._db.close()

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, for read-only queries (writes go through `transaction`)."""
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: all of it lands, or none of it."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            if "locked" in str(err) or "busy" in str(err):
                from launcher.errors import Refused

                raise Refused(f"the ledger {self.path} is locked{describe_holders(self.path)} "
                              f"(waited {LOCK_WAIT_S:g} s)",
                              hint="wait for it to finish, or stop it, then run this again") from None
            raise
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- reviews -------------------------------------------------------------

    def record_review(self, digest: str, files: dict[str, str]) -> int:
        with self.transaction() as db:
            cur = db.execute("INSERT INTO reviews (created_at, digest, files) VALUES (?, ?, ?)",
                             (time.time(), digest, json.dumps(files, sort_keys=True)))
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
            db.executemany("INSERT INTO run_files (run_id, path, sha256) VALUES (?, ?, ?)",
                           [(run["id"], p, h) for p, h in sorted(files.items())])

    def begin_leg(self, leg: dict[str, Any]) -> None:
        row = dict(leg, command=json.dumps(leg["command"]), env=json.dumps(leg["env"], sort_keys=True))
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.transaction() as db:
            db.execute(f"INSERT INTO legs ({cols}) VALUES ({marks})", tuple(row.values()))

    def end_leg(self, run_id: str, leg: int, *, ended_at: float, exit_code: int | None, killed: bool,
                end_reason: str, billed_gpu_hours: float, cost_usd: float | None, cost_source: str | None = None,
                placement: dict[str, str] | None = None) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE legs SET ended_at=?, exit_code=?, killed=?, end_reason=?, billed_gpu_hours=?, cost_usd=?,"
                " cost_source=COALESCE(?, cost_source), placement=COALESCE(?, placement) WHERE run_id=? AND leg=?",
                (ended_at, exit_code, int(killed), end_reason, billed_gpu_hours, cost_usd, cost_source,
                 json.dumps(placement, sort_keys=True) if placement else None, run_id, leg))

    def add_checks(self, run_id: str, checks: list[dict[str, Any]]) -> None:
        with self.transaction() as db:
            start = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM checks WHERE run_id=?", (run_id,)).fetchone()[0]
            db.executemany(
                "INSERT INTO checks (run_id, seq, name, ok, detail, evidence) VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, start + i, c["name"], int(c["ok"]), c["detail"], json.dumps(c.get("evidence", [])))
                 for i, c in enumerate(checks)])

    def end_run(self, run_id: str, *, ended_at: float, exit_code: int, verdict: str, cost_source: str) -> None:
        """Close the run; its billed GPU-hours and cost are the sum of its legs'."""
        with self.transaction() as db:
            billed, cost = db.execute(
                "SELECT COALESCE(SUM(billed_gpu_hours), 0), SUM(cost_usd) FROM legs WHERE run_id=?",
                (run_id,)).fetchone()
            legs = sorted({r[0] for r in db.execute("SELECT DISTINCT cost_source FROM legs WHERE run_id=? AND "
                                                    "cost_source IS NOT NULL", (run_id,))})
            if legs:  # what the legs were priced by, where they say
                cost_source = " + ".join(legs)
            db.execute("UPDATE runs SET ended_at=?, exit_code=?, verdict=?, billed_gpu_hours=?, cost_usd=?,"
                       " cost_source=? WHERE id=?",
                       (ended_at, exit_code, verdict, billed, cost, cost_source, run_id))

    # --- reading -------------------------------------------------------------

    def runs(self, limit: int | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
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
            run = _clean(dict(row), RUN_NUMBERS, {})
            run["preflight"] = _json_or_none(run.get("preflight"))
            rid = row["id"]
            run["files"] = {str(r["path"]): str(r["sha256"]) for r in
                            self._db.execute("SELECT path, sha256 FROM run_files WHERE run_id=? ORDER BY path", (rid,))}
            run["legs"] = [_clean(dict(r), LEG_NUMBERS, {"command": list, "env": dict})
                           for r in self._db.execute("SELECT * FROM legs WHERE run_id=? ORDER BY leg", (rid,))]
            for leg in run["legs"]:
                leg["killed"] = bool(leg["killed"])
                leg["placement"] = _json_or_none(leg.get("placement"))
            run["checks"] = [_clean(dict(r, ok=bool(r["ok"])), (), {"evidence": list})
                             for r in self._db.execute("SELECT * FROM checks WHERE run_id=? ORDER BY seq", (rid,))]
            out.append(run)
        return out

    # --- graceful stops ---------------------------------------------------------

    def request_stop(self, run_id: str, leg: int | None, timeout_s: float) -> int:
        with self.transaction() as db:
            return int(db.execute("INSERT INTO stops (run_id, leg, requested_at, timeout_s) VALUES (?, ?, ?, ?)",
                                  (run_id, leg, time.time(), timeout_s)).lastrowid)

    def stop_requested(self, run_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM stops WHERE run_id=? LIMIT 1", (run_id,)).fetchone() is not None

    def end_stop(self, stop_id: int, **fields: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in fields)
        with self.transaction() as db:
            db.execute(f"UPDATE stops SET ended_at=?, {cols} WHERE id=?", (time.time(), *fields.values(), stop_id))

    def stops(self, run_id: str) -> list[dict[str, Any]]:
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

    def images(self, files_digest: str | None = None) -> list[dict[str, Any]]:
        """Built images, newest first (only those baked from `files_digest` if given)."""
        sql, args = "SELECT * FROM images", ()
        if files_digest is not None:
            sql, args = sql + " WHERE files_digest=?", (files_digest,)
        rows = self._db.execute(sql + " ORDER BY id DESC", args).fetchall()
        return [dict(r, files=json.loads(r["files"])) for r in rows]

    def integrity_ok(self) -> bool:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

"""The ledger's tables, their version, and the forward migrations that bring a
ledger written by an older launcher up to it (launcher.ledger.db applies them).
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 13
# Forward migrations, applied in order to ledgers written by older versions.
MIGRATIONS = {
    2: ["ALTER TABLE runs ADD COLUMN image TEXT"],
    3: ["ALTER TABLE legs ADD COLUMN task_sha256 TEXT"],
    4: ["ALTER TABLE legs ADD COLUMN pid INTEGER"],  # the stops table is created whole by SCHEMA
    5: ["ALTER TABLE reservations ADD COLUMN pid_start INTEGER"],
    6: ["ALTER TABLE legs ADD COLUMN role TEXT"],
    7: [
        "ALTER TABLE legs ADD COLUMN hourly_usd REAL",
        "ALTER TABLE legs ADD COLUMN cost_source TEXT",
        "ALTER TABLE legs ADD COLUMN placement TEXT",
    ],
    8: ["ALTER TABLE runs ADD COLUMN preflight TEXT"],
    9: [
        "ALTER TABLE checks ADD COLUMN kind TEXT",
        "ALTER TABLE checks ADD COLUMN leg INTEGER",
        "ALTER TABLE checks ADD COLUMN facts TEXT",
    ],
    10: ["ALTER TABLE legs ADD COLUMN run_sha256 TEXT", "ALTER TABLE legs ADD COLUMN nodes TEXT"],
    11: ["ALTER TABLE legs ADD COLUMN request_id TEXT"],
    12: ["ALTER TABLE legs ADD COLUMN watchdog TEXT"],
    13: ["ALTER TABLE legs ADD COLUMN billed_s REAL"],
}

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
    run_sha256  TEXT,                      -- the `run:` script every node executed (sky, and local with --nodes N)
    nodes       TEXT,                      -- JSON [{node, instance, pid, exit_code, log}]: a leg of several nodes
    request_id  TEXT,                      -- sky: the launch / jobs.launch request on SkyPilot's API server
    watchdog    TEXT,                      -- JSON {policy, closest, suspects}: the leg's ranks watched (launcher.checks.watchdog)
    billed_s    REAL,                      -- instance-seconds billed, every node, the provider's rounding included
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
    kind        TEXT,                      -- launcher.checks.evidence.Kind where a reader selects it
    leg         INTEGER,                   -- the leg it is about
    facts       TEXT,                      -- JSON {field: value}: what readers use, never parsed from detail
    PRIMARY KEY (run_id, seq)
);
"""


def create_or_migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a ledger at schema `version` (0: new) to SCHEMA_VERSION. The caller holds the
    write transaction, so a ledger is migrated whole or not at all."""
    fresh = db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name='runs'").fetchone()[0] == 0
    if not fresh:
        for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
            for stmt in MIGRATIONS[target]:
                # ALTER TABLE <table> ADD COLUMN <col>: a missing table is created whole below,
                # a column already there is left as it is
                table, column = stmt.split()[2], stmt.split()[5]
                cols = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                if cols and column not in cols:
                    db.execute(stmt)
    for stmt in filter(str.strip, SCHEMA.split(";")):
        db.execute(stmt)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

"""The ledger under kill -9: no half-written rows, always readable."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from launcher.ledger.db import SCHEMA_VERSION, Ledger
from tests.helpers import LAUNCHER, edit_config, run_cli

ASSETS = Path(__file__).parents[1] / "assets"
N_FILES = 40

HAMMER = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from launcher.ledger.db import SCHEMA_VERSION, Ledger
ledger = Ledger(__import__('pathlib').Path(sys.argv[1]))
i = 0
while True:
    rid = f"r{{i}}"
    ledger.begin_run({{"id": rid, "project": "p", "rung": "rehearsal", "backend": "local", "gpu_name": None,
                      "gpu_count": 0, "nodes": 1, "store_uri": "file:///s", "review_id": None,
                      "files_digest": "d", "config_sha256": "c", "started_at": time.time()}},
                     {{f"f{{k}}.py": "0" * 64 for k in range({N_FILES})}})
    ledger.begin_leg({{"run_id": rid, "leg": 0, "backend": "local", "instance": "/tmp/x", "command": ["python"],
                      "env": {{}}, "log_path": "l", "started_at": time.time()}})
    ledger.end_leg(rid, 0, ended_at=time.time(), exit_code=0, killed=False, end_reason="exited",
                   billed_gpu_hours=0.0, cost_usd=0.0)
    ledger.end_run(rid, ended_at=time.time(), exit_code=0, verdict="pass", cost_source="none")
    i += 1
    if i in (20, 40):
        print("writing" if i == 20 else "still writing", flush=True)
"""


def test_kill_9_mid_write_leaves_no_partial_row(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    proc = subprocess.Popen([sys.executable, "-c", HAMMER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    assert proc.stdout.readline() == "still writing\n"  # writing row after row: the kill lands in one
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ledger = Ledger(db)  # opens, recovering the WAL
    assert ledger.integrity_ok()
    runs = ledger.runs()
    assert len(runs) >= 20
    for run in runs:  # every run row came with all of its file hashes, or not at all
        assert len(run["files"]) == N_FILES
        if run["verdict"] is not None:
            assert run["legs"] and run["legs"][0]["ended_at"] is not None
    ledger.close()


def leg_pids(root: Path) -> list[int]:
    """Processes whose working directory is a leg's disk under `root`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(root) in os.readlink(proc / "cwd"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def wait_for_line(log: Path, needle: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.exists() and needle in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in {log}")


def test_leg_killed_mid_write_is_recorded(project: Path, leg_tmp: Path) -> None:
    shutil.copyfile(ASSETS / "forgetful_train.py", project / "train.py")
    edit_config(project, trainer__command="python train.py --write-mb 400", trainer__modules=[])
    assert run_cli(["review"], cwd=project).code == 0
    launcher = subprocess.Popen(
        [str(LAUNCHER), "up", "rehearsal"], cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log = next_log(project)
    wait_for_line(log, '"event": "writing"')
    time.sleep(0.2)
    for pid in leg_pids(leg_tmp / "preflight-legs"):
        os.kill(pid, signal.SIGKILL)
    assert launcher.wait(timeout=60) == 1  # the rung ran; its answer is no
    res = run_cli(["ledger", "--json"], cwd=project)
    assert res.code == 0
    run = res.json()[0]
    assert run["verdict"] == "fail"
    assert run["legs"][0]["exit_code"] == -9 and run["legs"][0]["ended_at"] is not None
    assert len(run["legs"]) == 1  # nothing to resume from: leg 1 was not launched


def next_log(project: Path, leg: int = 0, timeout: float = 60) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        logs = sorted((project / ".launcher" / "runs").glob(f"*/leg-{leg}.log"))
        if logs:
            return logs[-1]
        time.sleep(0.05)
    raise AssertionError("no leg log appeared")


def test_a_launcher_killed_mid_run_ends_its_run_and_leaves_nothing_running(project: Path, leg_tmp: Path) -> None:
    launcher = subprocess.Popen(
        [str(LAUNCHER), "up", "rehearsal"], cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_line(next_log(project), '"event": "step"')
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 20  # the leash kills the orphaned leg and removes its disk on its own
    while (
        leg_pids(leg_tmp / "preflight-legs") or list((leg_tmp / "preflight-legs").iterdir())
    ) and time.time() < deadline:
        time.sleep(0.1)
    assert leg_pids(leg_tmp / "preflight-legs") == []
    assert list((leg_tmp / "preflight-legs").iterdir()) == []
    with sqlite3.connect(project / ".launcher" / "ledger.db") as conn:  # nothing has read it since the kill
        assert conn.execute("SELECT ended_at FROM runs").fetchone()[0] is None
    res = run_cli(["ledger", "--json"], cwd=project)  # the next command reconciles
    assert res.code == 0, res.err
    run = res.json()[0]
    assert run["verdict"] == "launcher died" and run["ended_at"] is not None
    assert run["legs"][0]["ended_at"] is not None and run["legs"][0]["end_reason"] == "launcher died"
    assert run["files"] and run["legs"][0]["command"][1] == "train.py"
    with sqlite3.connect(project / ".launcher" / "ledger.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM reservations WHERE settled_at IS NULL").fetchone()[0] == 0
    table = run_cli(["ledger"], cwd=project)
    assert table.code == 0 and "launcher died" in table.out


def test_the_next_command_ends_a_dead_launchers_run_and_kills_its_leg(project: Path, leg_tmp: Path) -> None:
    """Without the leash (as if it died too): the next command kills the leg and removes its dir."""
    launcher = subprocess.Popen(
        [str(LAUNCHER), "up", "rehearsal"], cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log = next_log(project)
    wait_for_line(log, '"event": "step"')
    leashes = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-f", f"launcher.backends.leash --token {log.parent.name}"], capture_output=True, text=True
        ).stdout.split()
    ]
    assert len(leashes) == 1
    for pid in leashes:
        os.kill(pid, signal.SIGKILL)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert leg_pids(leg_tmp / "preflight-legs")  # the orphaned leg still trains
    res = run_cli(["status", "--json"], cwd=project)
    assert res.code == 0, res.err
    assert res.json()["state"] == "ended: launcher died"
    assert leg_pids(leg_tmp / "preflight-legs") == []
    assert list((leg_tmp / "preflight-legs").iterdir()) == []


def test_a_v1_ledger_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with sqlite3.connect(db) as conn:  # the runs table as version 1 wrote it
        conn.executescript("""
            CREATE TABLE runs (id TEXT PRIMARY KEY, project TEXT NOT NULL, rung TEXT NOT NULL,
                backend TEXT NOT NULL, gpu_name TEXT, gpu_count INTEGER NOT NULL, nodes INTEGER NOT NULL,
                store_uri TEXT NOT NULL, review_id INTEGER, files_digest TEXT NOT NULL,
                config_sha256 TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL, exit_code INTEGER,
                verdict TEXT, billed_gpu_hours REAL, cost_usd REAL, cost_source TEXT);
            INSERT INTO runs VALUES ('old', 'p', 'static', 'host', NULL, 0, 1, 'file:///s', NULL, 'd', 'c',
                1.0, 2.0, 0, 'pass', 0.0, 0.0, 'none');
            PRAGMA user_version=1;
        """)
    ledger = Ledger(db)
    [run] = ledger.runs()
    assert run["id"] == "old" and run["image"] is None
    assert ledger._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    ledger.close()


def test_a_v3_ledger_gains_leg_pids_and_the_stops_table(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    with sqlite3.connect(db) as conn:  # as version 3 left it
        conn.executescript("ALTER TABLE legs DROP COLUMN pid; DROP TABLE stops; PRAGMA user_version=3;")
    ledger = Ledger(db)
    cols = [r[1] for r in ledger._db.execute("PRAGMA table_info(legs)")]
    assert "pid" in cols and ledger.stops("none") == []
    assert ledger._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    ledger.close()

"""Spend: quota periods, the guard's refusal and arithmetic, no over-reservation under
concurrency, and reservations left by a dead launcher settled by the next call."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from launcher.config.load import load_config
from launcher.config.schema import Config, QuotaConfig, parse_gpus
from launcher.ladder import rung_named
from launcher.legs import RunContext
from launcher.ops.spend import period_start
from tests.helpers import assert_one_line_error, edit_config, run_cli, run_rows

UTC = timezone.utc


@pytest.mark.parametrize(
    "now, weekday, start",
    [
        (datetime(2026, 12, 2, 12, 0, tzinfo=UTC), "monday", datetime(2026, 11, 30, tzinfo=UTC)),
        (datetime(2026, 11, 30, 0, 0, tzinfo=UTC), "monday", datetime(2026, 11, 30, tzinfo=UTC)),
        (datetime(2026, 12, 6, 23, 59, tzinfo=UTC), "monday", datetime(2026, 11, 30, tzinfo=UTC)),
        (datetime(2026, 12, 7, 0, 1, tzinfo=UTC), "monday", datetime(2026, 12, 7, tzinfo=UTC)),  # rolled over
        (datetime(2026, 12, 5, 10, 0, tzinfo=UTC), "sunday", datetime(2026, 11, 29, tzinfo=UTC)),
        (datetime(2026, 12, 6, 10, 0, tzinfo=UTC), "sunday", datetime(2026, 12, 6, tzinfo=UTC)),
    ],
)
def test_week_rollover(now: datetime, weekday: str, start: datetime) -> None:
    cfg = Config(project="p", quota=QuotaConfig(gpu_hours=30, period="week", reset_weekday=weekday))
    assert period_start(cfg, now) == start


def test_month_and_no_period() -> None:
    now = datetime(2026, 12, 15, 8, tzinfo=UTC)
    assert period_start(Config(project="p", quota=QuotaConfig(period="month")), now) == datetime(
        2026, 12, 1, tzinfo=UTC
    )
    assert period_start(Config(project="p", quota=QuotaConfig(period="none")), now) is None


def set_quota(project: Path, **quota: object) -> None:
    edit_config(project, **{f"quota__{key}": value for key, value in quota.items()})


def add_billed_run(project: Path, hours: float, run_id: str = "earlier") -> None:
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        db.execute(
            "INSERT INTO runs (id, project, rung, backend, gpu_count, nodes, store_uri, files_digest, "
            "config_sha256, started_at, ended_at, exit_code, verdict, billed_gpu_hours, cost_usd) "
            "VALUES (?, 'p', 'smoke', 'sky', 1, 1, 's', 'd', 'c', ?, ?, 0, 'pass', ?, 0)",
            (run_id, time.time() - 60, time.time(), hours),
        )


def test_over_quota_is_refused_with_the_arithmetic(project: Path, gpu_host) -> None:
    gpu_host("Tesla T4", 1)
    set_quota(project, gpu_hours=1)
    add_billed_run(project, 0.8)
    res = run_cli(["up", "smoke", "--gpus", "T4:1"], cwd=project)
    assert_one_line_error(
        res,
        3,
        "used 0.80 + reserved 0.00 + this rung 0.50 (3 legs x 10 min x 1 GPUs x 1 nodes) = 1.30 GPU-h > quota 1 GPU-h",
    )
    assert "--allow-overdraft" in res.err
    assert run_rows(project) == 1  # nothing recorded but the earlier run


def test_allow_overdraft_launches_and_is_recorded(project: Path, gpu_host) -> None:
    gpu_host("Tesla T4", 1)
    set_quota(project, gpu_hours=1)
    add_billed_run(project, 0.8)
    # What is checked is the guard's record, not the training: a trainer that exits at once is one
    # short leg (a leg that prints nothing ends the rung), launched and billed like any other.
    (project / "train.py").write_text("import sys\nsys.exit(1)\n")
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--allow-overdraft", "--json"], cwd=project)
    assert res.code == 1  # it ran: its one leg said nothing and exited 1
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        legs = db.execute("SELECT COUNT(*), SUM(billed_gpu_hours) FROM legs").fetchone()
    assert legs[0] == 1 and legs[1] > 0
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        overdraft, arithmetic, settled, how = db.execute(
            "SELECT overdraft, arithmetic, settled_gpu_hours, settled_how FROM reservations"
        ).fetchone()
    assert overdraft == 1 and arithmetic.startswith("OVERDRAFT: used 0.80")
    assert how == "billed" and settled > 0  # settled with what the legs billed


RESERVE = """
import sys, json
from pathlib import Path
from launcher.config.schema import parse_gpus
from launcher.config.load import load_config
from launcher.errors import Refused
from launcher.ladder import rung_named
from launcher.ledger.db import Ledger
from launcher.ops.spend import project, reserve
hold = sys.argv[1:2] == ["--hold"]  # a live launcher holds its reservation while its legs run: until told
args = sys.argv[2:] if hold else sys.argv[1:]
cfg = load_config(Path(args[0]))
ledger = Ledger(cfg.state_path / "ledger.db")
rung = rung_named("smoke")
for run_id in args[1:]:
    try:
        r = reserve(cfg, ledger, run_id, "smoke", project(cfg, None, rung, parse_gpus("T4:1"), 1), 0.35, False)
        print(json.dumps({"ok": True, "id": r.id}))
    except Refused as err:
        print(json.dumps({"ok": False, "why": err.message}))
    sys.stdout.flush()
if hold:
    sys.stdin.read()
"""


def test_eight_concurrent_launches_never_over_reserve(project: Path) -> None:
    set_quota(project, gpu_hours=2)  # each smoke reserves 0.5 GPU-h: four fit
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RESERVE, "--hold", str(project / "launcher.yaml"), f"run{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:  # each holds its reservation (alive) until all eight have answered, then they are let go
        results = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.communicate(timeout=120)
    assert sum(r["ok"] for r in results) == 4
    assert all("> quota 2 GPU-h" in r["why"] for r in results if not r["ok"])
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        held = db.execute("SELECT SUM(gpu_hours) FROM reservations").fetchone()[0]
    assert held == pytest.approx(2.0)


def test_a_dead_launchers_reservation_is_settled_by_the_next_call(project: Path) -> None:
    set_quota(project, gpu_hours=10)
    proc = subprocess.run(
        [sys.executable, "-c", RESERVE, str(project / "launcher.yaml"), "crashed-after-leg", "crashed-mid-leg"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert all(json.loads(line)["ok"] for line in proc.stdout.splitlines())  # then it "dies": never settles
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        for run in ("crashed-after-leg", "crashed-mid-leg"):
            db.execute(
                "INSERT INTO runs (id, project, rung, backend, gpu_count, nodes, store_uri, files_digest, "
                "config_sha256, started_at) VALUES (?, 'p', 'smoke', 'local', 1, 1, 's', 'd', 'c', ?)",
                (run, time.time()),
            )
        db.execute(
            "INSERT INTO legs (run_id, leg, backend, instance, command, env, log_path, started_at, ended_at, "
            "billed_gpu_hours, cost_usd) VALUES ('crashed-after-leg', 0, 'local', 'i', '[]', '{}', 'l', 0, 1, "
            "0.2, 0.07)"
        )
        db.execute(
            "INSERT INTO legs (run_id, leg, backend, instance, command, env, log_path, started_at) "
            "VALUES ('crashed-mid-leg', 0, 'local', 'i', '[]', '{}', 'l', 0)"
        )
    res = run_cli(["spend", "--json"], cwd=project)
    data = res.json()
    assert data["reconciled_now"] == 2 and data["reserved_gpu_hours"] == 0
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        settled = dict(db.execute("SELECT run_id, settled_gpu_hours FROM reservations").fetchall())
    assert settled == {"crashed-after-leg": pytest.approx(0.2), "crashed-mid-leg": pytest.approx(0.5)}
    assert data["used_gpu_hours"] == pytest.approx(0.7)  # neither lost nor double-counted


def test_leg_deadline_from_what_the_quota_still_allows(project: Path) -> None:
    set_quota(project, session_hours=9)
    cfg = load_config(project / "launcher.yaml")
    ctx = RunContext(
        cfg,
        rung_named("smoke"),
        None,
        None,
        "r",
        "file:///s",
        {},
        parse_gpus("T4:2"),  # type: ignore[arg-type]
        lambda leg, line: None,
        quota_left_hours=0.1,
    )
    assert ctx.leg_deadline(3600) == pytest.approx(time.time() + 0.1 / 2 * 3600, abs=2)  # 3 min of 2 GPUs
    ctx.quota_left_hours = None
    assert ctx.leg_deadline(24 * 3600) == pytest.approx(time.time() + 9 * 3600, abs=2)  # the session cap

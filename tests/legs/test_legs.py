"""Leg bookkeeping: the budget kill, Ctrl-C, billing, and the smoke rung's honest "no" without CUDA."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from launcher import legs
from launcher.backends.base import StagedFile
from launcher.backends.local import LocalBackend
from launcher.checks.evidence import Kind
from launcher.config.schema import Config, RungConfig, RungsConfig, TrainerConfig, parse_gpus
from launcher.ladder import rung_named
from launcher.ledger.db import Ledger
from tests.gpuhost import gpu_host_env, has_real_driver
from tests.helpers import LAUNCHER, assert_one_line_error, check, run_cli, run_rows
from tests.legs.test_ledger import leg_pids, next_log, wait_for_line


def test_leg_over_budget_is_killed_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(legs, "MIN_GRACE_SECONDS", 0.5)
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    cfg = Config(
        project="t",
        trainer=TrainerConfig(command=["python", "sleeper.py"]),
        reviewed=["sleeper.py"],
        rungs=RungsConfig(rehearsal=RungConfig(steps=2, budget_minutes=0.01)),
        root=tmp_path,
    )
    ledger = Ledger(tmp_path / "ledger.db")
    ctx = legs.RunContext(
        cfg,
        rung_named("rehearsal"),
        LocalBackend(root=tmp_path / "legs"),
        ledger,
        "r1-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10],  # a token of its own
        # (tests/legs/test_local_backend.py: run_id)
        "file:///s",
        {"sleeper.py": StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())},
        None,
        lambda leg, line: None,
    )
    ledger.begin_run(legs.ledger_run_row(ctx, None, "d", "c"), {})
    began = time.time()
    out = legs.run_leg(ctx, 0, max_steps=2)
    assert time.time() - began < 30
    assert out.result.killed and out.result.exit_code == -9 and "over budget" in out.result.end_reason
    leg = ledger.runs()[0]["legs"][0]
    assert leg["killed"] and "over budget" in leg["end_reason"] and leg["ended_at"] is not None


def test_billing_is_wall_time_times_gpus_priced_from_config(tmp_path: Path) -> None:
    from launcher.backends.base import LegResult

    def ran(seconds: float, **priced: object) -> LegResult:
        return LegResult(0, 0.0, seconds, False, "exited", **priced)  # type: ignore[arg-type]

    cfg = Config(project="t", prices={"T4": 0.35}, root=tmp_path)
    ctx = legs.RunContext(
        cfg,
        rung_named("smoke"),
        LocalBackend(),
        None,
        "r",
        "file:///s",
        {},  # type: ignore[arg-type]
        parse_gpus("T4:2"),
        lambda leg, line: None,
    )
    _, hours, cost, source = ctx.billed(ran(1800.0))
    assert hours == pytest.approx(1.0) and cost == pytest.approx(0.35) and source == "config prices"
    cpu = legs.RunContext(
        cfg,
        rung_named("rehearsal"),
        LocalBackend(),
        None,
        "r",
        "file:///s",
        {},  # type: ignore[arg-type]
        None,
        lambda leg, line: None,
    )
    assert cpu.billed(ran(1800.0)) == (1800.0, 0.0, 0.0, "none")
    unpriced = legs.RunContext(
        cfg,
        rung_named("smoke"),
        LocalBackend(),
        None,
        "r",
        "file:///s",
        {},  # type: ignore[arg-type]
        parse_gpus("H200:1"),
        lambda leg, line: None,
    )
    assert unpriced.billed(ran(3600.0)) == (3600.0, 1.0, None, "none")  # unknown price: no made-up cost
    # Where the backend priced the whole instance (sky: SkyPilot's optimizer, host VM included),
    # the cost is instance-hours at that price, not GPU-hours at the config's.
    _, hours, cost, source = ctx.billed(
        ran(1800.0, billed_seconds=1800.0, instance_hourly_usd=1.17, cost_source="skypilot optimizer")
    )
    assert hours == pytest.approx(1.0) and cost == pytest.approx(0.585) and source == "skypilot optimizer"


def test_cpu_rungs_hide_the_gpus_from_their_legs(tmp_path: Path) -> None:
    # A rehearsal on a box that has GPUs must still rehearse the CPU path.
    cfg = Config(project="t", root=tmp_path)
    cpu = legs.RunContext(
        cfg,
        rung_named("rehearsal"),
        LocalBackend(),
        None,
        "r",
        "file:///s",
        {},  # type: ignore[arg-type]
        None,
        lambda leg, line: None,
    )
    assert cpu.leg_env(0, 10, time.time())["CUDA_VISIBLE_DEVICES"] == ""
    gpu = legs.RunContext(
        cfg,
        rung_named("smoke"),
        LocalBackend(),
        None,
        "r",
        "file:///s",
        {},  # type: ignore[arg-type]
        parse_gpus("T4:1"),
        lambda leg, line: None,
    )
    assert "CUDA_VISIBLE_DEVICES" not in gpu.leg_env(0, 10, time.time())


def test_ctrl_c_kills_the_leg_and_closes_the_run(project: Path, leg_tmp: Path) -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and the
    # launcher would inherit that: give it the default disposition a terminal gives.
    launcher = subprocess.Popen(
        [str(LAUNCHER), "up", "rehearsal"],
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_line(next_log(project), '"event": "step"')
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) == 130
    assert leg_pids(leg_tmp / "preflight-legs") == []  # no instance outlives the launcher
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["verdict"] == "interrupted" and run["exit_code"] == 130 and run["ended_at"] is not None
    assert run["legs"][0]["killed"] and run["legs"][0]["end_reason"] == "launcher interrupted"


def test_a_gpu_request_on_a_host_without_those_gpus_is_refused_before_anything_runs(project: Path) -> None:
    """The headline command on a machine with no GPU: refused by the plan (exit 3), in the dry
    run too, naming what the host has and the two ways on; nothing recorded, nothing billed."""
    hosts = [gpu_host_env(), gpu_host_env("Tesla T4")]  # a driver and no GPU; one T4
    for env in hosts if has_real_driver() else [{}, *hosts]:  # and, where it can be had, no driver at all
        for extra in ([], ["--dry-run"]):
            res = run_cli(["up", "probe", "--gpus", "T4:2", *extra], cwd=project, env=env)
            assert_one_line_error(res, 3, "--gpus T4:2 needs 2 T4 on this host")
            assert "--cpu" in res.err and "--backend sky" in res.err  # the two ways on, in its `next:` line
            assert ("1 x Tesla T4" if env.get("FAKE_NVML_GPUS") else "no CUDA GPU") in res.err
    assert run_rows(project) == 0
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0


def test_smoke_on_a_host_whose_t4_the_trainer_left_idle_answers_no_and_bills_the_gpu_it_held(
    project: Path, gpu_host
) -> None:
    """On a host with the T4 (tests/gpuhost.py's driver) the leg is given it and, like a cloud
    instance, bills it for its wall time; a trainer that trained on the CPU instead is the
    smoke rung's "no" (here: the stand-in driver's T4 is not one torch can use)."""
    gpu_host("Tesla T4", 1)
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--json"], cwd=project)
    assert res.code == 1
    on_gpu = check(res, Kind.ON_ACCELERATOR, leg=0)
    assert not on_gpu["ok"] and "'cpu'" in on_gpu["detail"], on_gpu
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    wall = sum(leg["ended_at"] - leg["started_at"] for leg in run["legs"])
    assert run["gpu_name"] == "T4" and run["gpu_count"] == 1
    assert run["billed_gpu_hours"] == pytest.approx(wall / 3600, rel=1e-6)
    assert run["cost_usd"] == pytest.approx(run["billed_gpu_hours"] * 0.35, rel=1e-6)
    assert run["cost_source"] == "config prices"
    # the memory guard's prediction was recorded beside the legs' measurement: none of a GPU here
    score = check(res, Kind.MEMORY_SCORED)
    assert score["ok"] and score["facts"]["predicted"] > 0 and score["facts"]["allocated"] is None
    assert "MISSING" in score["detail"]
    rep = run_cli(["report", "--out", str(project / "rep"), "--json"], cwd=project).json()
    (row,) = rep["plan"]["memory_scores"]["rows"]
    assert row["run"] == run["id"] and row["predicted"] == score["facts"]["predicted"] and row["allocated"] is None
    assert "| MISSING | MISSING | - |" in (project / "rep" / "preflight.md").read_text()

"""Damaged state and hostile input around a run: guards that cannot be switched off, dry runs
that make nothing, a locked or doctored ledger, doctored logs, a damaged store, init and links."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import Done, assert_one_line_error, clone, edit_config, run_cli, run_rows


def reservations(project: Path) -> int:
    with sqlite3.connect(project / ".launcher" / "ledger.db") as conn:
        return conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0]


def test_the_quota_guard_cannot_be_switched_off(project: Path) -> None:
    (project / "launcher.yaml").write_text(
        (project / "launcher.yaml").read_text().replace("gpu_hours: 30", "gpu_hours: .nan")
    )
    res = run_cli(["up", "smoke", "--gpus", "H100:8"], cwd=project)
    assert_one_line_error(res, 2, "quota.gpu_hours", "finite")
    edit_config(project, quota__gpu_hours=30)
    assert_one_line_error(run_cli(["spend", "--nodes", "-1"], cwd=project), 2, "--nodes")
    assert_one_line_error(
        run_cli(["up", "smoke", "--gpus", "T4:9223372036854775808"], cwd=project),
        2,
        "count must be a whole number from 1 to 64",
    )
    assert_one_line_error(run_cli(["up", "smoke", "--gpus", "T4:" + "9" * 5000], cwd=project), 2, "count")
    assert run_rows(project) == 0 and reservations(project) == 0  # nothing left behind, nothing held


def test_a_dry_run_makes_nothing_and_redacts_like_the_ledger(tmp_path: Path, leg_tmp: Path) -> None:
    root = tmp_path / "fresh"
    assert run_cli(["init", str(root)], cwd=tmp_path).code == 0
    edit_config(
        root,
        leg_env={"WANDB_API_KEY": "wandb-s3cr3t", "MY_TOKEN": "tok-s3cr3t", "HF_HUB_DISABLE_XET": "1"},
        store=str(tmp_path / "ckpts"),
    )
    before = sorted(p.name for p in root.rglob("*"))
    res = run_cli(["up", "rehearsal", "--dry-run"], cwd=root)
    assert_one_line_error(res, 3, "a real launch would be refused", "no review")  # as the real one would
    assert "s3cr3t" not in res.out + res.err and res.out.count("<redacted>") == 2
    assert "HF_HUB_DISABLE_XET=1" in res.out
    assert sorted(p.name for p in root.rglob("*")) == before and not (tmp_path / "ckpts").exists()
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["up", "rehearsal", "--dry-run", "--json"], cwd=root)
    assert res.code == 0 and res.json()["would_launch"] is True and "s3cr3t" not in res.out
    if subprocess.run(["docker", "version"], capture_output=True).returncode == 0:
        res = run_cli(["up", "rehearsal", "--dry-run", "--backend", "docker"], cwd=root)
        assert res.code == 3 and "image" in res.err and "s3cr3t" not in res.out  # no image built: refused
        assert not (tmp_path / "ckpts").exists()  # the store folder is made at launch, not by a dry run


def test_init_never_writes_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "launcher.yaml").symlink_to(outside / "stolen.yaml")  # dangling, pointing out of the project
    res = run_cli(["init", str(proj), "--force"], cwd=tmp_path)
    assert_one_line_error(res, 2, "symlink")
    assert not (outside / "stolen.yaml").exists() and not (proj / "train.py").exists()


def test_a_locked_ledger_names_its_holder_and_readers_are_not_blocked(project: Path) -> None:
    db = project / ".launcher" / "ledger.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sqlite3, time; c = sqlite3.connect({str(db)!r}, "
            "isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('held', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        res = run_cli(["up", "static"], cwd=project)
        waited = time.monotonic() - began
        assert_one_line_error(res, 3, "locked", f"pid {holder.pid}")
        assert waited < 20, waited  # a short wait, not the 30 s it was
        for args in (["ledger"], ["ledger", "--json"], ["spend"]):
            assert run_cli(args, cwd=project).code == 0, args
    finally:
        holder.kill()
        holder.wait()
    assert run_rows(project) == 0


def test_doctored_rows_log_lines_and_a_damaged_checkpoint_read_as_damaged(rehearsed: Done, tmp_path: Path) -> None:
    """One rehearsal (a clone of the worker's shared one), then damage around it: doctored ledger
    rows and log lines (listed, never evidence), then a checkpoint whose manifest is not JSON or
    not readable (status goes on)."""
    project = clone(rehearsed.root, tmp_path / "proj")
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    log = Path(run["legs"][1]["log_path"])
    lines = log.read_text().splitlines(keepends=True)
    step_at = next(i for i, line in enumerate(lines) if '"event": "step"' in line)
    doctored = [
        '{"event": "step", "step": "7", "loss": 1.0, "lr": 0.1, "sample_index": 0}\n',
        '{"event": "resume", "from_step": "5"}\n',
        '{"event": "rate", "step": 10, "tok_s": "fast", "window_first": 1, "window_last": 2, '
        '"seconds": 1, "rel_err": null}\n',
        '{"event": "memory", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
    ]
    log.write_text("".join(lines[:step_at] + doctored + lines[step_at:]))
    with sqlite3.connect(project / ".launcher" / "ledger.db") as conn:
        conn.execute("UPDATE legs SET env='{not json', started_at='yesterday' WHERE leg=2")
    listed = run_cli(["ledger", "--json"], cwd=project)
    assert listed.code == 0, listed.err
    leg2 = listed.json()[0]["legs"][2]
    assert leg2["env"] == {} and leg2["started_at"] is None and set(leg2["damaged"]) == {"env", "started_at"}
    assert run_cli(["ledger"], cwd=project).code == 0
    status = run_cli(["status", run["id"], "--json"], cwd=project)
    assert status.code == 0, status.err
    report = run_cli(["report", "--json"], cwd=project)
    assert report.code == 0, report.err
    damaged = report.json()["damaged_lines"]
    assert len(damaged) == 4 and {d["leg"] for d in damaged} == {1}
    reasons = " ".join(d["reason"] for d in damaged)
    assert "step is '7'" in reasons and "from_step is '5'" in reasons and "RecursionError" in reasons
    assert "tok_s is 'fast'" in reasons
    assert "log line(s) claimed to be events" in (Path(report.json()["folder"]) / "preflight.md").read_text()

    folder = project / ".launcher" / "store" / "runs" / run["id"]
    newest = sorted(folder.glob("step-*"))[-1]
    (newest / "manifest.json").write_text("{not json")
    res = run_cli(["status", run["id"], "--json"], cwd=project)
    assert res.code == 0, res.err
    ck = res.json()["checkpoints"]
    assert [d["name"] for d in ck["damaged"]] == [newest.name] and "not JSON" in ck["damaged"][0]["reason"]
    assert ck["newest_verified"]["name"] != newest.name
    table = run_cli(["status", run["id"]], cwd=project)
    assert table.code == 0 and "damaged" in table.out
    os.chmod(newest / "manifest.json", 0o000)  # unreadable: still one damaged entry, not a crash
    assert run_cli(["status", run["id"]], cwd=project).code == 0
    os.chmod(newest / "manifest.json", 0o644)


@pytest.mark.parametrize("kills", ["101", "100000"])
def test_absurd_drills_are_refused_before_any_work(project: Path, kills: str) -> None:
    res = run_cli(["drill", "cold-resume", "--kills", kills], cwd=project)
    assert_one_line_error(res, 2, "--kills must be 1 to 100")
    assert run_rows(project) == 0


def test_stop_timeout_must_be_a_real_number(project: Path) -> None:
    for bad in ("nan", "inf", "-1", "0"):
        assert_one_line_error(run_cli(["stop", "r", "--timeout", bad], cwd=project), 2, "--timeout")


def test_leg_events_that_do_not_parse_never_reach_a_check(tmp_path: Path) -> None:
    from launcher.checks.evidence import LegEvents

    log = tmp_path / "leg-0.log"
    log.write_text(
        '{"event": "step", "step": 1, "loss": 2.0, "lr": 0.1, "sample_index": 0}\n'
        '{"event": "step", "step": 2, "loss": "nan", "lr": 0.1, "sample_index": 8}\n'
        '{"event": "step", "step": 3, "loss": 1.9, "lr": 0.1, "sample_index": 16, "phases": {"data": "x"}}\n'
        '{"event": "damaged", "kind": "step", "reason": "forged"}\n'
        '{"event": "step", "step": 4, "lo'
    )  # a line cut short by a kill: no damage, just the end
    ev = LegEvents.read(0, log)
    assert [e["step"] for _, e in ev.all("step")] == [1]
    assert [d["line"] for d in ev.damaged()] == [2, 3, 4]
    assert json.dumps(ev.damaged())  # serialisable for status --json and the report


def test_a_trainer_without_batch_hashes_gets_missing_never_pass(tmp_path: Path) -> None:
    from launcher.checks.data import NO_BATCH_HASH, check_batches, check_no_repeat, check_sample_index
    from launcher.checks.evidence import LegEvents

    legs = []
    for leg, steps in enumerate(((1, 2, 3), (4, 5, 6))):
        log = tmp_path / f"leg-{leg}.log"
        lines = [{"event": "step", "step": s, "loss": 2.0, "lr": 0.1} for s in steps]
        if leg:
            lines.insert(0, {"event": "resume", "from_step": 3, "sample_index": 24, "batch_hash": "ab", "lr": 0.1})
        log.write_text("".join(json.dumps(e) + "\n" for e in lines))
        legs.append(LegEvents.read(leg, log))
    for check in (check_no_repeat(legs), check_batches(legs, 1)):
        assert check.detail == NO_BATCH_HASH and check.missing and not check.ok
    assert check_sample_index(legs) is None  # the second witness is simply absent


def test_exact_means_float32_resolution_not_a_band() -> None:
    """A BLAS summing in another order moves a loss by an ulp (1e-6 once printed); the resume
    bugs the old band let through moved it by 6e-4 and more."""
    from launcher.checks.resume import same_loss

    assert same_loss(3.659508, 3.659509) and same_loss(4.0, 4.0)
    assert not same_loss(3.659508, 3.660108)  # 6e-4: the smallest planted-bug difference seen
    assert not same_loss(0.5, 0.50001)

"""Rung 4, the run: carried leg after leg to its last step, each resume checked, stopped by a
crash loop or the quota, gated by a signed report (the gate's own tests use the CPU ladder
of tests/legs/test_report.py).

Kills come from the test, from outside the launcher, as a preemption would: the leg's
process group gets SIGKILL while its push hangs on the loopback Hub (the real
huggingface_hub client mid-upload), so the checkpoint it was pushing never lands.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind
from tests.helpers import (
    LAUNCHER,
    assert_one_line_error,
    check,
    edit_config,
    failed,
    plant_crash_at_step_12,
    run_cli,
    run_rows,
)


def configure(
    root: Path, *, steps: int, command: str, max_restarts: int = 3, quota: float | None = 30, store: str | None = None
) -> None:
    edit_config(
        root,
        trainer__command=command,
        quota__gpu_hours=quota,
        **({"store": store} if store else {}),
        rungs__run={"steps": steps, "budget_minutes": 5, "max_restarts_on_errors": max_restarts},
    )


def start_run(root: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    out = root / "up.out"
    proc = subprocess.Popen(
        [str(LAUNCHER), "up", "run", *args],
        cwd=root,
        env=dict(os.environ),
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return proc, out


def events(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"event"'):
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def wait_for(what, timeout: float = 120.0, every: float = 0.05):  # noqa: ANN001, ANN201
    until = time.time() + timeout
    while time.time() < until:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def leg_row(root: Path, leg: int) -> dict | None:
    db = root / ".launcher" / "ledger.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute(
            "SELECT l.* FROM legs l JOIN runs r ON r.id = l.run_id WHERE r.rung = 'run' AND "
            "l.leg = ? AND l.role IS NULL ORDER BY r.started_at DESC",
            (leg,),
        ).fetchone()
    return dict(row) if row else None


def kill_mid_push(root: Path, leg: int, hub) -> int:  # noqa: ANN001 - tests.fakes.hub_server.HubServer
    """Once leg `leg` completed a storage cycle, hang the Hub's next request and SIGKILL the leg
    the moment it hands its next checkpoint to the pusher. Returns the step being pushed."""
    row = wait_for(lambda: leg_row(root, leg))
    log = Path(row["log_path"])
    wait_for(lambda: any(e["event"] == "prune" for e in events(log)))
    hub.inject("hang", api=True, seconds=30)  # the next push's first request holds
    pruned = sum(e["event"] == "prune" for e in events(log))
    saved = wait_for(lambda: [e for e in events(log) if e["event"] == "save"][pruned:] or None)
    os.killpg(int(row["pid"]), signal.SIGKILL)  # the instance is lost, its disk with it
    hub.reset_faults()
    return int(saved[0]["step"])


def test_a_run_carried_through_two_kills_mid_push_to_its_last_step(
    project: Path,
    hub_server,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    configure(project, steps=60, command="python train.py --ckpt-every 5 --data-delay 0.03", store="hf://tester/ckpts")
    assert run_cli(["review"], cwd=project).code == 0
    proc, out = start_run(project, "--cpu", "--skip-preflight", "the chain's own test")
    try:
        pushed = [kill_mid_push(project, 0, hub_server)]
        s = run_cli(["status", "--json"], cwd=project).json()  # between the kills: progress and restarts so far
        assert s["rung"] == "run" and s["preflight"] == {"gate": "skipped", "reason": "the chain's own test"}
        pushed.append(kill_mid_push(project, 1, hub_server))
        assert proc.wait(timeout=300) == 0, out.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert s["run_progress"]["legs"] >= 1 and 0 < s["run_progress"]["step"] <= 60
    run_id = s["run"]
    run = run_cli(["ledger", run_id, "--json"], cwd=project).json()[0]
    assert run["verdict"] == "pass" and run["exit_code"] == 0 and len(run["legs"]) == 3
    assert run["preflight"] == {"gate": "skipped", "reason": "the chain's own test"}
    assert run["billed_gpu_hours"] == pytest.approx(sum(leg["billed_gpu_hours"] for leg in run["legs"]))
    assert all(c["ok"] for c in run["checks"]), failed(run)
    for leg, step in ((1, pushed[0]), (2, pushed[1])):
        logs = events(Path(run["legs"][leg]["log_path"]))
        resumed = next(e for e in logs if e["event"] == "resume")["from_step"]
        assert resumed == step - 5  # the checkpoint in flight was lost: back to the one before, verified
        for kind in (Kind.RESUMED_NEWEST, Kind.LR, Kind.DATA_POSITION, Kind.LOSS_CONTINUITY):
            assert check(run, kind, leg=leg)["ok"], (kind, leg)
    assert check(run, Kind.RUN_LENGTH)["ok"]
    after = run_cli(["status", run_id, "--json"], cwd=project).json()
    assert after["run_progress"]["step"] == 60 and after["run_progress"]["restarts"] == 2
    human = run_cli(["status", run_id], cwd=project).out
    assert "step 60 of 60 (100.0 %); 3 legs, 2 restarts" in human and "preflight: skipped" in human


def test_a_crash_loop_stops_after_max_restarts_naming_the_newest_verified_checkpoint(project: Path) -> None:
    train = project / "train.py"
    train.write_text(plant_crash_at_step_12(train.read_text()))
    configure(project, steps=40, command="python train.py --ckpt-every 5", max_restarts=2)
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "run", "--cpu", "--skip-preflight", "crash loop", "--json"], cwd=project)
    out = res.json()
    assert res.code == 1, out
    loop = check(out, Kind.PROGRESS)
    assert not loop["ok"] and "2 leg(s) in a row" in loop["detail"]
    run = run_cli(["ledger", out["run_id"], "--json"], cwd=project).json()[0]
    # Leg 0 verified steps 5 and 10, then crashed; legs 1 and 2 each resumed from step 10 and
    # crashed before a newer checkpoint: two legs in a row with no progress, and the rule names 10.
    assert len(run["legs"]) == 3 and run["verdict"] == "fail"
    froms = [
        next(e for e in events(Path(leg["log_path"])) if e["event"] == "resume")["from_step"] for leg in run["legs"][1:]
    ]
    assert froms == [10, 10], froms
    assert f"step-{froms[0]:08d} (step {froms[0]})" in loop["detail"], loop["detail"]


def test_a_quota_that_runs_out_mid_run_stops_with_a_verified_final_checkpoint(project: Path, gpu_host) -> None:
    gpu_host("Tesla T4", 1)
    # 36 s of T4:1; each batch waits 0.1 s for its data, so that the leg waits out its quota
    # instead of spending it on the CPU the other tests share (25 CPU-s without the wait)
    configure(project, steps=100_000, command="python train.py --ckpt-every 20 --data-delay 0.1", quota=0.01)
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "run", "--gpus", "T4:1", "--skip-preflight", "quota test"], cwd=project)
    assert_one_line_error(res, 3, "quota:", "GPU-h left in the period", "verified in the store")
    assert "the rest (steps" in res.err and "needs about" in res.err
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["verdict"] == "refused" and run["exit_code"] == 3 and len(run["legs"]) == 1
    logs = events(Path(run["legs"][0]["log_path"]))
    stop = next(e for e in logs if e["event"] == "stop")
    done = next(e for e in logs if e["event"] == "done")
    assert stop["reason"] == "deadline" and done["final_checkpoint_verified"] is True
    step = int(re.search(r"stopped at step-(\d+)", res.err).group(1))
    assert step == done["step"]  # the final checkpoint is the one the launcher found verified in the store
    assert run["billed_gpu_hours"] <= 0.01 + 1e-9
    assert check(run, Kind.QUOTA_LEG)["ok"] is False
    assert check(run, Kind.STORE_AFTER_KILL, leg=0)["ok"]  # the store after the leg's end


def test_without_a_report_the_run_is_refused_naming_the_proofs(project: Path, gpu_host) -> None:
    gpu_host("Tesla T4", 1)
    res = run_cli(["up", "run", "--gpus", "T4:1"], cwd=project)
    assert_one_line_error(res, 3, "no signed preflight report", "1, 2, 3, 4, 5, 6, 7, 8")
    assert "launcher up probe --gpus T4:1" in res.err and "--skip-preflight" in res.err
    assert run_rows(project) == 0
    res = run_cli(["up", "run", "--cpu", "--skip-preflight", " "], cwd=project)
    assert_one_line_error(res, 2, "--skip-preflight needs a reason")
    res = run_cli(["up", "rehearsal", "--skip-preflight", "x"], cwd=project)
    assert_one_line_error(res, 2, "only the run has a preflight gate")
    assert run_rows(project) == 0


def _step_events(n: int, step_s: float, tok_s: float, t0: float = 1000.0) -> list[str]:
    return [
        json.dumps(
            {
                "event": "step",
                "t": t0 + i * step_s,
                "rank": 0,
                "step": i,
                "loss": 1.0,
                "lr": 0.1,
                "tokens": 512,
                "tok_s": tok_s,
                "step_s": step_s,
            }
        )
        for i in range(1, n + 1)
    ]


def test_status_warns_when_the_rate_falls_under_the_probes_or_the_projection_crosses_the_quota(tmp_path: Path) -> None:
    from launcher.checks.evidence import LegEvents
    from launcher.ops.watch import watch

    log = tmp_path / "leg-0.log"
    log.write_text("\n".join(_step_events(100, 1.0, 800.0)) + "\n")  # 800 tok/s, 1 s/step
    now = time.time()
    run = {
        "gpu_count": 2,
        "nodes": 1,
        "ended_at": None,
        "gpu_name": "T4",
        "preflight": {"gate": "passed", "plan": {"tok_s": 1000.0, "eta_hours": 2.0, "gpu_hours": 4.0, "usd": 4.68}},
        "legs": [
            {
                "leg": 0,
                "env": {"LAUNCHER_MAX_STEPS": "10000"},
                "ended_at": None,
                "started_at": now - 3600,
                "billed_gpu_hours": None,
                "cost_usd": None,
                "hourly_usd": 1.17,
                "end_reason": None,
            }
        ],
    }
    w = watch(run, [LegEvents.read(0, log)], quota_for_run=10.0)
    assert w["step"] == 100 and w["percent"] == 1.0 and w["restarts"] == 0
    assert w["rate"]["vs_plan"] == pytest.approx(0.8) and w["eta_s"] == pytest.approx(9900, rel=1e-3)
    assert w["spent"]["gpu_hours"] == pytest.approx(2.0, rel=1e-3) and w["spent"]["usd"] == pytest.approx(1.17, 1e-3)
    # 2 GPU-h spent + 9,900 s x 2 GPUs = 7.5 GPU-h projected, under the 10 the quota leaves
    assert w["projected_gpu_hours"] == pytest.approx(7.5, rel=1e-3)
    assert [x.split(" ")[0] for x in w["warnings"]] == ["rate"]  # 20 % under the probe's: more than 10 %
    assert "20 % under the probe's 1,000 tok/s" in w["warnings"][0]
    w = watch(run, [LegEvents.read(0, log)], quota_for_run=5.0)
    assert any("crosses what the quota leaves this run (5.00 GPU-h)" in x for x in w["warnings"])
    log.write_text("\n".join(_step_events(100, 1.0, 950.0)) + "\n")  # 5 % under: within the band
    assert watch(run, [LegEvents.read(0, log)], quota_for_run=None)["warnings"] == []


STEP_AT = "        sess.step(loss=loss, batch=x, tokens=tokens_per_step, sample_index=first_sample)\n"
STOPS_ITSELF = (
    '        if os.environ.get("LAUNCHER_LEG") == "0" and os.environ.get("RANK") == "1" and sess.step_count == 12:\n'
    "            os.kill(os.getpid(), signal.SIGSTOP)  # planted: rank 1 of leg 0 hangs after step 12\n"
)


def test_a_run_whose_leg_hangs_is_ended_by_the_watchdog_and_relaunched_from_the_store(project: Path) -> None:
    """`up run` on 2 ranks: rank 1 of the first leg stops itself after step 12. The watchdog (a
    3 s floor: the policy in launcher.yaml) ends the leg as hung; the run relaunches from the
    newest verified checkpoint, step 10, and finishes; every resume check holds; the account has
    the hang in it."""
    train = project / "train.py"
    text = train.read_text()
    assert STEP_AT in text and "\nimport argparse\n" in text
    train.write_text(
        text.replace(STEP_AT, STEP_AT + STOPS_ITSELF).replace(
            "\nimport argparse\n", "\nimport argparse\nimport os\nimport signal\n"
        )
    )
    configure(
        project, steps=24, command="torchrun --standalone --nproc_per_node=2 train.py --ckpt-every 5 --data-delay 0.03"
    )
    edit_config(project, trainer__watchdog={"floor_s": 3.0})
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "run", "--cpu", "--skip-preflight", "the hang's own test", "--json"], cwd=project, timeout=600)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    run = run_cli(["ledger", res.json()["run_id"], "--json"], cwd=project).json()[0]
    assert run["verdict"] == "pass" and len(run["legs"]) == 2, [(leg["end_reason"]) for leg in run["legs"]]
    hung = run["legs"][0]
    assert hung["killed"] and hung["end_reason"].startswith("hung: ") and "rank 1 (pid " in hung["end_reason"]
    assert "stopped (SIGSTOP or a debugger)" in hung["end_reason"], hung["end_reason"]
    resumed = next(e for e in events(Path(run["legs"][1]["log_path"])) if e["event"] == "resume")
    assert resumed["from_step"] == 10 and all(c["ok"] for c in run["checks"]), failed(run)
    assert run["hours"]["legs"][0]["parts"]["hang"] > 3.0 and run["hours"]["parts"]["lost"] > 0

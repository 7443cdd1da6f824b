"""Rung 4 on sky: the run as one managed job, on the strict stand-in's managed jobs (SkyPilot's
own task parser, loader, secrets and record types; no cloud). A preemption mid-run is a
recovery SkyPilot's controller makes; the launcher must see it as a new leg that resumes
from the store, checked like every other resume, and billed."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from launcher import up as up_module
from tests.fakes.sky_standin import job_record, preempt_job
from tests.helpers import SKY_IMAGE_REF, edit_config, plant_crash_at_step_12
from tests.test_sky_live import cloud, ledger_run, strict  # noqa: F401 - the fixture

SKIP = "the sky run's own test"


# One worker for every test whose stand-in clusters run the rendered `run:` script: it binds
# torchrun's rendezvous to port 29500 on the node (right on a cloud, one node a machine), and every
# stand-in cluster is this host, so two such legs at once collide (EADDRINUSE).
pytestmark = pytest.mark.xdist_group("sky-standin-port-29500")


def configure(cfg, data_delay: float = 0.05, **run: object) -> object:  # noqa: ANN001
    from launcher.config.load import load_config

    edit_config(
        cfg.root,
        trainer__command=f"python train.py --ckpt-every 5 --data-delay {data_delay}",
        rungs__run={"steps": 40, "budget_minutes": 10, "max_restarts_on_errors": 2, **run},
    )
    return load_config(cfg.root / "launcher.yaml")


def events(log: Path) -> list[dict]:
    out = []
    if log.is_file():
        for line in log.read_text(errors="replace").splitlines():
            if '{"event": ' in line:
                try:
                    out.append(json.loads(line[line.index('{"event": ') :]))
                except ValueError:
                    pass
    return out


def run_in_thread(cfg, monkeypatch, standin, gpus: str = "T4:1"):  # noqa: ANN001, ANN201
    monkeypatch.setattr("launcher.backends.sky.sky_module", lambda: standin)
    monkeypatch.setattr("launcher.backends.skytask.sky_module", lambda: standin)
    result: dict = {}

    def go() -> None:
        try:
            result["outcome"] = up_module.up(
                cfg, cfg.root / "launcher.yaml", "run", "sky", gpus, lambda leg, line: None, skip_preflight=SKIP
            )
        except BaseException as err:  # noqa: BLE001 - the test reads it
            result["error"] = err

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, result


def wait_for(what, timeout: float = 180.0):  # noqa: ANN001, ANN201
    until = time.time() + timeout
    while time.time() < until:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out: {what}")


def candidate_prices(cfg) -> tuple[float, float]:  # noqa: ANN001
    """SkyPilot's optimizer's price for the run's spot and on-demand candidates (T4:1)."""
    from launcher.backends.sky import SkyBackend
    from launcher.config.schema import parse_gpus

    pick = SkyBackend(cfg, SKY_IMAGE_REF).quote("run", parse_gpus("T4:1"))
    prices = dict(pick.candidates)
    return prices["spot"], prices["on-demand"]


def test_a_preempted_managed_job_recovers_as_a_new_leg_that_resumes_from_the_store(
    sky_project, cloud, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001, F811
    # 0.25 s a step: the preemption must land mid-run, after a whole storage cycle (step 10) and well
    # before step 40. At 0.05 s a step a loaded machine (two workers) saw leg 0 finish all 40 steps first.
    cfg = configure(sky_project, data_delay=0.25)
    standin = strict(cloud)
    spot, on_demand = candidate_prices(cfg)
    thread, result = run_in_thread(cfg, monkeypatch, standin)
    runs = cfg.state_path / "runs"
    log0 = wait_for(lambda: next(iter(runs.glob("*/leg-0.log")), None))
    wait_for(lambda: any(e["event"] == "prune" for e in events(log0)))  # a whole storage cycle first
    job_id = wait_for(
        lambda: (
            ledger_run(cfg)["legs"]
            and re.fullmatch(r"sky-job-\d+", ledger_run(cfg)["legs"][0]["instance"])
            and ledger_run(cfg)["legs"][0]["instance"]
        )
    )
    assert ledger_run(cfg)["legs"][0]["hourly_usd"] == pytest.approx(spot)  # priced as its attempt runs: spot
    # The spot VM is gone, and spot has no capacity now: SkyPilot's recovery lands on on-demand.
    preempt_job(Path(cloud["PREFLIGHT_TEST_SKY_STATE"]), int(job_id.rsplit("-", 1)[1]), spot_gone=True)
    thread.join(600)
    assert not thread.is_alive() and "error" not in result, result
    outcome = result["outcome"]
    checks = {c.name: c for c in outcome.checks}
    assert outcome.ok, {n: c.detail for n, c in checks.items() if not c.ok}
    run = ledger_run(cfg)
    assert run["verdict"] == "pass" and len(run["legs"]) == 2
    assert run["preflight"] == {"gate": "skipped", "reason": SKIP}
    assert {leg["instance"] for leg in run["legs"]} == {job_id}  # one managed job, two attempts
    assert run["legs"][0]["killed"] and "SkyPilot recovered the job" in run["legs"][0]["end_reason"]
    pushed = [e["step"] for e in events(Path(run["legs"][0]["log_path"])) if e["event"] == "verify" and e["ok"]]
    resume = next(e for e in events(Path(run["legs"][1]["log_path"])) if e["event"] == "resume")
    assert resume["from_step"] == max(pushed)  # the newest verified before the preemption
    for name in (
        "leg 1 resumed from the newest verified checkpoint",
        "leg 1: LR follows the schedule",
        "leg 1: exact data position (batch hashes)",
        "leg 1: loss continuity",
        "the run ended at exactly its step count",
        f"managed job {job_id.rsplit('-', 1)[1]}: every recovery became a leg",
    ):
        assert name in checks and checks[name].ok, (name, "\n".join(f"{c.name}: {c.detail}" for c in outcome.checks))
    assert "recovery_count 1" in checks[f"managed job {job_id.rsplit('-', 1)[1]}: every recovery became a leg"].detail
    assert all(leg["billed_gpu_hours"] > 0 and leg["cost_source"] == "skypilot optimizer" for leg in run["legs"])
    # Each attempt billed at the price of what it ran on: spot first, then the on-demand fallback
    # (SkyPilot's optimizer's own prices for each candidate of `ordered`).
    assert spot < on_demand
    assert [leg["hourly_usd"] for leg in run["legs"]] == [pytest.approx(spot), pytest.approx(on_demand)]
    for leg in run["legs"]:
        assert leg["cost_usd"] == pytest.approx(leg["billed_gpu_hours"] * leg["hourly_usd"])  # T4:1, one node
    attempts = job_record(Path(cloud["PREFLIGHT_TEST_SKY_STATE"]), int(job_id.rsplit("-", 1)[1]))["attempts"]
    assert [a["use_spot"] for a in attempts] == [True, False]
    assert run["billed_gpu_hours"] == pytest.approx(sum(leg["billed_gpu_hours"] for leg in run["legs"]))
    assert [c for c, _ in standin.calls if c.startswith("jobs.")][:1] == ["jobs.launch"]


def test_launcher_stop_cancels_the_managed_job_gracefully_with_a_final_verified_checkpoint(
    sky_project, cloud, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001, F811
    import os
    import subprocess
    import sys

    cfg = configure(sky_project, steps=100_000)
    standin = strict(cloud)
    thread, result = run_in_thread(cfg, monkeypatch, standin)
    log0 = wait_for(lambda: next(iter((cfg.state_path / "runs").glob("*/leg-0.log")), None))
    wait_for(lambda: any(e["event"] == "prune" for e in events(log0)))
    run_id = log0.parent.name
    stop = subprocess.run(
        [sys.executable, "-m", "tests.fakes.sky_standin", "launcher", "stop", run_id, "--timeout", "120", "--json"],
        cwd=cfg.root,
        env={**os.environ, **cloud},
        capture_output=True,
        text=True,
        timeout=300,
    )
    thread.join(300)
    assert not thread.is_alive()
    st = json.loads(stop.stdout)
    assert stop.returncode == 0 and st["clean"] is True and st["loadable"]["ok"] is True, (st, stop.stderr[-2000:])
    assert ("jobs.cancel", "1") in standin.calls
    run = ledger_run(cfg)
    assert run["verdict"] == "stopped" and len(run["legs"]) == 1
    logs = events(Path(run["legs"][0]["log_path"]))
    assert next(e for e in logs if e["event"] == "stop")["reason"] == "sigterm"  # graceful: SIGTERM first
    assert st["final_step"] == st["checkpoint_step"]


def test_a_crash_loop_in_the_managed_job_stops_it_naming_the_newest_verified_checkpoint(
    sky_project, cloud, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001, F811
    """A trainer that dies after step 12 on every attempt: SkyPilot restarts it (max_restarts_on_errors),
    every restart resumes from step 10 and dies again; the run stops with exit 1, naming step 10."""
    from launcher.ledger.db import Ledger
    from launcher.manifest import hash_reviewed
    from runtime.hashing import digest_lines as files_digest
    from tests.helpers import SKY_IMAGE_REF

    train = sky_project.root / "train.py"
    planted = plant_crash_at_step_12(train.read_text())
    train.write_text(planted)
    (Path(cloud["PREFLIGHT_TEST_SKY_APP"]) / "train.py").write_text(planted)  # the image bakes the new bytes
    cfg = configure(sky_project, max_restarts_on_errors=1)
    files = hash_reviewed(cfg)
    ledger = Ledger(cfg.state_path / "ledger.db")
    ledger.record_review(files_digest(files), files)
    row = ledger.record_image(
        {
            "tag": "t2",
            "image_id": "sha256:" + "1" * 64,
            "base": "b",
            "lock": "cpu.lock",
            "files_digest": files_digest(files),
            "files": files,
            "runtime_digest": "r",
            "built_at": 0.0,
            "seconds": 0.0,
        }
    )
    ledger.set_pushed(row, SKY_IMAGE_REF)
    ledger.close()
    thread, result = run_in_thread(cfg, monkeypatch, strict(cloud))
    thread.join(600)
    assert not thread.is_alive() and "error" not in result, result
    outcome = result["outcome"]
    assert outcome.exit_code == 1
    [loop] = [c for c in outcome.checks if c.name == "the run makes progress"]
    assert not loop.ok and "step-00000010" in loop.detail, loop.detail
    run = ledger_run(cfg)
    assert run["verdict"] == "fail" and 2 <= len(run["legs"]) <= 3

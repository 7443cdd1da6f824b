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
from launcher.checks.evidence import Kind
from tests.fakes.sky_standin import job_record, preempt_job
from tests.helpers import SKY_IMAGE_REF, check, checks_of, edit_config, failed, plant_crash_at_step_12
from tests.sky.test_sky_live import cloud, ledger_run, strict  # noqa: F401 - the fixture

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
    monkeypatch.setattr("launcher.backends.sky.backend.sky_module", lambda: standin)
    monkeypatch.setattr("launcher.backends.sky.task.sky_module", lambda: standin)
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
    from launcher.backends.sky.backend import SkyBackend
    from launcher.config.schema import parse_gpus

    pick = SkyBackend(cfg, SKY_IMAGE_REF).quote("run", parse_gpus("T4:1"))
    prices = dict(pick.candidates)
    return prices["spot"], prices["on-demand"]


def skypilot_shows(use_spot: bool) -> str:
    """A managed job record's cluster_resources as SkyPilot 0.14.1 writes it: its own formatter
    (sky/utils/resources_utils.py, as sky/jobs/utils.py fills the record from the cluster's
    handle) on a real sky.Resources, e.g. `1x[spot](gpus=T4:1, n1-highmem-4, ...)`."""
    from types import SimpleNamespace

    from sky.utils import resources_utils

    import sky

    launched = sky.Resources(
        infra="gcp/us-central1", instance_type="n1-highmem-4", accelerators="T4:1", use_spot=use_spot
    )
    handle = SimpleNamespace(launched_resources=launched, launched_nodes=1, cached_cluster_info=None)
    return resources_utils.get_readable_resources_repr(handle, simplified_only=False)[0]


def test_an_attempt_skypilot_shows_on_spot_is_billed_at_the_spot_price(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attempt of the managed job is priced from SkyPilot's record of the resources it runs on.
    SkyPilot 0.14.1 writes spot as `[spot]` there (the optimizer's table and a Resources' repr: `[Spot]`);
    the launcher read `[Spot]` only, so every spot attempt was billed at the on-demand price."""
    from types import SimpleNamespace

    from sky.backends import backend_utils

    import sky
    from launcher import legs
    from launcher.backends.sky.api import Pick, spot_of
    from launcher.backends.sky.job import ManagedJob
    from launcher.config.schema import Config, parse_gpus
    from launcher.ladder import rung_named
    from launcher.ledger.db import Ledger
    from launcher.rungs import run_sky

    on_spot, on_demand = skypilot_shows(True), skypilot_shows(False)
    assert "[spot]" in on_spot and "spot" not in on_demand.lower()  # SkyPilot's spelling, as it is today
    both = sky.Task.from_yaml_config(
        {"name": "t", "resources": {"ordered": [{"use_spot": True, "accelerators": "T4:1"}, {"accelerators": "T4:1"}]}}
    )
    asked = backend_utils.get_task_resources_str(both, is_managed_job=True)  # the record once the cluster is gone
    spot_repr = repr(
        sky.Resources(infra="gcp", instance_type="n1-highmem-4", use_spot=True)
    )  # the optimizer's `[Spot]`
    assert [spot_of(on_spot), spot_of(on_demand), spot_of(asked), spot_of("-"), spot_of(spot_repr)] == [
        True,
        False,
        None,
        None,
        True,
    ]
    spot = Pick("GCP", "us-central1", "n1-highmem-4", "T4:1", True, 1, 0.25)
    demand = Pick("GCP", "us-central1", "n1-highmem-4", "T4:1", False, 1, 0.75)
    backend = SimpleNamespace(name="sky", sky=None, billing_granularity_s=60)
    ctx = legs.RunContext(
        Config(project="t", root=tmp_path),
        rung_named("run"),
        backend,  # type: ignore[arg-type]
        Ledger(tmp_path / "ledger.db"),
        "r-spot",
        "file:///s",
        {},
        parse_gpus("T4:1"),
        lambda leg, line: None,
    )
    ctx.ledger.begin_run(legs.ledger_run_row(ctx, None, "d", "c"), {})
    job = ManagedJob(
        backend,  # type: ignore[arg-type]
        SimpleNamespace(env={}, run_id="r-spot", leg=0),  # type: ignore[arg-type]
        SimpleNamespace(sha256="0" * 64, path=tmp_path / "job.yaml"),  # type: ignore[arg-type]
        demand,  # the dearest: what an attempt is billed at until SkyPilot's record says what it runs on
        "skypilot optimizer",
        job_id=7,
        prices=(("spot", spot), ("on-demand", demand)),
    )
    shown = {"now": on_spot}
    monkeypatch.setattr(run_sky, "record", lambda _sky, _job: {"cluster_resources": shown["now"], "cloud": "GCP"})
    attempts = run_sky._Legs(ctx, job, [])
    for leg, now in enumerate((on_spot, on_demand)):  # spot first, then the on-demand recovery: an hour each
        shown["now"] = now
        attempts.begin(leg, 3600.0 * leg)
        attempts.priced(leg)
        attempts.end(leg, 3600.0 * (leg + 1), "attempt ended", killed=bool(leg == 0))
    rows = ctx.ledger.runs(run_id="r-spot")[0]["legs"]
    assert [(r["hourly_usd"], r["cost_usd"]) for r in rows] == [
        (pytest.approx(0.25), pytest.approx(0.25)),
        (pytest.approx(0.75), pytest.approx(0.75)),
    ]


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
    assert outcome.ok, failed(outcome)
    run = ledger_run(cfg)
    assert run["verdict"] == "pass" and len(run["legs"]) == 2
    assert run["preflight"] == {"gate": "skipped", "reason": SKIP}
    assert {leg["instance"] for leg in run["legs"]} == {job_id}  # one managed job, two attempts
    assert run["legs"][0]["killed"] and "SkyPilot recovered the job" in run["legs"][0]["end_reason"]
    pushed = [e["step"] for e in events(Path(run["legs"][0]["log_path"])) if e["event"] == "verify" and e["ok"]]
    resume = next(e for e in events(Path(run["legs"][1]["log_path"])) if e["event"] == "resume")
    assert resume["from_step"] == max(pushed)  # the newest verified before the preemption
    for kind, leg in (
        (Kind.RESUMED_NEWEST, 1),
        (Kind.LR, 1),
        (Kind.DATA_POSITION, 1),
        (Kind.LOSS_CONTINUITY, 1),
        (Kind.RUN_LENGTH, None),
        (Kind.RECOVERIES, None),
    ):
        assert check(outcome, kind, leg=leg)["ok"], (kind, checks_of(outcome))
    assert "recovery_count 1" in check(outcome, Kind.RECOVERIES)["detail"]
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


def test_launcher_stop_gets_a_verified_checkpoint_before_skypilot_deletes_the_machine(
    sky_project, cloud, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001, F811
    """SkyPilot 0.14.1's graceful cancel SIGTERMs the job and deletes its machine without waiting (the
    stand-in does the same), so the trainer's final push after the SIGTERM may never land. `launcher
    stop` says so first, waits until the leg has verified a checkpoint newer than the one at the
    request, and only then cancels: the stop ends with that checkpoint, verified and loadable."""
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
    said = stop.stderr.splitlines()
    first = next(i for i, line in enumerate(said) if "may not land" in line)
    assert said[first].startswith("the sky backend's SIGTERM deletes the machine right after it"), said
    assert first < next(i for i, line in enumerate(said) if line.startswith("SIGTERM -> leg 0")), said
    waited = st["waited"]
    assert waited["got"] is not None and (waited["after"] is None or waited["got"] > waited["after"]), waited
    assert st["checkpoint_step"] >= waited["got_step"] and st["detail"].startswith("stopped"), st["detail"]
    assert ("jobs.cancel", "1") in standin.calls
    run = ledger_run(cfg)
    assert run["verdict"] == "stopped" and len(run["legs"]) == 1
    logs = events(Path(run["legs"][0]["log_path"]))
    verified = next(e for e in logs if e["event"] == "verify" and e["ok"] and e["step"] == waited["got_step"])
    [attempt] = job_record(Path(cloud["PREFLIGHT_TEST_SKY_STATE"]), 1)["attempts"]
    assert attempt["outcome"] == "cancelled" and verified["t"] <= attempt["sigterm_at"] <= attempt["ended_at"]


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
    loop = check(outcome, Kind.PROGRESS)
    assert not loop["ok"] and "step-00000010" in loop["detail"], loop
    run = ledger_run(cfg)
    assert run["verdict"] == "fail" and 2 <= len(run["legs"]) <= 3

"""What is in flight on SkyPilot when the launcher is `kill -9`ed: a `sky.jobs.launch` still
bringing up the jobs controller, a `--retry-until-up` launch between attempts, a launch still
queued before any cluster record. SkyPilot's API server carries each on without its client.
The ledger named the leg (cluster or job name, then the request's id) before anything could
bill; the next launcher command cancels the request, SkyPilot says it ended, and the leg is
billed what ran: nothing, here. The first two on SkyPilot's own API server (offline: its requests
retry for ever against a cloud with no credentials); the queued launch on the strict stand-in
(tests/fakes/sky_standin.py), as SkyPilot's offline server queues nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.ledger.db import Ledger
from tests.helpers import LAUNCHER
from tests.sky.test_sky_live import cloud, ledger_run, strict  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]
ACTIVE = ("PENDING", "WAITING", "RUNNING")
ENDED = ("CANCELLED", "FAILED")
"""How a cancelled request ends on SkyPilot 0.14.1's server: CANCELLED, or FAILED where the request's
own process, SIGTERMed by the cancel while running, recorded its failure over it (launcher.backends.
skyapi.end_requests). Either way it is no longer working; the stand-in always says CANCELLED."""


def start_launcher(args: list[str], cwd: Path, env: dict[str, str], standin: bool) -> subprocess.Popen[str]:
    """The real launcher CLI in a process of its own; its `sky` the stand-in, or SkyPilot's client."""
    argv = [sys.executable, "-m", "tests.fakes.sky_standin", "launcher"] if standin else [str(LAUNCHER)]
    return subprocess.Popen(
        [*argv, *args],
        cwd=cwd,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_request(cfg, proc: subprocess.Popen[str], timeout_s: float = 180.0) -> dict:  # noqa: ANN001
    """Until the newest run's leg 0 has its request's id in the ledger; that leg's row."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the launcher ended first: {proc.stdout.read() if proc.stdout else ''}")
        if (cfg.state_path / "ledger.db").exists():
            runs = Ledger(cfg.state_path / "ledger.db")
            try:
                legs = (runs.runs() or [{}])[0].get("legs") or []
            finally:
                runs.close()
            if legs and legs[0].get("request_id"):
                return legs[0]
        time.sleep(0.2)
    raise AssertionError("no request id reached the ledger in time")


def request_status(sky, request_id: str) -> str:  # noqa: ANN001
    [payload] = sky.api_status([request_id])
    return str(getattr(payload.status, "value", payload.status))


def kill9_then_next_command(
    cfg,
    proc,
    sky,
    request_id: str,
    env: dict[str, str],  # noqa: ANN001
    standin: bool,
) -> subprocess.CompletedProcess[str]:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    time.sleep(1.0)
    assert request_status(sky, request_id) in ACTIVE  # SkyPilot carries it on without its client
    argv = [sys.executable, "-m", "tests.fakes.sky_standin", "launcher"] if standin else [str(LAUNCHER)]
    return subprocess.run(
        [*argv, "spend"],
        cwd=cfg.root,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_billed_nothing(cfg) -> dict:  # noqa: ANN001
    run = ledger_run(cfg)
    [leg] = run["legs"]
    assert run["verdict"] == "launcher died" and leg["ended_at"] and leg["killed"]
    assert leg["billed_gpu_hours"] == 0 and leg["cost_usd"] == 0 and run["billed_gpu_hours"] == 0
    ledger = Ledger(cfg.state_path / "ledger.db")
    settled = ledger.conn.execute("SELECT settled_gpu_hours, settled_usd FROM reservations").fetchone()
    ledger.close()
    assert tuple(settled) == (0, 0)
    return leg


def test_a_kill9_mid_request_is_cancelled_by_the_next_command_and_bills_nothing(
    sky_project,
    cloud,  # noqa: ANN001, F811
) -> None:
    """A launch still queued on the API server (PENDING, before any cluster record): the strict
    stand-in only, as SkyPilot's own offline server starts every request at once. The other two
    requests in flight (a jobs.launch submit, a --retry-until-up launch) run on SkyPilot's own server
    below."""
    args = ["up", "smoke", "--gpus", "T4:1", "--backend", "sky"]
    proc = start_launcher(args, sky_project.root, {**cloud, "PREFLIGHT_TEST_SKY_PENDING_S": "600"}, standin=True)
    leg = wait_for_request(sky_project, proc)
    watcher = strict(cloud)
    deadline = time.time() + 60
    while request_status(watcher, leg["request_id"]) != "PENDING" and time.time() < deadline:
        time.sleep(0.2)
    assert request_status(watcher, leg["request_id"]) == "PENDING"
    # The next command runs without the test's delays: its own requests are not queued for ten minutes.
    res = kill9_then_next_command(sky_project, proc, watcher, leg["request_id"], cloud, standin=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "was never provisioned" in res.stderr and "CANCELLED" in res.stderr, res.stderr
    assert request_status(watcher, leg["request_id"]) == "CANCELLED"  # SkyPilot says it ended
    assert "api_cancel" in [c for c, _ in watcher.calls]
    assert_billed_nothing(sky_project)
    assert watcher.get(watcher.status(cluster_names=[leg["instance"]])) == []


@pytest.mark.parametrize(
    "args, said",
    [
        (["up", "smoke", "--gpus", "T4:1", "--backend", "sky", "--retry-until-up"], "was never provisioned"),
        (["up", "run", "--gpus", "T4:1", "--backend", "sky", "--skip-preflight", "test"], "was never submitted"),
    ],
    ids=["retry-until-up launch", "jobs.launch submit"],
)
def test_a_kill9_mid_request_on_skypilots_own_server_is_cancelled_by_the_next_command(
    sky_project, args: list[str], said: str
) -> None:  # noqa: ANN001
    """SkyPilot's own API server, offline: a `--retry-until-up` launch retries for ever (killed
    between attempts: WAITING, no cluster record), and a `jobs.launch` waits on a jobs controller
    that cannot be provisioned (no cloud can be reached here). kill -9 of the launcher leaves the
    request working; the next command cancels it by the id the ledger kept, SkyPilot reports it
    ended, and nothing is billed (the ledger's leg, run and reservation settle at 0)."""
    import sky

    proc = start_launcher(args, sky_project.root, {}, standin=False)
    leg = wait_for_request(sky_project, proc)
    if args[1] == "smoke":  # between attempts: one failed already, the next waits, and no cluster record
        deadline = time.time() + 120
        while request_status(sky, leg["request_id"]) != "WAITING" and time.time() < deadline:
            time.sleep(0.2)
        assert request_status(sky, leg["request_id"]) == "WAITING"
        assert sky.get(sky.status(cluster_names=[leg["instance"]])) == []
    else:
        time.sleep(3.0)
    res = kill9_then_next_command(sky_project, proc, sky, leg["request_id"], {}, standin=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert said in res.stderr and any(s in res.stderr for s in ENDED), res.stderr
    assert request_status(sky, leg["request_id"]) in ENDED  # SkyPilot says it ended
    if args[1] == "smoke":
        assert sky.get(sky.status(cluster_names=[leg["instance"]])) == []
    else:
        assert leg["instance"].startswith("sky-job-submitting:")
        with pytest.raises(sky.exceptions.ClusterNotUpError):  # no jobs controller, so no job, was ever made
            sky.get(sky.jobs.queue_v2(refresh=False))
    assert_billed_nothing(sky_project)

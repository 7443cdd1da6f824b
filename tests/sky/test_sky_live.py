"""The sky backend's legs on live clusters: the strict stand-in (tests/fakes/sky_standin.py)
for the clusters (no cloud is reachable), SkyPilot's own API server for everything
that needs none (the optimizer's pick and price). Each leg's job runs the rendered
task's real setup and run, torchrun included, against the loopback Hub store."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import sky
from launcher import up as up_module
from launcher.backends.sky.api import optimizer_pick
from launcher.backends.sky.task import task_for_launch
from launcher.checks.evidence import Kind
from launcher.config.load import load_config
from launcher.errors import BadInput, Refused
from launcher.ledger.db import Ledger
from tests.fakes.sky_standin import StrictSky
from tests.helpers import SKY_IMAGE_REF as REF
from tests.helpers import check, edit_config, failed

REPO = Path(__file__).resolve().parents[2]


# One worker for every test whose stand-in clusters run the rendered `run:` script: it binds
# torchrun's rendezvous to port 29500 on the node (right on a cloud, one node a machine), and every
# stand-in cluster is this host, so two such legs at once collide (EADDRINUSE).
pytestmark = pytest.mark.xdist_group("sky-standin-port-29500")


@pytest.fixture
def cloud(sky_project, hub_server, tmp_path: Path) -> dict[str, str]:  # noqa: ANN001
    """Where the stand-in keeps its clusters, the image's /app (the reviewed files) and what
    a cloud machine reaches by itself (the loopback Hub standing in for huggingface.co)."""
    app = tmp_path / "app"
    ledger = Ledger(sky_project.state_path / "ledger.db")
    reviewed = ledger.latest_review().files
    ledger.close()
    for rel in reviewed:  # what the image bakes into /app
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sky_project.root / rel, app / rel)
    return {
        "PREFLIGHT_TEST_SKY_STATE": str(tmp_path / "sky-state"),
        "PREFLIGHT_TEST_SKY_APP": str(app),
        "PREFLIGHT_TEST_SKY_CLUSTER_ENV": json.dumps({"HF_ENDPOINT": hub_server.url, "HF_HUB_DISABLE_XET": "1"}),
    }


def strict(cloud: dict[str, str], **flags: bool) -> StrictSky:
    return StrictSky(
        Path(cloud["PREFLIGHT_TEST_SKY_STATE"]),
        Path(cloud["PREFLIGHT_TEST_SKY_APP"]),
        cluster_env=json.loads(cloud["PREFLIGHT_TEST_SKY_CLUSTER_ENV"]),
        **flags,
    )


def run_sky(
    cfg,
    monkeypatch: pytest.MonkeyPatch,
    standin: StrictSky,
    rung: str,
    gpus: str | None,  # noqa: ANN001, ANN201
    nodes: int = 1,
):
    monkeypatch.setattr("launcher.backends.sky.backend.sky_module", lambda: standin)
    return up_module.up(cfg, cfg.root / "launcher.yaml", rung, "sky", gpus, lambda leg, line: None, nodes=nodes)


def ledger_run(cfg) -> dict:  # noqa: ANN001
    ledger = Ledger(cfg.state_path / "ledger.db")
    try:
        return ledger.runs()[0]
    finally:
        ledger.close()


def test_every_leg_a_fresh_cluster_downed_and_billed_at_skypilots_price(
    sky_project,
    cloud,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """T4:1 smoke on 2 nodes, three legs: each on a new cluster, each downed; each priced by
    SkyPilot's optimizer on the vendored catalog (host VM included), billed per started minute
    for both nodes; legs 1 and 2 pinned to where leg 0 landed. Each leg ran the rendered `run:`
    script on each node (SkyPilot's node variables, torchrun's static rendezvous at the head's
    address), every rank's events in the one job log, a worker's prefixed as SkyPilot prefixes
    them. (Until session 14 the two nodes had a 3-leg smoke of their own.)"""
    standin = strict(cloud)
    outcome = run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1", nodes=2)
    # The stand-in's "GPUs" are this CPU: smoke's device checks say no; everything else holds.
    bad = failed(outcome)
    assert sorted((c["kind"], c.get("leg", -1)) for c in bad) == [(Kind.ON_ACCELERATOR, i) for i in range(3)], bad
    launched = standin.clusters_of("launch")
    assert len(launched) == len(set(launched)) == 3
    assert standin.clusters_of("down") == launched  # down for every leg, in order
    run = ledger_run(sky_project)
    assert run["image"] == REF and run["backend"] == "sky" and run["cost_source"] == "skypilot optimizer"
    assert run["nodes"] == 2
    rendered = sky_project.state_path / "runs" / run["id"] / "leg-0.sky.yaml"
    pick = optimizer_pick(sky, task_for_launch(sky, rendered, {}))  # SkyPilot's own pick, asked directly
    assert pick.cloud == "GCP"  # T4:2's pick, n1-highmem-8 at $1.17/h, is test_sky.py's and test_sky_real.py's
    per_node = pick.hourly_usd / 2  # the pick is priced for the task: both nodes
    assert per_node > sky_project.prices["T4"]  # the host VM is billed too: GPU prices alone undercount
    for leg in run["legs"]:
        # The exit code is the trainer's own (from its events), not tail_logs' JobExitCode.
        assert leg["exit_code"] == 0 and leg["task_sha256"] and leg["command"][:2] == ["sky", "launch"]
        billed_s = math.ceil((leg["ended_at"] - leg["started_at"]) / 60) * 60
        assert leg["billed_gpu_hours"] == pytest.approx(billed_s / 3600 * 2)  # two nodes x one GPU
        assert leg["hourly_usd"] == pytest.approx(per_node)
        assert leg["cost_usd"] == pytest.approx(billed_s / 3600 * pick.hourly_usd)
        assert leg["cost_source"] == "skypilot optimizer"
        assert leg["placement"]["instance_type"] == pick.instance_type and leg["placement"]["use_spot"] == "false"
        log = Path(leg["log_path"]).read_text(errors="replace")
        sessions = [
            json.loads(line[line.index('{"event": ') :]) for line in log.splitlines() if '{"event": "session"' in line
        ]
        assert sorted(e.get("node", 0) for e in sessions) == [0, 1], sessions  # one rank on each node
        assert "(worker1, rank=1, pid=" in log
    leg1 = yaml.safe_load((rendered.parent / "leg-1.sky.yaml").read_text())
    pinned = leg1["resources"]
    assert pinned["instance_type"] == pick.instance_type and pinned["cloud"] == "gcp" and pinned["use_spot"] is False
    # leg 1's deadline is counted from its resume, not guessed from leg 0's start-up, and the leg
    # holds itself at its planned step until the deadline is due (a faster leg 1 once ran past it)
    assert float(leg1["envs"]["LAUNCHER_DEADLINE_AFTER_RESUME"]) > 5.0 and leg1["envs"]["LAUNCHER_HOLD_AT_STEP"] == "20"
    assert leg1["envs"]["LAUNCHER_HOLD_DEADLINE_S"] == "0.25"  # the hold places the deadline: a quarter second
    assert "LAUNCHER_DEADLINE_AFTER_RESUME" not in yaml.safe_load(rendered.read_text())["envs"]
    assert run["cost_usd"] == pytest.approx(sum(leg["cost_usd"] for leg in run["legs"]))


def test_a_failed_setup_is_a_failed_leg_still_downed_and_billed(
    sky_project,
    cloud,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template = yaml.safe_load((REPO / "sky" / "smoke.yaml").read_text())
    (sky_project.root / "sky").mkdir()
    (sky_project.root / "sky" / "smoke.yaml").write_text(yaml.safe_dump({**template, "setup": "exit 1"}))
    standin = strict(cloud)
    outcome = run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1")
    assert outcome.exit_code == 1
    assert standin.clusters_of("down") == standin.clusters_of("launch") and len(standin.clusters_of("launch")) == 1
    assert not check(outcome, Kind.LEG_FINISHED, leg=0)["ok"]
    [leg] = ledger_run(sky_project)["legs"]
    assert leg["billed_gpu_hours"] == pytest.approx(60 / 3600)  # the one-minute minimum is billed all the same


@pytest.mark.parametrize(
    "flag, error, needle, code",
    [
        ("no_cloud", BadInput, "SkyPilot could not launch: NoCloudAccessError", 2),
        ("capacity", Refused, "SkyPilot found no capacity", 3),
        ("credentials", BadInput, "no cloud credentials SkyPilot could use: .*CloudUserIdentityError", 2),
    ],
)
def test_launch_refusals_bill_nothing_and_leave_nothing(
    sky_project,
    cloud,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
    flag: str,
    error: type,
    needle: str,
    code: int,
) -> None:
    standin = strict(cloud, **{flag: True})
    with pytest.raises(error, match=needle) as err:
        run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1")
    if flag == "capacity":
        assert "--retry-until-up" in err.value.hint
    if flag == "credentials":  # waiting for capacity cannot help: no retry hint
        assert "retry" not in err.value.hint and "sky check" in err.value.hint
    assert standin.clusters_of("down") == []  # SkyPilot said no cluster exists: nothing to tear down
    assert standin.clusters_of("status")  # ... and it was asked, not assumed
    run = ledger_run(sky_project)
    ledger = Ledger(sky_project.state_path / "ledger.db")
    held = ledger.conn.execute("SELECT settled_gpu_hours FROM reservations").fetchone()[0]
    ledger.close()
    assert run["exit_code"] == code and run["billed_gpu_hours"] == 0 and held == 0
    assert [leg["billed_gpu_hours"] for leg in run["legs"]] == [0.0]


def launcher_with_standin(args: list[str], cwd: Path, cloud: dict[str, str]) -> subprocess.Popen[str]:
    """The real launcher CLI in a process of its own, its `sky` the stand-in."""
    env = {**os.environ, **cloud, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.sky_standin", "launcher", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_step(cfg, proc: subprocess.Popen[str], timeout_s: float = 180) -> dict:  # noqa: ANN001
    """Until leg 0 of the newest run printed a step; that leg's ledger row."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        runs = sorted((cfg.state_path / "runs").glob("*/leg-0.log")) if (cfg.state_path / "runs").exists() else []
        if runs and '"event": "step"' in runs[-1].read_text(errors="replace"):
            return ledger_run(cfg)["legs"][0]
        time.sleep(0.2)
    raise AssertionError("leg 0 printed no step in time")


def test_a_killed_launchers_cluster_is_found_downed_and_billed_by_the_next_command(sky_project, cloud) -> None:  # noqa: ANN001
    """kill -9 of `launcher up smoke --backend sky` mid-leg: the cluster bills on (SkyPilot
    would not stop it); the YAML it runs carries the backstops; the next launcher command
    asks SkyPilot, downs the cluster and settles the leg's billed time to that moment."""
    proc = launcher_with_standin(["up", "smoke", "--gpus", "T4:1", "--backend", "sky"], sky_project.root, cloud)
    leg = wait_for_step(sky_project, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    watcher = strict(cloud)
    [status] = watcher.get(watcher.status(cluster_names=[leg["instance"]]))
    assert status.status == sky.ClusterStatus.UP  # the launcher is gone, its cluster is not
    task = yaml.safe_load(Path(leg["log_path"]).with_suffix(".sky.yaml").read_text())
    assert task["resources"]["autostop"] == {"idle_minutes": 10, "down": True}
    assert (
        "timeout --foreground --signal=TERM" in task["run"] and int(task["envs"]["PREFLIGHT_HARD_STOP"]) > time.time()
    )
    before = time.time()
    env = {**os.environ, **cloud, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-m", "tests.fakes.sky_standin", "launcher", "spend"],
        cwd=sky_project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "was still up: taken down" in res.stderr
    assert leg["instance"] in watcher.clusters_of("down")
    assert watcher.get(watcher.status(cluster_names=[leg["instance"]])) == []
    run = ledger_run(sky_project)
    [dead] = [x for x in run["legs"] if x["leg"] == 0]
    assert run["verdict"] == "launcher died" and dead["ended_at"] >= before
    billed_s = math.ceil((dead["ended_at"] - dead["started_at"]) / 60) * 60
    assert dead["billed_gpu_hours"] == pytest.approx(billed_s / 3600)
    assert dead["cost_usd"] == pytest.approx(billed_s / 3600 * dead["hourly_usd"])
    ledger = Ledger(sky_project.state_path / "ledger.db")
    settled = ledger.conn.execute("SELECT settled_gpu_hours, settled_how FROM reservations").fetchone()
    ledger.close()
    assert settled[0] == pytest.approx(run["billed_gpu_hours"]) and "cluster's end" in settled[1]


def test_sigterm_tears_the_cluster_down_as_ctrl_c_does(sky_project, cloud) -> None:  # noqa: ANN001
    proc = launcher_with_standin(["up", "smoke", "--gpus", "T4:1", "--backend", "sky"], sky_project.root, cloud)
    leg = wait_for_step(sky_project, proc)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    watcher = strict(cloud)
    assert leg["instance"] in watcher.clusters_of("down")
    assert watcher.get(watcher.status(cluster_names=[leg["instance"]])) == []
    run = ledger_run(sky_project)
    assert run["verdict"] == "interrupted" and all(x["ended_at"] for x in run["legs"])


def test_the_usd_budget_is_guarded_at_skypilots_price_not_the_gpus_alone(
    sky_project,
    cloud,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3 smoke legs x 10 min of T4:2: $0.35 at the config's GPU prices, $0.585 at SkyPilot's
    (n1-highmem-8 with its two T4s, $1.17/h). A $0.50 budget fits the first and not the second."""
    edit_config(sky_project.root, quota__budget_usd=0.5)
    cfg = load_config(sky_project.root / "launcher.yaml")
    standin = strict(cloud)
    with pytest.raises(Refused, match=r"\$0\.58 > budget \$0\.5"):
        run_sky(cfg, monkeypatch, standin, "smoke", "T4:2")
    assert standin.clusters_of("launch") == []


def test_a_kill_right_after_launch_leaves_no_cluster_provisioning(sky_project, cloud, tmp_path: Path) -> None:  # noqa: ANN001
    """Ctrl-C in the first instant: the launch request may be in flight on the API server,
    which would carry it on without us. The kill cancels it, then downs whatever exists."""
    from launcher.backends.base import LegSpec
    from launcher.backends.sky.backend import SkyBackend
    from launcher.config.schema import parse_gpus

    standin = strict(cloud)
    backend = SkyBackend(sky_project, REF, sky=standin)
    env = {
        "LAUNCHER_RUN_ID": "quick",
        "LAUNCHER_LEG": "0",
        "LAUNCHER_RUNG": "smoke",
        "LAUNCHER_STORE": "hf://tester/ckpts",
        "LAUNCHER_MAX_STEPS": "100000",
        "LAUNCHER_DEADLINE": str(int(time.time() + 600)),
        "LAUNCHER_FILES_SHA256": "{}",
    }
    recorded: list[str] = []
    handle = backend.launch(
        LegSpec(
            "quick", 0, "smoke", ("python", "train.py"), env, log_path=tmp_path / "leg-0.log", gpus=parse_gpus("T4:1")
        ),
        on_instance=lambda h: recorded.append(h.instance),
    )
    assert recorded == [handle.instance]  # named before anything was sent
    result = backend.kill(handle, reason="interrupted")
    assert result.killed and result.end_reason.startswith("interrupted")
    # The kill either stopped the request being sent (0) or cancelled it (1); once none has a
    # live worker, nothing can provision this cluster later.
    assert standin.wait_requests_ended("launch", handle.instance) in (0, 1)
    assert standin.get(standin.status(cluster_names=[handle.instance])) == []

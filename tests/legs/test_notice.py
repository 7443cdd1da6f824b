"""The spot notice watcher (runtime/programs/notice.py) against a loopback metadata service in each cloud's
dialect (tests/fakes/metadata_server.py), and the rendered `run:` script carrying it: on a GCP notice
the trainer stops, its final checkpoint verifies, and the script exits EXIT_PREEMPTED."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.contract import EXIT_PREEMPTED, leg_env
from runtime.events import parse_line
from tests.fakes.metadata_server import MetadataServer

ROOT = Path(__file__).resolve().parents[2]
GROUP = 'python -m runtime.programs.notice --mark "$MARK" --parent $$ --every 0.1 & sleep 30\n'


def group(env: dict[str, str], mark: Path) -> subprocess.Popen:
    """A stand-in leg: a shell whose `sleep` a SIGTERM to the group ends, the watcher beside it."""
    return subprocess.Popen(
        ["bash", "-c", GROUP],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(mark), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "cloud,says",
    [
        ("AWS", "spot/instance-action terminate at 2026-12-04T12:00:00Z"),
        ("GCP", "instance/preempted TRUE"),
        ("Azure", "scheduled event Preempt, not before Fri, 04 Dec 2026 12:00:30 GMT"),
    ],
)
def test_a_notice_in_each_clouds_dialect_sigterms_the_leg_once(cloud: str, says: str, tmp_path: Path) -> None:
    with MetadataServer() as meta:
        env = {"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": cloud}), "PREFLIGHT_METADATA_URL": meta.url}
        proc = group(env, tmp_path / "mark")
        time.sleep(1.0)
        assert proc.poll() is None and not (tmp_path / "mark").exists()  # polled, no notice yet
        meta.announce()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == -15 or proc.returncode == 143, (proc.returncode, err)  # the group's SIGTERM
    assert (tmp_path / "mark").read_text() == says + "\n"
    [event] = [json.loads(line[line.find("{") :]) for line in out.splitlines() if '"event": "notice"' in line]
    assert (event["cloud"], event["detail"]) == (cloud.lower(), says)
    if cloud == "AWS":
        assert meta.requests["/latest/api/token"] >= 2  # IMDSv2: a token before each read


@pytest.mark.unit
def test_no_cloud_named_is_no_watch_and_a_dead_metadata_service_is_polled_on(tmp_path: Path) -> None:
    """Each says so once, as a `log` event: info where nothing is missed (off a cloud, or on
    Kubernetes), a warning where a spot leg goes without its notice (a cloud with no dialect)."""
    host = {k: v for k, v in os.environ.items() if k != "SKYPILOT_CLUSTER_INFO"}
    for cloud, level in ((None, "info"), ("Kubernetes", "info"), ("Lambda", "warning")):
        env = {"SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": cloud})} if cloud else {}
        done = subprocess.run(
            [sys.executable, "-m", "runtime.programs.notice", "--mark", str(tmp_path / "m"), "--parent", "1"],
            env={**host, "PYTHONPATH": str(ROOT), **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        [said] = [parse_line(line) for line in done.stdout.splitlines()]
        assert done.returncode == 0 and not done.stderr, done.stderr
        assert said is not None and (said["event"], said["level"]) == ("log", level), said
        assert "no metadata notice to watch" in said["message"] and said["source"] == "notice watcher"
    with socket.socket() as s:  # a port nobody answers on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = group({"SKYPILOT_CLUSTER_INFO": '{"cloud": "GCP"}', "PREFLIGHT_METADATA_URL": dead}, tmp_path / "mark")
    time.sleep(1.0)
    assert proc.poll() is None  # still sleeping: an unreachable service is no notice
    os.killpg(proc.pid, 9)
    out, _ = proc.communicate(timeout=10)
    [said] = [e for e in map(parse_line, out.splitlines()) if e and "did not answer" in e.get("message", "")]
    assert said["level"] == "warning" and not (tmp_path / "mark").exists()


def test_the_rendered_run_script_stops_on_a_gcp_notice_and_exits_preempted(project: Path, tmp_path: Path) -> None:
    """The very `run:` a sky leg executes (leg_script), torchrun and the reference trainer: the
    metadata flips at step 8; the trainer stops on the SIGTERM, its final checkpoint verifies
    within GCP's 25 s, and the script exits EXIT_PREEMPTED (the managed job then recovers)."""
    from launcher.backends.sky.task import leg_script, train_args
    from launcher.config.load import load_config

    cfg = load_config(project / "launcher.yaml")
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(project / "train.py", app / "train.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    now = time.time()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LAUNCHER_APP_DIR": str(app),
        "OMP_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python and torchrun, as in the image
        "LAUNCHER_TRAIN_ARGS": train_args(cfg.trainer.command),
        "PREFLIGHT_MASTER_PORT": str(port),
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "PREFLIGHT_HARD_STOP": str(int(now + 600)),
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "GCP"}),
        **leg_env(
            run_id="notice-run",
            leg=0,
            rung="smoke",
            store=(tmp_path / "store").as_uri(),
            max_steps=400,
            deadline=now + 600,
            on_gpu=False,
            files_sha256={"train.py": hashlib.sha256((app / "train.py").read_bytes()).hexdigest()},
        ),
    }
    events: list[dict] = []
    lines: list[str] = []
    with MetadataServer() as meta:
        env["PREFLIGHT_METADATA_URL"] = meta.url
        proc = subprocess.Popen(
            ["bash", "-c", leg_script(cfg, "smoke")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            for line in proc.stdout:
                lines.append(line)
                if '{"event": ' in line:
                    events.append(json.loads(line[line.find('{"event": ') :]))
                    if events[-1]["event"] == "step" and events[-1]["step"] == 8:
                        meta.announce()
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    by = {e["event"]: e for e in events}  # the last of each kind
    assert code == EXIT_PREEMPTED, "".join(lines[-30:])
    assert by["notice"]["cloud"] == "gcp" and by["stop"]["reason"] == "sigterm"
    stopped = by["stop"]["step"]
    assert 8 <= stopped < 400 and by["done"]["final_checkpoint_verified"] and by["done"]["step"] == stopped
    verify = next(e for e in events if e["event"] == "verify" and e["step"] == stopped and e["ok"])
    assert verify["t"] - by["notice"]["t"] < 25, (verify["t"], by["notice"]["t"])

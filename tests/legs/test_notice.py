"""The rendered `run:` script carrying the spot notice watcher (runtime/programs/notice.py; its own
cases against each cloud's metadata service are tests/unit/test_notice_watcher.py): on a GCP
notice the trainer stops, its final checkpoint verifies, and the script exits EXIT_PREEMPTED."""

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

from runtime.contract import EXIT_PREEMPTED, leg_env
from tests.fakes.metadata_server import MetadataServer

ROOT = Path(__file__).resolve().parents[2]


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

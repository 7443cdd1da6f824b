"""The spot notice watcher (runtime/programs/notice.py) against a loopback metadata service in each
cloud's dialect (tests/fakes/metadata_server.py): a notice SIGTERMs the leg's group once; off a
cloud, or on one with no dialect, it says so; a dead metadata service is polled on. The rendered
`run:` script stopped by a notice is tests/legs/test_notice.py's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        # polled, no notice yet: wait for the watcher's first answered read (not a fixed second: a
        # loaded machine starts its interpreter later, and a notice it found on its first read
        # would leave AWS one token request, not the two this test asks for)
        reads = {"AWS": "/latest/meta-data/spot/instance-action", "GCP": "/computeMetadata/v1/instance/preempted"}
        path = reads.get(cloud, "/metadata/scheduledevents?api-version=2020-07-01")
        waited = time.monotonic() + 30
        while meta.requests[path] < 1 and time.monotonic() < waited and proc.poll() is None:
            time.sleep(0.05)
        assert meta.requests[path] >= 1 and proc.poll() is None and not (tmp_path / "mark").exists()
        meta.announce()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == -15 or proc.returncode == 143, (proc.returncode, err)  # the group's SIGTERM
    assert (tmp_path / "mark").read_text() == says + "\n"
    [event] = [json.loads(line[line.find("{") :]) for line in out.splitlines() if '"event": "notice"' in line]
    assert (event["cloud"], event["detail"]) == (cloud.lower(), says)
    if cloud == "AWS":
        assert meta.requests["/latest/api/token"] >= 2  # IMDSv2: a token before each read


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

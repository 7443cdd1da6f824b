"""The sky stand-in (tests/sky_standin.py) is strict: SkyPilot's own signatures,
errors and secret handling, jobs that really run setup then run, and clusters and
requests that outlive the process that asked for them. Small shell tasks only."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sky

from tests.sky_standin import JOB_CANCELLED, JOB_FAILED, JOB_NOT_FINISHED, JOB_NOT_FOUND, JOB_SUCCEEDED, StrictSky

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def app(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "train.py").write_text("print('the reviewed trainer')\n")
    return app


@pytest.fixture
def fake(tmp_path: Path, app: Path) -> StrictSky:
    return StrictSky(tmp_path / "state", app)


def task(**config: object) -> sky.Task:
    return sky.Task.from_yaml_config({"name": "t", **config})


def run_job(fake: StrictSky, cluster: str, t: sky.Task) -> tuple[int, str]:
    """launch -> stream -> tail, as the sky backend does: (tail_logs' code, the job's output)."""
    launch_out, job_out = io.StringIO(), io.StringIO()
    job_id, handle = fake.stream_and_get(fake.launch(t, cluster_name=cluster), output_stream=launch_out)
    assert (job_id, handle.launched_nodes) == (1, 1) and f"provisioning {cluster}" in launch_out.getvalue()
    return fake.tail_logs(cluster, job_id, follow=True, output_stream=job_out), job_out.getvalue()


def session_alive(sid: int) -> bool:
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[3] == str(sid) and stat[0] != "Z":
            return True
    return False


def test_exit_codes_and_attributes_are_skypilots(fake: StrictSky) -> None:
    codes = sky.exceptions.JobExitCode
    assert (JOB_SUCCEEDED, JOB_FAILED, JOB_NOT_FINISHED, JOB_NOT_FOUND, JOB_CANCELLED) == (
        codes.SUCCEEDED, codes.FAILED, codes.NOT_FINISHED, codes.NOT_FOUND, codes.CANCELLED)
    assert (fake.Task, fake.Dag, fake.Resources, fake.exceptions) == (sky.Task, sky.Dag, sky.Resources,
                                                                      sky.exceptions)


def test_an_argument_the_real_sdk_lacks_is_a_type_error(fake: StrictSky) -> None:
    t = task(run="echo hi")
    with pytest.raises(TypeError, match="no_such_flag"):
        fake.launch(t, cluster_name="c", no_such_flag=True)
    with pytest.raises(TypeError):
        fake.down("c", force=True)  # `sky down --force` is not an SDK argument
    with pytest.raises(TypeError):
        fake.tail_logs("c", 1)  # follow has no default
    with pytest.raises(TypeError):
        fake.cancel(job_ids=[1])  # cluster_name is required
    assert fake.calls == [] and not any((fake.state_dir / "requests").iterdir())


def test_a_secret_without_a_value_fails_with_skypilots_own_error(fake: StrictSky) -> None:
    rid = fake.launch(task(run="echo hi", secrets={"X": None}), cluster_name="c")
    with pytest.raises(RuntimeError, match=r"No value available for secret\(s\): X\. A secret with no inline value"):
        fake.stream_and_get(rid, output_stream=io.StringIO())
    assert not any((fake.state_dir / "clusters").iterdir())


def test_a_missing_cluster_is_skypilots_cluster_does_not_exist(fake: StrictSky) -> None:
    with pytest.raises(sky.exceptions.ClusterDoesNotExist, match="Cluster 'nope' does not exist."):
        fake.get(fake.down("nope"))
    with pytest.raises(sky.exceptions.ClusterDoesNotExist):
        fake.tail_logs("nope", 1, follow=True)
    assert fake.clusters_of("down") == ["nope"]


def test_a_failed_setup_is_failed_and_its_run_never_runs(fake: StrictSky) -> None:
    code, out = run_job(fake, "c-setup", task(setup="echo in-setup; exit 3", run="echo RUN-RAN"))
    assert code == JOB_FAILED and "in-setup" in out and "RUN-RAN" not in out
    fake.get(fake.down("c-setup"))


def test_the_job_gets_envs_secret_values_and_node_variables_but_not_the_callers_env(
        fake: StrictSky, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLER_ONLY", "leaked")
    run = 'echo "$A" "$SKYPILOT_NUM_GPUS_PER_NODE" "$S" "${CALLER_ONLY:-unset}"; cat "$LAUNCHER_APP_DIR/train.py"'
    t = task(run=run,
             envs={"A": "env-a"}, secrets={"S": "sekrit-9f3a"}, resources={"accelerators": "T4:2"})
    code, out = run_job(fake, "c-env", t)
    assert code == JOB_SUCCEEDED and "env-a 2 sekrit-9f3a unset" in out and "the reviewed trainer" in out
    [record] = fake.get(fake.status(["c-env", "absent"]))  # a name that does not exist is simply omitted
    assert record.status == sky.ClusterStatus.UP and record.accelerators == "T4:2"
    assert "sekrit-9f3a" not in (record.last_creation_yaml or "")
    # The secret's value reaches the job's environment only: no file of the stand-in's holds it.
    for path in (fake.state_dir).rglob("*"):
        if path.is_file() and path.name != "job.log":
            assert b"sekrit-9f3a" not in path.read_bytes(), path
    fake.get(fake.down("c-env"))


def test_a_cluster_outlives_the_object_that_launched_it(tmp_path: Path, app: Path) -> None:
    first = StrictSky(tmp_path / "state", app)
    rid = first.launch(task(run="timeout 60 sleep 60"), cluster_name="c-long")  # timeout: its own process group
    first.stream_and_get(rid, output_stream=io.StringIO())
    job = (tmp_path / "state" / "clusters" / "c-long" / "job.json").read_text()
    del first
    second = StrictSky(tmp_path / "state", app)
    [record] = second.get(second.status())
    assert record.name == "c-long" and record.status == sky.ClusterStatus.UP
    with pytest.raises(RuntimeError, match="already exists"):  # never reused: every leg gets a fresh cluster
        second.get(second.launch(task(run="echo again"), cluster_name="c-long"))
    sid = int(job.split('"pgid": ')[1].split(",")[0])
    assert session_alive(sid)
    second.get(second.down("c-long"))
    assert not session_alive(sid)  # the job died with its cluster, `timeout`'s own process group too
    [report] = second.get(second.cost_report())
    assert report["name"] == "c-long" and report["status"] is None and report["duration"] >= 0
    assert [c for c, _ in second.calls].count("launch") == 2


def test_a_request_survives_its_client(tmp_path: Path, app: Path) -> None:
    state = tmp_path / "state"
    client = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        import sky
        from tests.sky_standin import StrictSky
        fake = StrictSky(Path({str(state)!r}), Path({str(app)!r}))
        t = sky.Task.from_yaml_config({{"name": "t", "run": "echo survived"}})
        print(fake.launch(t, cluster_name="c-orphan"), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", client], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        rid = proc.stdout.readline().strip()
        os.kill(proc.pid, signal.SIGKILL)  # right after launch() returned, before anything resolved it
    finally:
        proc.kill()
        proc.wait()
    later = StrictSky(state, app)
    job_id, handle = later.get(rid)
    assert (job_id, handle.launched_resources.cloud) == (1, "GCP")
    out = io.StringIO()
    assert later.tail_logs("c-orphan", job_id, follow=True, output_stream=out) == JOB_SUCCEEDED
    assert "survived" in out.getvalue()
    later.get(later.down("c-orphan"))


def test_no_cloud_no_capacity_and_a_cancelled_request_provision_nothing(tmp_path: Path, app: Path) -> None:
    t = task(run="echo hi", resources={"accelerators": "A100:8"})
    no_cloud = StrictSky(tmp_path / "state", app, no_cloud=True).launch(t, cluster_name="c-a")
    full = StrictSky(tmp_path / "state", app, capacity=True)
    no_capacity = full.launch(t, cluster_name="c-b")
    forever = full.launch(t, cluster_name="c-c", retry_until_up=True)
    fake = StrictSky(tmp_path / "state", app)
    with pytest.raises(sky.exceptions.NoCloudAccessError):
        fake.get(no_cloud)
    with pytest.raises(sky.exceptions.ResourcesUnavailableError, match="A100:8"):
        fake.get(no_capacity)
    assert fake.get(fake.api_cancel(forever)) == [forever]
    with pytest.raises(sky.exceptions.RequestCancelled):
        fake.get(forever)
    assert not any((tmp_path / "state" / "clusters").iterdir())
    with pytest.raises(NotImplementedError, match="num_nodes=2"):  # multi-node is not emulated: refused
        fake.get(fake.launch(task(run="echo hi", num_nodes=2), cluster_name="c-d"))

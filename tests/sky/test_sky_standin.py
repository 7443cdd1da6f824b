"""The sky stand-in (tests/fakes/sky_standin.py) is strict: SkyPilot's own signatures,
errors and secret handling, jobs that really run setup then run, and clusters and
requests that outlive the process that asked for them. Small shell tasks only."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

import sky
from tests.fakes.sky_proc import _start_time
from tests.fakes.sky_standin import (
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_NOT_FINISHED,
    JOB_NOT_FOUND,
    JOB_SUCCEEDED,
    StrictSky,
    job_record,
    preempt_job,
    shutdown_jobs,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def app(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "train.py").write_text("print('the reviewed trainer')\n")
    return app


@pytest.fixture
def fake(tmp_path: Path, app: Path) -> Iterator[StrictSky]:
    yield StrictSky(tmp_path / "state", app)
    shutdown_jobs(tmp_path / "state")  # no managed job's controller outlives its test


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
        codes.SUCCEEDED,
        codes.FAILED,
        codes.NOT_FINISHED,
        codes.NOT_FOUND,
        codes.CANCELLED,
    )
    assert (fake.Task, fake.Dag, fake.Resources, fake.exceptions) == (sky.Task, sky.Dag, sky.Resources, sky.exceptions)


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
    fake: StrictSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALLER_ONLY", "leaked")
    run = 'echo "$A" "$SKYPILOT_NUM_GPUS_PER_NODE" "$S" "${CALLER_ONLY:-unset}"; cat "$LAUNCHER_APP_DIR/train.py"'
    t = task(run=run, envs={"A": "env-a"}, secrets={"S": "sekrit-9f3a"}, resources={"accelerators": "T4:2"})
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
        from tests.fakes.sky_standin import StrictSky
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


def wait_until_retrying(rdir: Path, fake: StrictSky, rid: str, timeout_s: float = 120.0) -> None:
    """Until the retry_until_up launch is in its retry loop (its log says so), so that the cancel
    lands on a launch waiting for capacity; a launch that ended instead raises its own error here."""
    deadline = time.monotonic() + timeout_s
    while "retrying in" not in (rdir / "request.log").read_text():
        if (rdir / "result.pkl").exists():
            fake.get(rid)
            pytest.fail("the retry_until_up launch ended without capacity")
        assert time.monotonic() < deadline, "the retry_until_up launch never reached its retry loop"
        time.sleep(0.1)


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
    wait_until_retrying(tmp_path / "state" / "requests" / forever, fake, forever)
    assert fake.get(fake.api_cancel(forever)) == [forever]
    with pytest.raises(sky.exceptions.RequestCancelled):
        fake.get(forever)
    assert not any((tmp_path / "state" / "clusters").iterdir())


def test_a_cluster_of_two_nodes_runs_the_job_on_each_with_skypilots_node_variables(fake: StrictSky) -> None:
    """Each node a disk and a session of its own, SkyPilot's node variables, one job log with the
    worker's lines prefixed as `sky logs` shows them; the job fails if any node fails; down kills all."""
    run = (
        'echo "node=$SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES ips=$(echo "$SKYPILOT_NODE_IPS" | wc -l) '
        'home=$HOME"; touch "$HOME/mine"; ls "$HOME"; [ "$SKYPILOT_NODE_RANK" = 0 ] || exit 7'
    )
    job_id, _handle = fake.get(fake.launch(task(run=run, num_nodes=2), cluster_name="two-nodes"))
    out = io.StringIO()
    code = fake.tail_logs("two-nodes", job_id, follow=True, output_stream=out)
    text = out.getvalue()
    assert "node=0 of 2 ips=2" in text and "node=1 of 2 ips=2" in text, text
    worker = next(line for line in text.splitlines() if "node=1" in line)
    assert worker.startswith("(worker1, rank=1, pid=") and "ip=127.0.0.1) node=1" in worker
    homes = {line.split("home=")[1] for line in text.splitlines() if "home=" in line}
    assert len(homes) == 2  # a disk each
    assert code == JOB_FAILED  # node 1 exited 7: the job failed
    [status] = fake.get(fake.status(cluster_names=["two-nodes"]))
    assert status.nodes == 2
    fake.get(fake.down("two-nodes"))
    assert fake.get(fake.status(cluster_names=["two-nodes"])) == []


def test_down_ends_every_process_of_the_node_whatever_session_it_made(fake: StrictSky, app: Path) -> None:
    """A deleted machine takes every process on it: torchrun starts each rank in a session of its own,
    and a job may setsid a child. Down ends them all (issue 50: ranks trained on after a down, which
    then failed on the files they kept writing), then removes the cluster's disk."""
    (app / "rank.py").write_text(
        "import os, time\nprint(f'rank pid={os.getpid()} sid={os.getsid(0)}', flush=True)\ntime.sleep(600)\n"
    )
    run = 'setsid sleep 600 & echo "child pid=$!"; torchrun --standalone --nproc_per_node 2 "$LAUNCHER_APP_DIR/rank.py"'
    fake.get(fake.launch(task(run=run), cluster_name="ranks"))
    log = fake.state_dir / "clusters" / "ranks" / "job.log"
    wait_until(lambda: log.read_text().count("rank pid=") == 2, timeout_s=180)
    text = log.read_text()
    ranks = [(int(pid), int(sid)) for pid, sid in re.findall(r"rank pid=(\d+) sid=(\d+)", text)]
    assert all(pid == sid for pid, sid in ranks), text  # each rank leads a session of its own
    pids = [pid for pid, _ in ranks] + [int(re.search(r"child pid=(\d+)", text).group(1))]
    started = {pid: _start_time(pid) for pid in pids}
    assert all(started.values()), started
    fake.get(fake.down("ranks"))
    assert [pid for pid in pids if _start_time(pid) == started[pid]] == []  # none is left
    assert not (fake.state_dir / "clusters" / "ranks").exists()


# ---------------------------------------------------------------- managed jobs (sky.jobs)

ManagedJobStatus = sky.jobs.ManagedJobStatus


def launch_job(fake: StrictSky, t: sky.Task, name: str | None = None) -> int:
    """jobs.launch -> get, as a launcher submits a managed job: its id."""
    return launch_jobs(fake, (t, name))[0]


def launch_jobs(fake: StrictSky, *jobs: tuple[sky.Task, str | None]) -> list[int]:
    """Submit every launch first (their workers run side by side), then get each: the job ids."""
    rids = [fake.jobs.launch(t, name=name) for t, name in jobs]
    ids = []
    for rid in rids:
        job_ids, handle = fake.stream_and_get(rid, output_stream=io.StringIO())
        assert handle is None and isinstance(job_ids, list) and len(job_ids) == 1
        ids.append(job_ids[0])
    return ids


def follow_job(fake: StrictSky, job_id: int) -> tuple[int, str]:
    out = io.StringIO()
    return fake.jobs.tail_logs(job_id=job_id, follow=True, output_stream=out), out.getvalue()


def job_row(fake: StrictSky, job_id: int, **query: object) -> object:
    records, total, _, _ = fake.get(fake.jobs.queue_v2(refresh=False, job_ids=[job_id], **query))
    assert total == 1
    return records[0]


def wait_until(check, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def job_log(fake: StrictSky, job_id: int) -> str:
    return (fake.state_dir / "jobs" / str(job_id) / "job.log").read_text()


def test_jobs_calls_are_bound_to_the_real_signatures_and_refuse_what_is_not_emulated(fake: StrictSky) -> None:
    t = task(run="echo hi")
    with pytest.raises(TypeError, match="dryrun"):
        fake.jobs.launch(t, dryrun=True)  # managed jobs have no dryrun
    with pytest.raises(TypeError):
        fake.jobs.queue_v2()  # refresh is required
    with pytest.raises(TypeError, match="job_id"):
        fake.jobs.cancel(job_id=1)  # it is job_ids
    with pytest.raises(TypeError):
        fake.jobs.tail_logs(None, 1, True, False, False, None, None, None, None, True)  # preload_content: keyword
    with pytest.raises(ValueError, match="Invalid queue version: 3"):
        fake.jobs.queue(False, version=3)
    with pytest.raises(ValueError, match="tail must be None or a positive integer"):
        fake.jobs.tail_logs(job_id=1, tail=0)
    with pytest.raises(pydantic.ValidationError):  # the real request body's own validation
        fake.jobs.cancel(job_ids="1")
    with pytest.raises(NotImplementedError, match="pool"):
        fake.jobs.launch(t, pool="p")
    with pytest.raises(NotImplementedError, match="num_jobs"):
        fake.jobs.launch(t, num_jobs=2)
    with pytest.raises(NotImplementedError, match="job_group"):
        fake.jobs.launch(t, job_group=3)
    with pytest.raises(NotImplementedError, match="num_nodes=2"):
        fake.jobs.launch(task(run="echo hi", num_nodes=2))
    with pytest.raises(NotImplementedError, match="controller"):
        fake.jobs.tail_logs(job_id=1, controller=True)
    with pytest.raises(ValueError, match="'BOGUS' is not a valid jobs recovery strategy"):  # the API server's check
        fake.jobs.launch(task(run="echo hi", resources={"job_recovery": "BOGUS"}))
    assert not any((fake.state_dir / "requests").iterdir()) and not (fake.state_dir / "jobs").exists()
    with pytest.raises(fake.exceptions.ClusterNotUpError, match="No in-progress managed jobs"):
        fake.get(fake.jobs.queue_v2(refresh=False))  # no jobs controller yet: SkyPilot 0.14.1's answer
    assert fake.get(fake.jobs.queue_v2(refresh=True)) == ([], 0, {}, 0)  # a refresh starts it
    out = io.StringIO()
    assert fake.jobs.tail_logs(job_id=7, output_stream=out) == JOB_NOT_FOUND and "Job 7 not found." in out.getvalue()


def test_differing_job_recovery_across_candidates_is_skypilots_value_error(fake: StrictSky) -> None:
    t = task(
        run="echo hi",
        resources={
            "ordered": [
                {"use_spot": True, "job_recovery": {"strategy": "FAILOVER", "max_restarts_on_errors": 1}},
                {"use_spot": False, "job_recovery": {"strategy": "FAILOVER", "max_restarts_on_errors": 2}},
            ]
        },
    )
    with pytest.raises(ValueError, match="All resources in the task must havethe same job recovery strategy."):
        fake.get(fake.jobs.launch(t))
    assert fake.get(fake.jobs.queue_v2(refresh=True))[0] == []


def test_a_managed_job_succeeds_with_skypilots_records_and_a_fresh_environment(
    fake: StrictSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALLER_ONLY", "leaked")
    run = (
        'echo "id=$SKYPILOT_MANAGED_JOB_ID task=$SKYPILOT_TASK_ID a=$A s=$S ${CALLER_ONLY:-unset}"; '
        'cat "$LAUNCHER_APP_DIR/train.py"'
    )
    t = task(
        run=run,
        envs={"A": "env-a"},
        secrets={"S": "sekrit-77e1"},
        resources={
            "ordered": [{"use_spot": True, "accelerators": "T4:1"}, {"use_spot": False, "accelerators": "T4:1"}]
        },
    )
    job_id = launch_job(fake, t, name="ok-job")
    code, out = follow_job(fake, job_id)
    assert code == JOB_SUCCEEDED, out
    assert f"id={job_id} task=sky-managed-" in out and "_ok-job_1-0" in out
    assert "a=env-a s=sekrit-77e1 unset" in out and "the reviewed trainer" in out
    assert f"Managed job finished: {job_id} (status: SUCCEEDED)." in out
    records, total, counts, total_no_filter = fake.get(fake.jobs.queue_v2(refresh=False))
    assert (total, counts, total_no_filter) == (1, {"SUCCEEDED": 1}, 1)
    [rec] = records
    assert isinstance(rec, sky.schemas.api.responses.ManagedJobRecord) and rec.status is ManagedJobStatus.SUCCEEDED
    assert (rec.job_id, rec.task_id, rec.job_name, rec.task_name, rec.recovery_count) == (
        job_id,
        0,
        "ok-job",
        "ok-job",
        0,
    )
    assert rec.resources == "1x[T4:1][On-demand|Spot]" and rec.end_at >= rec.submitted_at
    assert rec.start_at is None and rec.failure_reason is None  # not among the default fields
    [attempt] = job_record(fake.state_dir, job_id)["attempts"]
    assert attempt["use_spot"] is True and attempt["outcome"] == "succeeded"  # the first candidate: spot
    # The secret's value reaches the job's environment only: no file of the stand-in's holds it.
    for path in fake.state_dir.rglob("*"):
        if path.is_file() and path.name != "job.log":
            assert b"sekrit-77e1" not in path.read_bytes(), path
    assert ("jobs.launch", "ok-job") in fake.calls and ("jobs.tail_logs", str(job_id)) in fake.calls


def test_queue_v2_honours_fields_as_the_real_server_does(fake: StrictSky) -> None:
    job_id = launch_job(fake, task(run="echo hi"), name="fields")
    assert follow_job(fake, job_id)[0] == JOB_SUCCEEDED
    queries = {
        "only": {"fields": ["cloud", "failure_reason"]},
        "full": {"fields": None},
        "default": {},
        "bogus": {"fields": ["bogus"]},
        "absent": {"job_ids": [99]},
    }
    rids = {k: fake.jobs.queue_v2(refresh=False, **{"job_ids": [job_id], **q}) for k, q in queries.items()}
    rids["v1"] = fake.jobs.queue(refresh=False)  # all submitted at once: their workers run side by side
    [only], total, counts, total_no_filter = fake.get(rids["only"])
    assert (total, counts, total_no_filter) == (1, {"SUCCEEDED": 1}, 1)
    assert (only.job_id, only.task_id, only.status, only.cloud) == (job_id, 0, ManagedJobStatus.SUCCEEDED, "GCP")
    assert only.job_name is None and only.submitted_at is None and only.recovery_count is None
    [full] = fake.get(rids["full"])[0]
    assert full.job_name == "fields" and full.region and full.cloud == "GCP" and full.schedule_state == "DONE"
    assert full.last_recovered_at == full.start_at and full.submitted_at <= full.start_at <= full.end_at
    assert full.cluster_resources == full.resources == "1x[CPU:1+]"  # terminal: the cached resources
    assert 0 <= full.job_duration <= full.end_at - full.start_at + 0.01
    [default] = fake.get(rids["default"])[0]
    assert default.job_name == "fields" and default.job_duration is not None
    assert default.start_at is None and default.cloud is None and default.failure_reason is None
    with pytest.raises(ValueError, match="Unknown field: bogus"):
        fake.get(rids["bogus"])
    assert fake.get(rids["absent"]) == ([], 0, {}, 1)
    [v1] = fake.get(rids["v1"])  # deprecated v1: a list, default fields
    assert v1.job_id == job_id and v1.status is ManagedJobStatus.SUCCEEDED and v1.failure_reason is None
    assert fake.jobs.tail_logs(job_id=job_id, follow=False, output_stream=io.StringIO()) is None
    assert fake.jobs.tail_logs(name="nope", output_stream=io.StringIO()) == JOB_NOT_FOUND


def test_a_preempted_job_recovers_on_a_fresh_cluster_with_the_same_task_id_and_envs(
    fake: StrictSky, tmp_path: Path
) -> None:
    bucket = tmp_path / "bucket"  # state the job keeps outside its clusters (no env var counts recoveries)
    bucket.mkdir()
    run = textwrap.dedent("""\
        n=$(( $(cat "$BUCKET/count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$BUCKET/count"
        if [ -f "$HOME/marker" ]; then m=present; else m=absent; fi
        touch "$HOME/marker"
        echo "attempt $n marker=$m task=$SKYPILOT_TASK_ID a=$A"
        if [ "$n" -eq 1 ]; then sleep 60; fi
        echo "attempt $n done"
    """)
    t = task(
        run=run,
        envs={"A": "env-a", "BUCKET": str(bucket)},
        resources={"job_recovery": {"max_restarts_on_errors": 0}, "ordered": [{"use_spot": True}, {"use_spot": False}]},
    )
    job_id = launch_job(fake, t)
    wait_until(lambda: "attempt 1 marker" in job_log(fake, job_id))
    subprocess.run(
        [sys.executable, str(REPO / "tests" / "fakes" / "sky_standin.py"), "preempt", str(fake.state_dir), str(job_id)],
        check=True,
        timeout=60,
    )
    code, out = follow_job(fake, job_id)
    assert code == JOB_SUCCEEDED, out
    lines = [line for line in out.splitlines() if line.startswith("attempt ")]
    assert [line.split(" task=")[0] for line in lines] == [
        "attempt 1 marker=absent",
        "attempt 2 marker=absent",
        "attempt 2 done",
    ]
    assert lines[0].split(" task=")[1] == lines[1].split(" task=")[1]  # same SKYPILOT_TASK_ID, same envs
    assert out.index("attempt 1 marker") < out.index("was preempted") < out.index("attempt 2 marker")
    rec = job_row(fake, job_id, fields=["recovery_count", "last_recovered_at", "start_at", "job_duration"])
    assert rec.status is ManagedJobStatus.SUCCEEDED and rec.recovery_count == 1
    assert rec.last_recovered_at > rec.start_at
    on_disk = job_record(fake.state_dir, job_id)
    first, second = on_disk["attempts"]
    assert (first["outcome"], second["outcome"]) == ("preempted", "succeeded")
    assert first["cluster_dir"] != second["cluster_dir"] and first["ended_at"] <= second["started_at"]
    assert first["use_spot"] and second["use_spot"]  # the same first candidate again
    runs = sum(a["ended_at"] - a["started_at"] for a in (first, second))
    assert abs(on_disk["job_duration"] - runs) < 1e-6 and abs(rec.job_duration - runs) < 1e-6
    assert not Path(first["cluster_dir"], "home").exists()  # torn down with its cluster
    with pytest.raises(RuntimeError, match="has ended"):
        preempt_job(fake.state_dir, job_id)


def test_user_failures_restart_up_to_max_restarts_on_errors_then_fail(fake: StrictSky, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    crash, flaky, setup = launch_jobs(
        fake,
        (task(run="echo crash; exit 7", resources={"job_recovery": {"max_restarts_on_errors": 2}}), None),
        (
            task(  # an exit code in recover_on_exit_codes restarts without counting
                run='n=$(( $(cat "$B/n" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$B/n"; [ "$n" -ge 3 ] || exit 33',
                envs={"B": str(bucket)},
                resources={"job_recovery": {"recover_on_exit_codes": [33]}},
            ),
            None,
        ),
        (task(setup="echo in-setup; exit 3", run="echo RUN-RAN"), None),
    )
    code, out = follow_job(fake, crash)
    assert code == JOB_FAILED and out.count("crash\n") == 3, out  # 1 run + 2 restarts
    assert follow_job(fake, flaky)[0] == JOB_SUCCEEDED
    code, out = follow_job(fake, setup)
    assert code == JOB_FAILED and "in-setup" in out and "RUN-RAN" not in out
    rows = fake.get(fake.jobs.queue_v2(refresh=False, fields=["failure_reason", "recovery_count"]))[0]
    rec = {r.job_id: r for r in rows}
    assert rec[crash].status is ManagedJobStatus.FAILED and rec[crash].recovery_count == 2
    assert rec[crash].failure_reason == (
        "Job exited with exit code 7 (user program failure). To see the details, "
        f"run: sky jobs logs --controller {crash}"
    )
    assert rec[flaky].status is ManagedJobStatus.SUCCEEDED and rec[flaky].recovery_count == 2
    assert rec[setup].status is ManagedJobStatus.FAILED_SETUP
    assert rec[setup].failure_reason.startswith("Job exited with exit code 3 (user program failure)")


def test_cancel_kills_the_job_with_its_cluster_or_sigterms_it_first_when_graceful(fake: StrictSky) -> None:
    """SkyPilot 0.14.1's graceful cancel SIGTERMs the job, then deletes its machine without waiting for
    the job (sky_attempts.py `cancel` cites the code): a trap that takes seconds never finishes, and
    nothing of the job is left, not even a child that made a session of its own."""
    run = (
        "trap 'echo got TERM; sleep 5; echo TERM handled; exit 0' TERM; setsid sleep 600 & echo \"child=$!\"; "
        "echo started; sleep 60 & wait $!"
    )
    hard, soft = launch_jobs(fake, (task(run=run), "hard"), (task(run=run), "soft"))
    no_selector, two_selectors = fake.jobs.cancel(), fake.jobs.cancel(job_ids=[1], all=True)
    for job_id in (hard, soft):
        wait_until(lambda j=job_id: "started" in job_log(fake, j))
    sessions = {j: job_record(fake.state_dir, j)["attempts"][-1]["pid"] for j in (hard, soft)}
    children = {j: int(re.search(r"child=(\d+)", job_log(fake, j)).group(1)) for j in (hard, soft)}
    started = {j: _start_time(pid) for j, pid in children.items()}
    rids = [fake.jobs.cancel(job_ids=[hard]), fake.jobs.cancel(name="soft", graceful=True, graceful_timeout=10)]
    assert [fake.get(rid) for rid in rids] == [None, None]
    with pytest.raises(ValueError, match="Can only specify one of JOB_IDS, name, pool, or all/all_users"):
        fake.get(no_selector)
    with pytest.raises(ValueError, match="Provided 'job_ids=1 all'"):
        fake.get(two_selectors)
    code, out = follow_job(fake, hard)
    assert code == JOB_CANCELLED and "got TERM" not in out  # no signal first: the cluster went with it
    code, out = follow_job(fake, soft)
    assert code == JOB_CANCELLED and "TERM handled" not in out  # SIGTERM, then the teardown at once
    [hard_attempt] = job_record(fake.state_dir, hard)["attempts"]
    [soft_attempt] = job_record(fake.state_dir, soft)["attempts"]
    assert "sigterm_at" not in hard_attempt
    assert soft_attempt["sigterm_to"] >= 2 and soft_attempt["sigterm_at"] <= soft_attempt["ended_at"]
    assert not session_alive(sessions[hard]) and not session_alive(sessions[soft])
    assert all(_start_time(pid) != started[j] for j, pid in children.items())  # the setsid child went too
    assert fake.get(fake.jobs.cancel(job_ids=[hard])) is None  # a terminal job: nothing to do
    rows = fake.get(fake.jobs.queue_v2(refresh=False))[0]
    assert {r.job_id: r.status for r in rows} == {hard: ManagedJobStatus.CANCELLED, soft: ManagedJobStatus.CANCELLED}
    assert fake.clusters_of("jobs.cancel") == [None, "1", str(hard), "soft", str(hard)]


def test_a_managed_job_outlives_the_client_that_launched_it(tmp_path: Path, app: Path) -> None:
    state = tmp_path / "state"
    client = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        import sky
        from tests.fakes.sky_standin import StrictSky
        fake = StrictSky(Path({str(state)!r}), Path({str(app)!r}))
        t = sky.Task.from_yaml_config({{"name": "t", "run": "sleep 2; echo survived"}})
        print(fake.jobs.launch(t), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", client], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        rid = proc.stdout.readline().strip()
        os.kill(proc.pid, signal.SIGKILL)  # right after jobs.launch() returned
    finally:
        proc.kill()
        proc.wait()
    later = StrictSky(state, app)
    try:
        [job_id], handle = later.get(rid)
        code, out = follow_job(later, job_id)
        assert code == JOB_SUCCEEDED and "survived" in out
    finally:
        shutdown_jobs(state)


def test_jobs_that_cannot_launch_and_a_dead_controller_end_as_skypilots_do(fake: StrictSky, app: Path) -> None:
    no_cloud = StrictSky(fake.state_dir, app, no_cloud=True).jobs.launch(task(run="echo hi"))
    full = StrictSky(fake.state_dir, app, capacity=True).jobs.launch(task(run="echo RAN"))
    # A secret without a value: SkyPilot's controller retries the launch forever (STARTING, in backoff).
    stuck, orphan, bad = launch_jobs(
        fake,
        (task(run="echo RAN", secrets={"X": None}), "stuck"),
        (task(run="echo started; sleep 60"), "orphan"),
        (task(run="echo RAN", resources={"accelerators": "NOPE:1"}), "bad"),
    )
    with pytest.raises(sky.exceptions.NoCloudAccessError):  # the jobs controller itself cannot launch
        fake.get(no_cloud)
    [no_capacity], _ = fake.get(full)
    code, out = follow_job(fake, bad)  # no catalog has it: the optimizer refuses, FAILED_PRECHECKS
    assert code == JOB_FAILED and "RAN" not in out
    wait_until(lambda: "started" in job_log(fake, orphan))
    for job_id in (stuck, no_capacity):
        wait_until(lambda j=job_id: job_record(fake.state_dir, j)["schedule_state"] == "ALIVE_BACKOFF")
    orphan_rec = job_record(fake.state_dir, orphan)
    os.kill(orphan_rec["controller"]["pid"], signal.SIGKILL)
    # SIGKILL lands after os.kill returns: ask once the controller is gone (a worker forked from the
    # warm executor answers within milliseconds, sooner than the kernel ends the process)
    from tests.fakes.sky_proc import _alive

    wait_until(lambda: not _alive(orphan_rec["controller"]["pid"], orphan_rec["controller"]["start"]))
    rows = fake.get(fake.jobs.queue_v2(refresh=False, fields=["details", "failure_reason"]))[0]
    rec = {r.job_id: r for r in rows}
    assert rec[stuck].status is ManagedJobStatus.STARTING and rec[stuck].details == "In backoff, waiting for resources"
    assert (
        "No value available for secret(s): X" in (fake.state_dir / "jobs" / str(stuck) / "controller.log").read_text()
    )
    assert rec[orphan].status is ManagedJobStatus.FAILED_CONTROLLER
    assert rec[orphan].failure_reason.startswith("Controller process has exited abnormally")
    assert not session_alive(orphan_rec["attempts"][-1]["pid"])  # its cluster went with it
    assert rec[no_capacity].status is ManagedJobStatus.STARTING and rec[no_capacity].details.startswith("In backoff")
    assert rec[bad].status is ManagedJobStatus.FAILED_PRECHECKS
    assert "Catalog does not contain any instances satisfying the request" in rec[bad].failure_reason
    assert fake.get(fake.jobs.cancel(job_ids=[stuck, no_capacity])) is None
    for job_id in (stuck, no_capacity):
        code, out = follow_job(fake, job_id)
        assert code == JOB_CANCELLED and "RAN" not in out
    assert follow_job(fake, orphan)[0] == JOB_FAILED


def test_an_autostopped_jobs_controller_answers_only_a_refresh(fake: StrictSky) -> None:
    """SkyPilot's jobs controller autostops 10 idle minutes after its last job; `jobs.queue_v2`
    without a refresh then raises ClusterNotUpError. The launcher's `record` asks again with
    refresh=True, so a dead launcher's ended job is still billed from SkyPilot's record."""
    from launcher.backends.sky.api import record
    from tests.fakes.sky_standin import stop_controller

    job_id = launch_job(fake, task(run="echo done"), name="quick")
    assert follow_job(fake, job_id)[0] == JOB_SUCCEEDED
    stop_controller(fake.state_dir)
    with pytest.raises(fake.exceptions.ClusterNotUpError):
        fake.get(fake.jobs.queue_v2(refresh=False, job_ids=[job_id]))
    rec = record(fake, job_id)
    assert rec is not None and rec["status"] == "SUCCEEDED" and rec["end_at"]

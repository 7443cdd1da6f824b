"""The pinned image and the docker backend, built and run for real.

`make test` installs and starts the engine (scripts/docker-engine.sh) and builds
a local base image with debootstrap (scripts/make-base-image.sh), since no
registry can be reached here. If the engine cannot be had, these tests FAIL,
loudly; PREFLIGHT_SKIP_DOCKER=1 skips them on purpose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind
from tests.helpers import assert_one_line_error, check, checks_of, edit_config, failed, run_cli

REPO = Path(__file__).resolve().parents[2]
BASE = "preflight-base:bookworm"

pytestmark = pytest.mark.xdist_group("docker")  # one engine, one image build (the module's `built`), one worker


def test_default_base_is_digest_pinned_and_hadolint_clean() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M).group(1)
    assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", default), default
    hadolint = Path(os.sys.executable).with_name("hadolint")
    proc = subprocess.run([str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def engine() -> None:
    if os.environ.get("PREFLIGHT_SKIP_DOCKER") == "1":
        pytest.skip("PREFLIGHT_SKIP_DOCKER=1")
    for script in ("docker-engine.sh", "make-base-image.sh"):
        proc = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{script} failed: {proc.stderr[-2000:]}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, engine: None) -> Path:
    """A project with its image built from the local base."""
    root = tmp_path_factory.mktemp("docker") / "proj"
    assert run_cli(["init", str(root)], cwd=root.parent).code == 0
    # One thread per process in the containers too, as conftest sets it for every local leg: with
    # OpenMP's default two, a leg on this loaded 2-core host spin-waits (3.5x the CPU beside two hogs).
    cfg = root / "launcher.yaml"  # edited as text: later tests edit its lines by pattern
    assert "\nleg_env:\n" in cfg.read_text()
    cfg.write_text(cfg.read_text().replace("\nleg_env:\n", '\nleg_env:\n  OMP_NUM_THREADS: "1"\n', 1))
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["image", "build", "--base", BASE, "--json"], cwd=root, timeout=1800)
    assert res.code == 0, res.err[-3000:]
    return root


def containers(prefix: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name={prefix}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def test_image_is_labelled_with_the_reviewed_files(built: Path) -> None:
    [row] = run_cli(["image", "list", "--json"], cwd=built).json()
    review = run_cli(["review", "--json"], cwd=built).json()
    assert row["files"] == review["files"] and row["image_id"].startswith("sha256:")
    labels = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", row["image_id"], "--format", "{{json .Config.Labels}}"],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert json.loads(labels["org.preflight.files"]) == review["files"]
    assert labels["org.preflight.base"] == BASE


def test_rehearsal_in_fresh_containers(built: Path) -> None:
    res = run_cli(["up", "rehearsal", "--backend", "docker", "--json"], cwd=built)
    assert res.code == 0, res.out[-3000:] + res.err[-2000:]
    assert all(c["ok"] for c in res.json()["checks"])
    run = run_cli(["ledger", "--json"], cwd=built).json()[0]
    image = run_cli(["image", "list", "--json"], cwd=built).json()[0]["image_id"]
    assert run["backend"] == "docker" and run["image"] == image  # the ledger carries the image digest
    assert len({leg["instance"] for leg in run["legs"]}) == 4  # a new container per leg (+ the straight run)
    # SIGTERM reaches the trainer in its container; the deadline leg is held by `docker pause`.
    stops = [check(res, Kind.STOPPED_AS_ASKED, leg=leg)["facts"] for leg in (0, 1)]
    assert stops == [{"want": "sigterm", "got": "sigterm"}, {"want": "deadline", "got": "deadline"}], stops
    assert "identical at every step" in check(res, Kind.TIMELINE)["detail"]
    assert all(leg["command"][1] == "run" and image in leg["command"] for leg in run["legs"])
    assert containers(f"preflight-{run['id']}") == []  # every instance is gone


def test_changed_file_after_build_is_refused(built: Path) -> None:
    train = built / "train.py"
    original = train.read_text()
    try:
        train.write_text(original + "\n# edited after the image was built\n")
        res = run_cli(["up", "rehearsal", "--backend", "docker"], cwd=built)
        assert_one_line_error(res, 3, "changed: train.py")
        assert run_cli(["review"], cwd=built).code == 0  # accepted, but not baked into any image
        res = run_cli(["up", "rehearsal", "--backend", "docker"], cwd=built)
        assert_one_line_error(res, 3, "train.py differ")
        assert "launcher image build" in res.err
    finally:
        train.write_text(original)
        assert run_cli(["review"], cwd=built).code == 0


@pytest.fixture
def registry(tmp_path: Path, engine: None):  # noqa: ANN201
    """A loopback registry (Debian's docker-registry), standing in for the cloud registry."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'blobs'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_push_records_repo_at_digest(built: Path, registry: str) -> None:
    repository = f"{registry}/preflight/demo"
    res = run_cli(["image", "push", "--repository", repository], cwd=built, timeout=900)
    assert res.code == 0, res.err[-2000:]
    ref = run_cli(["image", "list", "--json"], cwd=built).json()[0]["pushed_ref"]
    assert re.fullmatch(re.escape(repository) + r"@sha256:[0-9a-f]{64}", ref), ref
    assert ref in res.out


def test_push_without_a_repository_is_bad_input(built: Path) -> None:
    res = run_cli(["image", "push"], cwd=built)
    assert_one_line_error(res, 2, "no registry repository")


def test_drill_in_containers(built: Path) -> None:
    res = run_cli(
        ["drill", "cold-resume", "--backend", "docker", "--kills", "2", "--at", "after-push", "--json"],
        cwd=built,
        timeout=900,
    )
    out = res.json()
    assert res.code == 0, failed(out)
    resumed = [c["detail"] for c in checks_of(out, Kind.RESUMED_NEWEST)]
    assert len(resumed) == 2 and all("the launcher's read of that checkpoint" in d for d in resumed), resumed
    run = run_cli(["ledger", out["run_id"], "--json"], cwd=built).json()[0]
    assert run["backend"] == "docker" and [leg["killed"] for leg in run["legs"]] == [True, True, False, False]
    assert len({leg["instance"] for leg in run["legs"]}) == 4  # a kill takes the container: the next leg, a new one
    assert run["legs"][-1]["role"] == "straight"  # the uninterrupted reference run, its own container
    assert containers(f"preflight-{run['id']}") == []


def test_status_and_graceful_stop_of_a_containerized_leg(built: Path, tmp_path: Path) -> None:
    import shutil

    from tests.legs.test_status_stop import finish, start_up, wait_for_step

    root = tmp_path / "proj"
    shutil.copytree(built, root, ignore=shutil.ignore_patterns("runs", "store"))
    cfg = root / "launcher.yaml"
    text = re.sub(
        r"(?m)^  command: .*$",
        "  command: python train.py --ckpt-every 5 --metrics-every 5 --health-every 0 --data-delay 0.15",
        cfg.read_text(),
    )
    cfg.write_text(re.sub(r"(?m)^  rehearsal: .*$", "  rehearsal: {steps: 300, budget_minutes: 10}", text))
    proc, out = start_up(root, "--backend", "docker")
    try:
        run_id, _ = wait_for_step(root, 12, timeout=300)
        s = run_cli(["status", "--json"], cwd=root).json()
        assert s["run"] == run_id and s["backend"] == "docker" and s["leg"]["state"] == "running"
        assert s["leg"]["step"] >= 12 and s["checkpoints"]["newest_verified"]["step"] >= 5
        assert s["health"]["ram_total_bytes"] > 0  # read inside the container
        assert containers(f"preflight-{run_id}") == [s["leg"]["instance"]]
        # the watchdog's look reaches a container's processes from this host (launcher.backends.looks)
        from launcher.backends.docker import container_pids
        from launcher.backends.looks import look

        seen = look(container_pids([s["leg"]["instance"]]))
        assert any("train.py" in p.stack for p in seen), [(p.line(), p.note) for p in seen]
        res = run_cli(["stop", run_id, "--timeout", "120", "--json"], cwd=root)
        st = res.json()
        assert res.code == 0 and st["clean"] is True and st["loadable"]["ok"] is True, st
        assert st["final_step"] == st["checkpoint_step"]
        assert finish(proc, out) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    assert containers(f"preflight-{run_id}") == []  # torn down
    after = run_cli(["status", run_id, "--json"], cwd=root).json()
    assert after["state"] == "ended: stopped" and after["stops"][0]["outcome"] == "graceful"


def test_a_killed_launcher_leaves_no_container_running(built: Path, tmp_path: Path) -> None:
    import shutil
    import signal
    import time

    from tests.legs.test_status_stop import start_up, wait_for_step

    root = tmp_path / "proj"
    shutil.copytree(built, root, ignore=shutil.ignore_patterns("runs", "store"))
    cfg = root / "launcher.yaml"
    text = re.sub(
        r"(?m)^  command: .*$", "  command: python train.py --ckpt-every 5 --data-delay 0.15", cfg.read_text()
    )
    cfg.write_text(re.sub(r"(?m)^  rehearsal: .*$", "  rehearsal: {steps: 300, budget_minutes: 10}", text))
    proc, _ = start_up(root, "--backend", "docker")
    run_id, _ = wait_for_step(root, 3, timeout=300)
    assert len(containers(f"preflight-{run_id}")) == 1
    proc.send_signal(signal.SIGKILL)  # the launcher dies; its leash removes the container
    proc.wait()
    deadline = time.time() + 60
    while containers(f"preflight-{run_id}") and time.time() < deadline:
        time.sleep(0.1)
    assert containers(f"preflight-{run_id}") == []
    s = run_cli(["status", run_id, "--json"], cwd=root)
    assert s.code == 0 and s.json()["state"] == "ended: launcher died"


def test_a_run_in_containers_carried_across_a_killed_container(built: Path, tmp_path: Path) -> None:
    import shutil

    from tests.legs.test_run_rung import configure, events, leg_row, start_run, wait_for

    root = tmp_path / "proj"
    shutil.copytree(built, root, ignore=shutil.ignore_patterns("runs", "store"))
    configure(root, steps=60, command="python train.py --ckpt-every 5 --data-delay 0.05")
    proc, out = start_run(root, "--backend", "docker", "--cpu", "--skip-preflight", "the docker chain's test")
    try:
        row = wait_for(lambda: leg_row(root, 0), timeout=300)
        log = Path(row["log_path"])
        wait_for(lambda: any(e["event"] == "prune" for e in events(log)), timeout=300)
        subprocess.run(["docker", "kill", row["instance"]], check=True, capture_output=True)  # the instance is lost
        assert proc.wait(timeout=600) == 0, out.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    run = run_cli(["ledger", "--json"], cwd=root).json()[0]
    assert run["rung"] == "run" and run["backend"] == "docker" and run["verdict"] == "pass" and len(run["legs"]) == 2
    assert run["legs"][0]["instance"] != run["legs"][1]["instance"]
    assert all(c["ok"] for c in run["checks"]), failed(run)
    for kind, leg in (
        (Kind.RESUMED_NEWEST, 1),
        (Kind.DATA_POSITION, 1),
        (Kind.LR, 1),
        (Kind.LOSS_CONTINUITY, 1),
        (Kind.RUN_LENGTH, None),
    ):
        assert check(run, kind, leg=leg)["ok"], kind
    assert containers(f"preflight-{run['id']}") == []


def test_two_nodes_in_containers_survive_a_node_lost_mid_push(built: Path) -> None:
    """`--backend docker --nodes 2`: a container per node on a network made for the leg, each
    running the rung's `run:` script; the drill loses node 1's container alone mid-push, the
    cluster ends the leg, and the next leg (two fresh containers) resumes from the store."""
    edit_config(built, rungs__drill__steps=16)
    assert run_cli(["review"], cwd=built).code == 0
    res = run_cli(
        ["drill", "cold-resume", "--backend", "docker", "--nodes", "2", "--at", "node-lost", "--kills", "1", "--json"],
        cwd=built,
        timeout=900,
    )
    assert res.code == 0, res.out + res.err
    checks = res.json()["checks"]
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    run = run_cli(["ledger", res.json()["run_id"], "--json"], cwd=built).json()[0]
    lost = run["legs"][0] if not run["legs"][0]["role"] else run["legs"][1]
    assert lost["killed"] and "node-lost" in lost["end_reason"] and "node 1 exited 137" in lost["end_reason"]
    assert [n["instance"].rsplit("-", 1)[1] for n in lost["nodes"]] == ["node0", "node1"]
    assert all(leg["run_sha256"] and len(leg["nodes"]) == 2 for leg in run["legs"])
    assert containers(f"preflight-{res.json()['run_id']}") == []
    networks = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    assert not [n for n in networks.stdout.split() if res.json()["run_id"] in n]


def test_a_hung_rank_in_a_container_is_found_and_the_run_resumes(built: Path) -> None:
    """`drill hang --backend docker --nodes 2`: rank 1, alone in node 1's container, is stopped
    from this host at step 4; the leg's watchdog finds it by its silence, reads every process of
    both containers from the host (RANK, state, py-spy's stacks), ends the leg, and two fresh
    containers resume from the store. The same checks as the local drill's
    (tests/legs/test_drill_hang.py)."""
    from tests.legs.test_drill_hang import POLICY, SLOW_STEPS, check_hang

    before = (built / "launcher.yaml").read_text()
    edit_config(
        built,
        trainer__command=f"python {SLOW_STEPS}",
        trainer__watchdog=POLICY,
        rungs__drill={"steps": 8, "budget_minutes": 5},
    )
    try:
        assert run_cli(["review"], cwd=built).code == 0
        res = run_cli(
            ["drill", "hang", "--backend", "docker", "--nodes", "2", "--at-step", "4", "--json"], cwd=built, timeout=900
        )
        assert res.code == 0, res.out[-3000:] + res.err[-3000:]
        run = run_cli(["ledger", res.json()["run_id"], "--json"], cwd=built).json()[0]
        check_hang(res.json()["checks"], run, rank=1)
        assert containers(f"preflight-{res.json()['run_id']}") == []
    finally:
        (built / "launcher.yaml").write_text(before)
        assert run_cli(["review"], cwd=built).code == 0

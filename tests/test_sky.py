"""SkyPilot: rendered task YAMLs validated by the real `sky.Task.from_yaml`, and the sky
backend's SDK call sequence against a recording stand-in (tests/sky_standin.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import sky
import yaml

from launcher import up as up_module
from launcher.config import load_config, parse_gpus
from launcher.errors import BadInput
from launcher.ledger import Ledger
from launcher.manifest import files_digest
from launcher.skytask import render, sky_module
from tests.conftest import assert_one_line_error, run_cli, run_rows
from tests.sky_standin import JOB_FAILED, RecordingSky

ENV = {"LAUNCHER_RUN_ID": "r", "LAUNCHER_LEG": "0", "LAUNCHER_RUNG": "smoke", "LAUNCHER_STORE": "hf://o/r",
       "LAUNCHER_MAX_STEPS": "30", "LAUNCHER_DEADLINE": "0", "LAUNCHER_FILES_SHA256": "{}"}
REF = "localhost:5000/preflight/demo@sha256:" + "ab" * 32


@pytest.mark.parametrize("rung", ["rehearsal", "smoke", "probe", "run"])
@pytest.mark.parametrize("gpus, nodes", [("T4:2", 1), ("A100:8", 1), ("H100:8", 2)])
def test_every_rung_renders_yaml_skypilot_accepts(project: Path, tmp_path: Path, rung: str, gpus: str,
                                                  nodes: int) -> None:
    cfg = load_config(project / "launcher.yaml")
    spec = None if rung == "rehearsal" else parse_gpus(gpus)
    task = render(cfg, rung, gpus=spec, nodes=nodes, image_ref=REF, leg_env=ENV, out=tmp_path / "t.yaml")
    parsed = sky.Task.from_yaml(str(task.path))  # SkyPilot's own parser, again, on the file as written
    assert parsed.num_nodes == nodes
    [resources] = list(parsed.resources)
    assert resources.image_id is not None and REF in str(resources.image_id)
    if spec is not None:
        assert resources.accelerators == {spec.name: spec.count}
    assert parsed.envs["LAUNCHER_TRAIN_ARGS"] == "train.py --ckpt-every 5"
    assert "hf_" not in task.yaml_text and yaml.safe_load(task.yaml_text)["secrets"] == {"HF_TOKEN": None}


def test_dry_run_prints_yaml_skypilot_accepts_and_records_nothing(project: Path, tmp_path: Path) -> None:
    res = run_cli(["up", "probe", "--gpus", "T4:2", "--backend", "sky", "--dry-run"], cwd=project)
    # It prints all of it, and exits as the real launch would: a file:// store is bad input on sky.
    assert_one_line_error(res, 2, "a real launch would be refused", "hf://owner/repo")
    text = res.out.split("sha256", 1)[1].split("\n", 1)[1].split("\nnote:")[0].split("\nquota:")[0]
    (tmp_path / "printed.yaml").write_text(text)
    assert sky.Task.from_yaml(str(tmp_path / "printed.yaml")).num_nodes == 1
    assert "quota: 2 legs x 90 min x 2 GPUs x 1 nodes = 6.00 GPU-h" in res.out
    assert run_rows(project) == 0


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "T44:2"], "unknown accelerator 'T44'"),
    (["--gpus", "T4:two"], "T4:two"),
    (["--gpus", "T4:2", "--nodes", "0"], "--nodes"),
])
def test_bad_gpus_and_overrides_exit_2(project: Path, args: list[str], needle: str) -> None:
    res = run_cli(["up", "smoke", "--backend", "sky", "--dry-run", *args], cwd=project)
    assert_one_line_error(res, 2, needle)


def test_a_template_skypilot_rejects_or_a_missing_mount_exit_2(project: Path) -> None:
    (project / "sky").mkdir()
    template = yaml.safe_load((up_module.Path(__file__).parent.parent / "sky" / "smoke.yaml").read_text())
    (project / "sky" / "smoke.yaml").write_text(yaml.safe_dump({**template, "resourcez": {}}))
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--backend", "sky", "--dry-run"], cwd=project)
    assert_one_line_error(res, 2, "SkyPilot rejects")
    (project / "sky" / "smoke.yaml").write_text(yaml.safe_dump({**template, "file_mounts": {"/data": "./nope"}}))
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--backend", "sky", "--dry-run"], cwd=project)
    assert_one_line_error(res, 2, "file_mounts./data")


def test_skypilot_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # `import sky` now raises ImportError
    with pytest.raises(BadInput, match="skypilot is not installed") as err:
        sky_module()
    assert "preflight-launcher[sky]" in err.value.hint


def test_sky_launch_needs_a_reachable_store(project: Path) -> None:
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--backend", "sky"], cwd=project)
    assert_one_line_error(res, 2, "hf://owner/repo")
    assert run_rows(project) == 0


@pytest.fixture
def sky_project(project: Path, hub_server, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    """The project with a hub store and a (recorded) pushed image of its reviewed files."""
    data = yaml.safe_load((project / "launcher.yaml").read_text())
    data["store"] = "hf://tester/ckpts"
    (project / "launcher.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    cfg = load_config(project / "launcher.yaml")
    ledger = Ledger(cfg.state_path / "ledger.db")
    files = ledger.latest_review().files
    row = ledger.record_image({"tag": "t", "image_id": "sha256:" + "0" * 64, "base": "b", "lock": "cpu.lock",
                               "files_digest": files_digest(files), "files": files, "runtime_digest": "r",
                               "built_at": 0.0, "seconds": 0.0})
    ledger.set_pushed(row, REF)
    ledger.close()
    return cfg


def run_sky(cfg, monkeypatch: pytest.MonkeyPatch, standin: RecordingSky, rung: str, gpus: str | None):  # noqa: ANN001, ANN201
    monkeypatch.setattr("launcher.backends.sky.sky_module", lambda: standin)
    return up_module.up(cfg, cfg.root / "launcher.yaml", rung, "sky", gpus, lambda leg, line: None)


def test_one_new_cluster_per_leg_always_downed_and_billed(sky_project, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    standin = RecordingSky(sky_project.root / "train.py", job_exit=JOB_FAILED)
    outcome = run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1")
    checks = {c.name: c for c in outcome.checks}
    # The stand-in's "GPU" is this CPU: smoke's device checks say no; everything else holds.
    assert {n for n, c in checks.items() if not c.ok} == {f"leg {i} ran on the accelerator" for i in range(3)}, \
        {n: c.detail for n, c in checks.items() if not c.ok}
    launched = standin.clusters_of("launch")
    assert len(launched) == len(set(launched)) == 3
    assert standin.clusters_of("down") == launched  # down for every leg, in order
    for cluster in launched:  # launch -> stream -> tail -> down, per leg
        seq = [c for c in standin.calls if c[1] in (cluster, f"launch:{cluster}", f"down:{cluster}")]
        assert [name for name, _ in seq] == ["launch", "stream_and_get", "tail_logs", "down", "stream_and_get"]
    ledger = Ledger(sky_project.state_path / "ledger.db")
    run = ledger.runs()[0]
    ledger.close()
    assert run["image"] == REF and run["backend"] == "sky"
    for leg in run["legs"]:
        # The exit code is the trainer's own (from its events), not tail_logs' JobExitCode (100).
        assert leg["exit_code"] == 0 and leg["task_sha256"] and leg["command"][:2] == ["sky", "launch"]
        billed_s = math.ceil((leg["ended_at"] - leg["started_at"]) / 60) * 60
        assert leg["billed_gpu_hours"] == pytest.approx(billed_s / 3600)
        assert leg["cost_usd"] == pytest.approx(leg["billed_gpu_hours"] * 0.35)


def test_failed_setup_is_still_downed_and_billed(sky_project, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    standin = RecordingSky(sky_project.root / "train.py", fail_setup=True)
    outcome = run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1")
    assert outcome.exit_code == 1
    assert standin.clusters_of("down") == standin.clusters_of("launch") and len(standin.clusters_of("launch")) == 1
    leg0 = next(c for c in outcome.checks if c.name == "leg 0 finished")
    assert not leg0.ok and "sky error: RuntimeError: Failed to run setup" in leg0.detail
    ledger = Ledger(sky_project.state_path / "ledger.db")
    [leg] = ledger.runs()[0]["legs"]
    ledger.close()
    assert leg["billed_gpu_hours"] == pytest.approx(60 / 3600)  # the one-minute minimum is billed all the same


def test_kill_downs_the_cluster(sky_project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: ANN001
    import time

    from launcher.backends.base import LegSpec
    from launcher.backends.sky import SkyBackend

    standin = RecordingSky(sky_project.root / "train.py")
    backend = SkyBackend(sky_project, REF, sky=standin)
    env = {**ENV, "LAUNCHER_STORE": "hf://tester/ckpts", "LAUNCHER_MAX_STEPS": "100000"}
    lines: list[str] = []
    handle = backend.launch(LegSpec("killrun", 0, "smoke", ("python", "train.py"), env,
                                    log_path=tmp_path / "leg-0.log", gpus=parse_gpus("T4:1")), on_line=lines.append)
    deadline = time.time() + 60
    while not any('"event": "step"' in ln for ln in lines) and time.time() < deadline:
        time.sleep(0.05)
    result = backend.kill(handle, reason="drill")
    assert result.killed and result.exit_code == -9 and result.end_reason == "drill"
    assert standin.clusters_of("down")[0] == handle.instance


def test_no_cloud_is_exit_2_with_skypilots_reason_and_nothing_billed(sky_project, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    standin = RecordingSky(sky_project.root / "train.py", no_cloud=True)
    with pytest.raises(BadInput, match="SkyPilot could not launch: NoCloudAccessError: No cloud access"):
        run_sky(sky_project, monkeypatch, standin, "smoke", "T4:1")
    assert standin.clusters_of("down") == []  # nothing was provisioned, nothing to tear down
    ledger = Ledger(sky_project.state_path / "ledger.db")
    run = ledger.runs()[0]
    held = ledger.conn.execute("SELECT settled_gpu_hours FROM reservations").fetchone()[0]
    ledger.close()
    assert run["exit_code"] == 2 and run["verdict"] == "error" and run["billed_gpu_hours"] == 0
    assert [leg["billed_gpu_hours"] for leg in run["legs"]] == [0.0] and held == 0

"""SkyPilot: rendered task YAMLs validated by the real `sky.Task.from_yaml`, and the sky
backend's SDK call sequence against a recording stand-in (tests/fakes/sky_standin.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

import sky
from launcher import up as up_module
from launcher.backends.sky.task import render, sky_module
from launcher.config.load import load_config
from launcher.config.schema import parse_gpus
from launcher.errors import BadInput
from tests.helpers import assert_one_line_error, edit_config, run_cli, run_rows

ENV = {
    "LAUNCHER_RUN_ID": "r",
    "LAUNCHER_LEG": "0",
    "LAUNCHER_RUNG": "smoke",
    "LAUNCHER_STORE": "hf://o/r",
    "LAUNCHER_MAX_STEPS": "30",
    "LAUNCHER_DEADLINE": "0",
    "LAUNCHER_FILES_SHA256": "{}",
}
REF = "localhost:5000/preflight/demo@sha256:" + "ab" * 32


@pytest.mark.parametrize("rung", ["rehearsal", "smoke", "probe", "run"])
@pytest.mark.parametrize("gpus, nodes", [("T4:2", 1), ("A100:8", 1), ("H100:8", 2)])
def test_every_rung_renders_yaml_skypilot_accepts(
    project: Path, tmp_path: Path, rung: str, gpus: str, nodes: int
) -> None:
    cfg = load_config(project / "launcher.yaml")
    spec = None if rung == "rehearsal" else parse_gpus(gpus)
    task = render(cfg, rung, gpus=spec, nodes=nodes, image_ref=REF, leg_env=ENV, out=tmp_path / "t.yaml")
    parsed = sky.Task.from_yaml(str(task.path))  # SkyPilot's own parser, again, on the file as written
    assert parsed.num_nodes == nodes
    candidates = list(parsed.resources)  # the run's template tries spot, then on-demand
    assert [r.use_spot for r in candidates] == ([True, False] if rung == "run" else [False])
    for resources in candidates:
        assert resources.image_id is not None and REF in str(resources.image_id)
        if spec is not None:
            assert resources.accelerators == {spec.name: spec.count}
        assert resources.autostop_config is not None and resources.autostop_config.down
    assert parsed.envs["LAUNCHER_TRAIN_ARGS"] == "train.py --ckpt-every 5"
    assert "hf_" not in task.yaml_text and "secrets" not in yaml.safe_load(task.yaml_text)
    assert not parsed.managed_secret_refs  # nothing for a secrets provider to resolve: values come at launch
    # The backstops a launcher that dies leaves behind: autostop with down, and the hard cap around `run`.
    assert yaml.safe_load(task.yaml_text)["resources"]["autostop"] == {"idle_minutes": 10, "down": True}


def test_the_run_command_is_hard_capped_and_keeps_quoted_arguments(project: Path, tmp_path: Path) -> None:
    """The rendered `run`, executed by bash as SkyPilot would (with torchrun standing in as
    `echo`): a CPU instance gets one process, an argument with spaces stays whole, and the
    hard cap wraps it all."""
    import shlex
    import subprocess

    edit_config(project, trainer__command=["python", "train.py", "--note", "two words", "--empty", ""])
    cfg = load_config(project / "launcher.yaml")
    task = render(
        cfg,
        "rehearsal",
        gpus=None,
        nodes=1,
        image_ref=REF,
        leg_env=ENV,
        out=tmp_path / "t.yaml",
        hard_stop=time.time() + 60,
    )
    parsed = yaml.safe_load(task.yaml_text)
    assert "timeout --foreground --signal=TERM --kill-after=120" in parsed["run"]
    assert 'python -m runtime.programs.notice --mark "$mark" --parent $$ &' in parsed["run"]  # the spot notice watcher
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text('#!/bin/sh\nfor a in "$@"; do printf "[%s]" "$a"; done\n')
    (bindir / "torchrun").chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "LAUNCHER_APP_DIR": str(tmp_path),
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        **{k: str(v) for k, v in parsed["envs"].items()},
    }
    out = subprocess.run(["bash", "-c", parsed["run"]], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "[--nproc_per_node=1]" in out.stdout  # a CPU instance still runs one process
    assert out.stdout.endswith("[train.py][--note][two words][--empty][]"), out.stdout
    assert shlex.split(parsed["envs"]["LAUNCHER_TRAIN_ARGS"])[2] == "two words"


def test_secrets_reach_skypilot_as_values_and_survive_its_yaml_round_trip(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the client sends the API server is the task serialized by SkyPilot's own
    dump; what the server runs is that YAML loaded by its own loader. No null entry (a
    managed-secret reference no provider resolves) may survive it."""
    from sky.utils import dag_utils

    from launcher.backends.sky.task import task_for_launch

    cfg = load_config(project / "launcher.yaml")
    task = render(cfg, "smoke", gpus=parse_gpus("T4:1"), nodes=1, image_ref=REF, leg_env=ENV, out=tmp_path / "t.yaml")
    monkeypatch.setenv("SKYPILOT_DOCKER_USERNAME", "robot")
    monkeypatch.setenv("SKYPILOT_DOCKER_PASSWORD", "registry-pass")
    monkeypatch.setenv("SKYPILOT_DOCKER_SERVER", "registry.example.com")
    sent = task_for_launch(sky, task.path, {"HF_TOKEN": "hf_secret_value"})
    dag = sky.Dag()
    dag.add(sent)
    wire = dag_utils.dump_dag_to_yaml_str(dag)
    [received] = dag_utils.load_dag_from_yaml_str(wire).tasks
    assert not received.managed_secret_refs
    values = {k: v.get_secret_value() for k, v in received.secrets.items()}
    assert values["HF_TOKEN"] == "hf_secret_value" and values["SKYPILOT_DOCKER_PASSWORD"] == "registry-pass"
    assert "hf_secret_value" not in task.path.read_text() and "registry-pass" not in task.path.read_text()
    [resources] = list(received.resources)
    assert resources.extract_docker_image() is not None


def test_a_template_secret_is_a_name_never_a_value(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.backends.sky.task import task_for_launch

    template = yaml.safe_load((Path(__file__).parents[2] / "sky" / "smoke.yaml").read_text())
    (project / "sky").mkdir()
    cfg = load_config(project / "launcher.yaml")
    (project / "sky" / "smoke.yaml").write_text(yaml.safe_dump({**template, "secrets": {"HF_TOKEN": None}}))
    task = render(cfg, "smoke", gpus=parse_gpus("T4:1"), nodes=1, image_ref=REF, leg_env=ENV, out=tmp_path / "t.yaml")
    assert "secrets" not in yaml.safe_load(task.yaml_text)  # the 0.13-style null entry is dropped, not sent
    (project / "sky" / "smoke.yaml").write_text(yaml.safe_dump({**template, "secrets": {"HF_TOKEN": "hf_x"}}))
    with pytest.raises(BadInput, match="secrets.HF_TOKEN holds a value"):
        render(cfg, "smoke", gpus=parse_gpus("T4:1"), nodes=1, image_ref=REF, leg_env=ENV, out=tmp_path / "u.yaml")
    monkeypatch.setenv("SKYPILOT_DOCKER_USERNAME", "robot")  # one of three: refused, not half-passed
    with pytest.raises(BadInput, match="private registry needs all of"):
        task_for_launch(sky, task.path, {})


def test_dry_run_prints_yaml_skypilot_accepts_and_records_nothing(project: Path, tmp_path: Path) -> None:
    res = run_cli(["up", "probe", "--gpus", "T4:2", "--backend", "sky", "--dry-run"], cwd=project)
    # It prints all of it, and exits as the real launch would: a file:// store is bad input on sky.
    assert_one_line_error(res, 2, "a real launch would be refused", "hf://owner/repo")
    text = res.out.split("sha256", 1)[1].split("\n", 1)[1].split("\nskypilot:")[0]
    (tmp_path / "printed.yaml").write_text(text)
    assert sky.Task.from_yaml(str(tmp_path / "printed.yaml")).num_nodes == 1
    assert "quota: 2 legs x 90 min x 2 GPUs x 1 nodes = 6.00 GPU-h" in res.out
    assert run_rows(project) == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpus", "T44:2"], "unknown accelerator 'T44'"),
        (["--gpus", "T4:two"], "T4:two"),
        (["--gpus", "T4:2", "--nodes", "0"], "--nodes"),
    ],
)
def test_bad_gpus_and_overrides_exit_2(project: Path, args: list[str], needle: str) -> None:
    res = run_cli(["up", "smoke", "--backend", "sky", "--dry-run", *args], cwd=project)
    assert_one_line_error(res, 2, needle)


def test_a_template_skypilot_rejects_or_a_missing_mount_exit_2(project: Path) -> None:
    (project / "sky").mkdir()
    template = yaml.safe_load((up_module.Path(__file__).parents[2] / "sky" / "smoke.yaml").read_text())
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


def test_each_attempt_of_the_managed_job_gets_its_own_deadline_never_past_the_jobs(
    project: Path, tmp_path: Path
) -> None:
    """SkyPilot reruns the same `run`, envs unchanged, on every recovery: the rendered job computes
    each attempt's LAUNCHER_DEADLINE when it starts (its leg budget from then), capped at the job's.
    Run by bash as SkyPilot would, with torchrun standing in as a printer of the deadline."""
    import subprocess

    from launcher.backends.sky.task import render_job

    cfg = load_config(project / "launcher.yaml")
    now = int(time.time())
    task = render_job(
        cfg,
        gpus=parse_gpus("T4:1"),
        nodes=1,
        image_ref=REF,
        leg_env=ENV,
        out=tmp_path / "job.yaml",
        job_deadline=now + 3600,
        leg_budget_s=600,
        max_restarts=2,
    )
    parsed = yaml.safe_load(task.yaml_text)
    assert parsed["resources"]["job_recovery"] == {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [75],
    }  # a stop on a spot notice
    assert "LAUNCHER_DEADLINE" not in parsed["envs"] and "autostop" not in parsed["resources"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text('#!/bin/sh\necho "deadline=$LAUNCHER_DEADLINE"\n')
    (bindir / "torchrun").chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "LAUNCHER_APP_DIR": str(tmp_path),
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "1",
        **{k: str(v) for k, v in parsed["envs"].items()},
    }

    def attempt(job_deadline: int) -> int:
        out = subprocess.run(
            ["bash", "-c", parsed["run"]],
            env=dict(env, PREFLIGHT_JOB_DEADLINE=str(job_deadline)),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split("=")[1])

    assert attempt(now + 3600) == pytest.approx(time.time() + 600, abs=5)  # a leg budget from now
    assert attempt(now + 120) == now + 120  # a late recovery: what is left of the job's, not a stale deadline
    parsed["resources"]["job_recovery"] = "none"
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "sky").mkdir()
    (tmp_path / "own" / "sky" / "run.yaml").write_text(yaml.safe_dump(dict(parsed, run="echo hi")))
    own = load_config(project / "launcher.yaml")
    import dataclasses

    own = dataclasses.replace(own, root=tmp_path / "own")
    with pytest.raises(Exception, match="drops max_restarts_on_errors"):
        render_job(
            own,
            gpus=parse_gpus("T4:1"),
            nodes=1,
            image_ref=REF,
            leg_env=ENV,
            out=tmp_path / "j2.yaml",
            job_deadline=now + 3600,
            leg_budget_s=600,
            max_restarts=2,
        )


def test_an_optimizer_stream_cut_before_its_table_is_told_apart_from_a_whole_one() -> None:
    """What `optimizer_pick` re-reads on: the stream of a loaded machine once ended at the
    table's title (seen under three test workers); a whole table has its header and chosen row."""
    from launcher.backends.sky.api import has_chosen_row, parse_optimizer_table

    cut = "Considered resources (1 node):\n"
    whole = cut + (
        "INFRA             INSTANCE       vCPUs  Mem(GB)  GPUS  COST ($)  CHOSEN\n"
        "GCP (us-central1)  n1-highmem-8   8      52       T4:2  1.17      \u2714\n"
    )
    assert not has_chosen_row(cut) and has_chosen_row(whole)
    with pytest.raises(RuntimeError, match="printed no chosen resources"):
        parse_optimizer_table(cut, 1)
    pick = parse_optimizer_table(whole, 1)
    assert pick.instance_type == "n1-highmem-8" and pick.hourly_usd == pytest.approx(1.17)


def test_a_credentials_failure_is_told_apart_from_no_capacity() -> None:
    """SkyPilot 0.14.1 reports refused credentials as ResourcesUnavailableError with the
    CloudUserIdentityError in its failover_history: bad input naming the credentials, with no
    retry hint (--retry-until-up would retry it forever); capacity anywhere in the history
    keeps the capacity refusal and its hint. A history served back as dicts is read the same."""
    from launcher.backends.sky.api import classify
    from launcher.errors import Refused

    e = sky.exceptions
    cred = e.CloudUserIdentityError("Failed to get GCP user identification. Details: no credentials")
    got = classify(sky, e.ResourcesUnavailableError("Failed to provision", failover_history=[cred]))
    assert isinstance(got, BadInput) and got.message.startswith(
        "no cloud credentials SkyPilot could use: CloudUserIdentityError: Failed to get GCP"
    )
    assert "retry" not in (got.hint or "")
    served = e.ResourcesUnavailableError("x", failover_history=[{"type": "InvalidCloudCredentials", "message": "m"}])
    assert isinstance(classify(sky, served), BadInput)
    mixed = classify(
        sky, e.ResourcesUnavailableError("x", failover_history=[cred, e.ResourcesUnavailableError("full")])
    )
    assert isinstance(mixed, Refused) and "--retry-until-up" in (mixed.hint or "")
    assert isinstance(classify(sky, e.ResourcesUnavailableError("no capacity anywhere")), Refused)

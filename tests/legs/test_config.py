"""Config validation and bad input: exit 2, one line naming the key, no traceback, no ledger row."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.load import load_config
from launcher.config.schema import parse_gpus, store_uri
from launcher.errors import ConfigError
from tests.helpers import assert_one_line_error, edit_config, run_cli, run_rows


def test_starter_config_loads_with_documented_defaults(project: Path) -> None:
    cfg = load_config(project / "launcher.yaml")
    assert cfg.trainer.command == ["python", "train.py", "--ckpt-every", "5"]
    assert cfg.rungs.rehearsal.steps == 20
    assert cfg.quota.gpu_hours == 30
    assert store_uri(cfg) == (project / ".launcher" / "store").as_uri()


@pytest.mark.parametrize("text, name, count", [("T4:2", "T4", 2), ("A100-80GB:8", "A100-80GB", 8), ("L4", "L4", 1)])
def test_gpus_accepted(text: str, name: str, count: int) -> None:
    spec = parse_gpus(text)
    assert (spec.name, spec.count) == (name, count)


@pytest.mark.parametrize("text", ["T4:two", ":2", "T4:0", "T4:-1", "T4:2:3", "", "4T:1"])
def test_gpus_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus(text)


BAD_CONFIGS = [
    ("unknown top-level key", lambda d: d.update(trainr={}), "trainr"),
    ("unknown nested key", lambda d: d["rungs"]["smoke"].update(stepz=3), "rungs.smoke.stepz"),
    ("wrong type", lambda d: d["rungs"]["smoke"].update(steps="ten"), "rungs.smoke.steps"),
    ("bool is not a number", lambda d: d["quota"].update(gpu_hours=True), "quota.gpu_hours"),
    ("impossible steps", lambda d: d["rungs"]["rehearsal"].update(steps=-3), "rungs.rehearsal.steps"),
    ("zero budget", lambda d: d["rungs"]["probe"].update(budget_minutes=0), "rungs.probe.budget_minutes"),
    ("negative quota", lambda d: d["quota"].update(gpu_hours=-1), "quota.gpu_hours"),
    ("bad period", lambda d: d["quota"].update(period="fortnight"), "quota.period"),
    ("bad project name", lambda d: d.update(project="My Project"), "project"),
    ("negative price", lambda d: d["prices"].update(T4=-0.1), "prices.T4"),
    ("empty command", lambda d: d["trainer"].update(command=[]), "trainer.command"),
    ("relative file store", lambda d: d.update(store="file://rel/dir"), "store"),
    ("unknown store scheme", lambda d: d.update(store="s3://bucket"), "store"),
    ("secret name", lambda d: d.update(secrets=["hf token"]), "secrets"),
    ("reserved leg env", lambda d: d["leg_env"].update(LAUNCHER_LEG="9"), "leg_env.LAUNCHER_LEG"),
    ("leg env value type", lambda d: d["leg_env"].update(OMP_NUM_THREADS=4), "leg_env.OMP_NUM_THREADS"),
    ("bad hf uri", lambda d: d.update(store="hf://just-a-name"), "store"),
]


@pytest.mark.parametrize("label, mutate, key", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_exit_2_names_key_no_row(project: Path, label: str, mutate, key: str) -> None:  # noqa: ANN001
    edit_config(project, mutate)
    res = run_cli(["up", "static"], cwd=project)
    assert_one_line_error(res, 2, key)
    assert run_rows(project) == 0


def test_invalid_yaml_names_line(project: Path) -> None:
    (project / "launcher.yaml").write_text("project: x\ntrainer: [unclosed\n")
    res = run_cli(["up", "static"], cwd=project)
    assert_one_line_error(res, 2, "line")
    assert run_rows(project) == 0


def test_missing_config_names_next_step(tmp_path: Path) -> None:
    res = run_cli(["up", "static"], cwd=tmp_path)
    assert_one_line_error(res, 2, "no config")
    assert "launcher init" in res.err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["up", "smoke", "--gpus", "T4:two"], "T4:two"),
        (["up", "smoke", "--gpus", ":2"], ":2"),
        (["up", "smoke", "--gpus", "T4:0"], "T4:0"),
        (["up", "smoke"], "--gpus"),
        (["up", "rehearsal", "--gpus", "T4:1"], "drop --gpus"),
        (["up", "warmup"], "unknown rung"),
        (["up", "rehearsal", "--backend", "azure"], "unknown backend"),
        (["up", "static", "--backend", "azure"], "unknown backend"),
        (["drill", "cold-resume", "--at", "node-lost"], "loses one node of several"),
        (["up", "rehearsal", "--nodes", "0"], "--nodes"),
        (["up", "run"], "--gpus"),
        (["up", "run", "--gpus", "T4:2", "--skip-preflight", ""], "--skip-preflight needs a reason"),
        (["up"], "Missing argument"),
        (["frobnicate"], "frobnicate"),
    ],
)
def test_bad_flags_exit_2_no_row(project: Path, args: list[str], needle: str) -> None:
    res = run_cli(args, cwd=project)
    assert_one_line_error(res, 2, needle)
    assert run_rows(project) == 0


def test_init_refuses_to_overwrite(project: Path) -> None:
    res = run_cli(["init", str(project)], cwd=project)
    assert_one_line_error(res, 2, "already exists")
    assert "--force" in res.err

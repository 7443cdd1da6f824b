"""The dry run is the launch: one plan (launcher.plan), shown or executed.

Parity is generated from the plan's own list of guards: every guard has a case that makes
it refuse, and for each the dry run and the real `launcher up` exit with the same code,
name the same reason, and record nothing. A guard added to `launcher.plan.GUARDS` without
a case here fails `test_every_guard_has_a_parity_case`.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Callable

import pytest

from launcher.plan import GUARDS
from tests.gpuhost import gpu_host_env
from tests.helpers import Rehearsed, assert_one_line_error, edit_config, run_cli, run_rows


def _no_docker(root: Path) -> dict[str, str]:
    return {"PATH": "/nonexistent"}  # the launcher is started by its own path; `docker` is found nowhere


def _no_review(root: Path) -> dict[str, str]:
    (root / ".launcher" / "ledger.db").unlink()
    return {}


def _edited(root: Path) -> dict[str, str]:
    train = root / "train.py"
    train.write_text(train.read_text() + "\n# edited after the review\n")
    return {}


def _nothing(root: Path) -> dict[str, str]:
    return {}


def _t4_host(root: Path) -> dict[str, str]:
    """A host with one T4 (tests/gpuhost.py): a GPU rung on the local backend passes the gpus guard."""
    return gpu_host_env("Tesla T4")


def _one_a10g(root: Path) -> dict[str, str]:
    return gpu_host_env("NVIDIA A10G")  # a GPU, not the one asked for


def _usd_budget(root: Path) -> dict[str, str]:
    edit_config(root, quota__budget_usd=0.01)  # smoke on T4:1: 3 legs x 10 min x $0.35/GPU-h = $0.17
    assert run_cli(["review"], cwd=root).code == 0
    return _t4_host(root)


def _past_a_t4(root: Path) -> dict[str, str]:
    """The template's trainer at 4.8B parameters (24 layers of width 4096): 78 GiB predicted on
    this CPU in seconds, none of it allocated (tests/unit/test_memory_predict.py measures that)."""
    big = "python train.py --ckpt-every 5 --n-layer 24 --n-embd 4096 --n-head 32 --block 256 --batch 4"
    edit_config(root, trainer__command=big)
    assert run_cli(["review"], cwd=root).code == 0
    return _t4_host(root)


def _hub_away(root: Path) -> dict[str, str]:
    edit_config(root, store="hf://tester/ckpts")
    assert run_cli(["review"], cwd=root).code == 0
    return {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_good"}  # the discard port: nothing answers


CASES: dict[str, tuple[Callable[[Path], dict[str, str]], list[str], int, str]] = {
    # guard: (how to make it refuse, the `up` arguments, the exit code, what the one line names)
    "docker": (_no_docker, ["rehearsal", "--backend", "docker"], 2, "the docker CLI is not installed"),
    "gpus": (
        _one_a10g,
        ["smoke", "--gpus", "T4:1"],
        3,
        "needs 1 T4 on this host for the local backend, and it has 1 x NVIDIA A10G",
    ),
    "review": (_no_review, ["rehearsal"], 3, "no review recorded"),
    "hashes": (_edited, ["rehearsal"], 3, "reviewed files differ from review #1"),
    "store": (_hub_away, ["rehearsal"], 2, "store hf://tester/ckpts does not answer"),
    "image": (_nothing, ["rehearsal", "--backend", "docker"], 3, "no image has been built for this project"),
    "preflight": (_t4_host, ["run", "--gpus", "T4:1"], 3, "no signed preflight report for exactly these files"),
    "memory": (_past_a_t4, ["smoke", "--gpus", "T4:1"], 3, "it would not fit on a T4"),
    "quota": (_usd_budget, ["smoke", "--gpus", "T4:1"], 3, "> budget $0.01"),
}


def test_every_guard_has_a_parity_case() -> None:
    assert set(CASES) == set(GUARDS), "each guard in launcher.plan.GUARDS needs a refusal case here"


def docker_cli_or_skip() -> None:
    """The docker cases need the docker CLI (no engine): a machine without it is told why."""
    if shutil.which("docker") is None:
        if os.environ.get("PREFLIGHT_SKIP_DOCKER") == "1":
            pytest.skip("PREFLIGHT_SKIP_DOCKER=1 and no docker CLI")
        pytest.fail("no docker CLI: `make test` installs it (or set PREFLIGHT_SKIP_DOCKER=1)")


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_the_dry_run_refuses_where_the_launch_refuses(guard: str, project: Path) -> None:
    make, args, code, needle = CASES[guard]
    if guard == "image":
        docker_cli_or_skip()
    env = make(project)
    before = run_rows(project)
    dry = run_cli(["up", *args, "--dry-run"], cwd=project, env=env)
    assert_one_line_error(dry, code, "a real launch would be refused", needle)
    real = run_cli(["up", *args], cwd=project, env=env)
    assert_one_line_error(real, code, needle)
    assert run_rows(project) == before  # refused before anything was recorded
    if (project / ".launcher" / "ledger.db").exists():
        with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
            assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0


SHAPES = [
    ["static"],
    ["rehearsal"],
    ["smoke", "--cpu"],
    ["probe", "--cpu"],
    ["run", "--cpu"],
    ["smoke", "--gpus", "T4:2"],
    ["rehearsal", "--backend", "docker"],
    ["probe", "--cpu", "--backend", "docker"],
]


def test_every_rung_and_backend_refuses_alike(project: Path, gpu_host) -> None:
    """Each rung, on the CPU and on a GPU request, on the local and docker backends: one plan,
    so an edited file is refused by the dry run and by the launch with the same line."""
    gpu_host("Tesla T4", 2)
    _edited(project)
    docker_cli_or_skip()
    for args in SHAPES:
        dry = run_cli(["up", *args, "--dry-run"], cwd=project)
        assert_one_line_error(dry, 3, "a real launch would be refused", "reviewed files differ from review #1")
        real = run_cli(["up", *args], cwd=project)
        assert_one_line_error(real, 3, "reviewed files differ from review #1")
    assert run_rows(project) == 0


def test_the_sky_backend_with_several_nodes_refuses_alike(project: Path, sky_api) -> None:  # noqa: ANN001
    """Another backend and shape through the same plan: two nodes on sky with a store only this
    machine has (SkyPilot's own API server, `sky_api`, renders and prices the dry run's leg 0)."""
    args = ["up", "smoke", "--gpus", "T4:2", "--backend", "sky", "--nodes", "2"]
    dry = run_cli([*args, "--dry-run", "--json"], cwd=project)
    assert_one_line_error(dry, 2, "a real launch would be refused", "hf://owner/repo")
    plan = dry.json()["plan"]
    assert plan["gpus_total"] == 4 and plan["nodes"] == 2 and len(plan["legs"]) == 3  # a GPU rung: no oracle leg
    assert [g["guard"] for g in plan["guards"] if not g["ok"]] == ["image"]
    real = run_cli(args, cwd=project)
    assert_one_line_error(real, 2, "hf://owner/repo")
    assert run_rows(project) == 0


def test_a_dry_run_names_every_reason_a_launch_would_stop_at(project: Path) -> None:
    """Three guards refuse: the launch stops at the first; the dry run names all, in order."""
    _edited(project)
    env = _usd_budget(project)  # the review it records accepts the edit: edit again for the hash guard
    _edited(project)
    dry = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=env)
    assert_one_line_error(dry, 3, "reviewed files differ", "> budget $0.01")
    line = dry.err.splitlines()[0]
    assert line.index("reviewed files differ") < line.index("> budget")
    real = run_cli(["up", "smoke", "--gpus", "T4:1"], cwd=project, env=env)
    assert_one_line_error(real, 3, "reviewed files differ")
    assert "budget" not in real.err.splitlines()[0]
    # on a host without the T4 the gpus guard comes first, and the others still follow it
    dry = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=gpu_host_env())
    line = dry.err.splitlines()[0]
    assert line.index("has no CUDA GPU") < line.index("reviewed files differ") < line.index("> budget")


def test_the_dry_run_counts_the_straight_through_leg_a_cpu_rung_launches(project: Path) -> None:
    """`up smoke --cpu` plans its three legs and the straight-through oracle: four, and its dry
    run says four; on a GPU there is no oracle (three). That a CPU resume rung launches the legs
    its dry run planned: the next test, on the shared rehearsal (smoke and rehearsal climb the
    same launcher.rungs.resume_legs.run_resume_legs)."""
    cpu = run_cli(["up", "smoke", "--cpu", "--dry-run"], cwd=project)
    assert (
        cpu.code == 0
        and "rung smoke on local, 4 legs: 3 of the rung, then leg 3 straight through on the CPU" in cpu.out
    ), cpu.out
    gpu = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=_t4_host(project))
    assert gpu.code == 0 and "rung smoke on local, 3 legs," in gpu.out, gpu.out
    planned = run_cli(["up", "smoke", "--cpu", "--dry-run", "--json"], cwd=project).json()["plan"]
    assert [g["guard"] for g in planned["guards"]] == ["review", "hashes", "store", "image", "quota"]
    assert [(g["leg"], g["role"] or "leg") for g in planned["legs"]] == [
        (0, "leg"),
        (1, "leg"),
        (2, "leg"),
        (3, "straight"),
    ]
    assert planned["env"]["LAUNCHER_RUN_ID"] == "dry-run" and planned["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert run_rows(project) == 0  # a dry run records nothing


def test_a_cpu_resume_rung_launches_the_legs_its_dry_run_planned(rehearsed: Rehearsed) -> None:
    """The worker's shared rehearsal (tests/legs/conftest.py), its dry run shown first: the legs
    launched are the dry run's, the oracle's included, and a CPU leg bills no GPU time (the quota
    counts GPUs' hours). Leg 0's environment against the dry run's: test_rehearsal."""
    planned = rehearsed.dry.json()["plan"]
    run = run_cli(["ledger", "--json"], cwd=rehearsed.root).json()[0]
    launched = [
        {"leg": leg["leg"], "role": leg["role"] or "leg", "max_steps": int(leg["env"]["LAUNCHER_MAX_STEPS"])}
        for leg in run["legs"]
    ]
    planned_legs = [dict(g, role=g["role"] or "leg") for g in planned["legs"]]
    assert launched == planned_legs and len(launched) == 4 and launched[-1]["role"] == "straight", planned
    assert [leg["billed_gpu_hours"] for leg in run["legs"]] == [0.0] * 4 and run["billed_gpu_hours"] == 0.0
    assert run["gpu_count"] == 0 and run["cost_usd"] == 0.0


def test_the_store_guard_asks_the_hub_with_the_legs_token(project: Path, hub_server) -> None:  # noqa: ANN001
    """A Hub store is asked once before any leg: a refused token is refused by the dry run and
    the launch alike (exit 2, nothing recorded); the right one passes, a repo not there yet too."""
    edit_config(project, store="hf://tester/ckpts")
    assert run_cli(["review"], cwd=project).code == 0
    bad = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": "hf_wrong"}
    dry = run_cli(["up", "rehearsal", "--dry-run"], cwd=project, env=bad)
    assert_one_line_error(dry, 2, "a real launch would be refused", "store hf://tester/ckpts refuses this token")
    assert_one_line_error(run_cli(["up", "rehearsal"], cwd=project, env=bad), 2, "refuses this token")
    assert run_rows(project) == 0
    good = run_cli(
        ["up", "rehearsal", "--dry-run", "--json"],
        cwd=project,
        env={"HF_ENDPOINT": hub_server.url, "HF_TOKEN": "hf_good"},
    )
    assert good.code == 0 and good.json()["plan"]["store"] == "hf://tester/ckpts", good.out

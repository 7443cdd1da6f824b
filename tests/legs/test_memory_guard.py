"""Will it fit: the memory guard of a GPU rung and `launcher memory` (launcher.ops.memory,
launcher.checks.memfit), on `launcher init`'s trainer predicted on this CPU.

A model far past a T4 is refused before anything is recorded, the numbers in one line; the
default trainer fits and the dry run lists every rank; a script the prediction cannot run is not
refused on that account (no prediction is no evidence that it does not fit)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.gpuhost import gpu_host_env
from tests.helpers import assert_one_line_error, edit_config, run_cli, run_rows

BIG = "python train.py --ckpt-every 5 --n-layer 24 --n-embd 4096 --n-head 32 --block 256 --batch 4"


def test_a_model_past_a_t4_is_refused_with_its_numbers_in_seconds(project: Path) -> None:
    edit_config(project, trainer__command=BIG)
    assert run_cli(["review"], cwd=project).code == 0
    began = time.perf_counter()
    res = run_cli(["up", "smoke", "--gpus", "T4:1"], cwd=project, env=gpu_host_env("Tesla T4"))
    took = time.perf_counter() - began
    assert_one_line_error(res, 3, "it would not fit on a T4", "predicted peak", "against T4's 15.00 GiB")
    line = res.err.strip().splitlines()[0]
    for part in ("parameters 18.01 GiB", "gradients 18.01 GiB", "optimizer 36.03 GiB", "CUDA context 512.0 MiB"):
        assert part in line, (part, line)  # 4.83B fp32 weights: 4 bytes each, AdamW's two moments twice that
    assert took < 120, took  # seconds on 2 cores (about 6 s unloaded), never the 78 GiB it predicts
    assert run_rows(project) == 0  # refused before anything was recorded
    mem = run_cli(["memory", "--gpus", "A100-80GB:1", "--json"], cwd=project)  # the cache answers
    assert mem.code == 3, mem.err
    ranks = json.loads(mem.out)["ranks"]
    assert [r["fits"] for r in ranks] == [False] and ranks[0]["needed"] > 80 * 2**30
    assert json.loads(mem.out)["cached"] is True


def test_the_default_trainer_fits_and_the_dry_run_shows_every_rank(project: Path) -> None:
    env = gpu_host_env("Tesla T4", "Tesla T4")
    res = run_cli(["up", "smoke", "--gpus", "T4:2", "--dry-run"], cwd=project, env=env)
    assert res.code == 0, res.err
    lines = [ln for ln in res.out.splitlines() if ln.strip().startswith(("memory:", "rank "))]
    assert lines[0].startswith("memory: 2 ranks"), lines
    assert [ln.strip()[:11] for ln in lines[1:]] == ["rank 0 of 2", "rank 1 of 2"]
    assert all(ln.endswith("against T4's 15.00 GiB: fits") for ln in lines[1:]), lines
    assert "NCCL buffers 256.0 MiB" in lines[1]  # two ranks: NCCL's own buffers in the allowance
    env = gpu_host_env("Tesla T4", "Tesla T4")
    plan = json.loads(run_cli(["up", "smoke", "--gpus", "T4:2", "--dry-run", "--json"], cwd=project, env=env).out)[
        "plan"
    ]
    assert [g["guard"] for g in plan["guards"]][-2:] == ["memory", "quota"]
    assert plan["memory"]["world_size"] == 2 and all(r["fits"] for r in plan["memory"]["ranks"])


def test_a_script_the_prediction_cannot_run_is_not_refused_for_it(project: Path) -> None:
    train = project / "train.py"
    refusing = "import os\nif os.environ.get('LAUNCHER_MEMORY'):\n    raise SystemExit('no fakes here')\n\n\ndef main("
    train.write_text(train.read_text().replace("def main(", refusing, 1))
    assert "LAUNCHER_MEMORY" in train.read_text()
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=gpu_host_env("Tesla T4"))
    assert res.code == 0, res.err
    assert "rank 0: no prediction (SystemExit: no fakes here" in res.out, res.out


def test_headroom_says_whether_activation_checkpointing_is_needed(project: Path) -> None:
    """A script that checkpoints activations is predicted again with checkpointing undone: where it
    would fit without, the plan says what checkpointing costs; where it would not, that it is needed."""
    geometry = "--n-layer 8 --n-embd 512 --n-head 8 --block 256 --batch 8"
    answers = {}
    for name, extra in (
        ("spare", geometry),
        ("needed", "--n-layer 12 --n-embd 768 --n-head 12 --block 1024 --batch 32"),
    ):
        edit_config(project, trainer__command=f"python train.py --ckpt-every 5 {extra} --activation-checkpointing")
        res = run_cli(["memory", "--gpus", "T4:1", "--json"], cwd=project)
        assert res.code == 0, res.err
        answers[name] = json.loads(res.out)["headroom"]["checkpointing"]
    spare, needed = answers["spare"], answers["needed"]
    assert spare["calls"] == 16 and spare["fits_without"] is True  # 8 blocks, 2 optimizer steps
    assert spare["plain_peak"] > 1.8 * spare["peak"]  # the blocks' activations kept: 913.6 against 476.9 MiB
    # (913.6 MiB: the reference L of bench/memory_predict.py, which runs without the flag)
    assert "it fits without checkpointing" in spare["line"] and "compute" in spare["line"]
    assert needed["fits_without"] is False and needed["plain_needed"] > 15 * 2**30 > needed["peak"]
    assert needed["line"].endswith("it is needed (the run would not fit without it)")


def test_memory_guard_warn_launches_what_refuse_refuses_and_off_predicts_nothing(project: Path) -> None:
    """launcher.yaml's memory.guard: `warn` plans the model past a T4 with a warning where `refuse`
    stops it (a launch then records that it went over: tests/unit/test_memscore.py); `off` predicts nothing."""
    edit_config(project, trainer__command=BIG, memory__guard="warn")
    assert run_cli(["review"], cwd=project).code == 0
    env = gpu_host_env("Tesla T4")
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run", "--json"], cwd=project, env=env)
    assert res.code == 0, res.err
    plan = json.loads(res.out)["plan"]
    assert plan["memory"]["guard"] == "warn" and plan["memory"]["ranks"][0]["fits"] is False
    text = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=env).out
    assert "warning: memory.guard is warn: it would not fit on a T4: the one rank: predicted peak" in text
    edit_config(project, memory__guard="off")
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run", "--json"], cwd=project, env=env)
    assert res.code == 0 and json.loads(res.out)["plan"]["memory"] is None
    text = run_cli(["up", "smoke", "--gpus", "T4:1", "--dry-run"], cwd=project, env=env).out
    assert "memory: not predicted (memory.guard: off in launcher.yaml)" in text


def test_the_allowance_grows_by_the_largest_gpu_error_this_project_measured(project: Path) -> None:
    """A GPU rung of this project that measured 25 % over its prediction (a `memory_scored` check in
    the ledger) adds 25 % of the peak to every rank's allowance from then on; another project's
    error, or a rung that measured no GPU, adds nothing."""
    from launcher.checks.evidence import Check, Kind
    from launcher.ledger.db import Ledger

    def scored(facts: dict) -> dict:
        return Check("memory: predicted against measured", True, "", kind=Kind.MEMORY_SCORED, facts=facts).to_json()

    before = json.loads(run_cli(["memory", "--gpus", "T4:1", "--json"], cwd=project).out)["ranks"][0]
    with Ledger(project / ".launcher" / "ledger.db") as ledger:
        for rid, name, facts in (
            ("r-mine", "proj", {"predicted": 100 * 2**20, "allocated": 125 * 2**20}),
            ("r-mine-cpu", "proj", {"predicted": 100 * 2**20, "allocated": None}),
            ("r-other", "other", {"predicted": 100 * 2**20, "allocated": 200 * 2**20}),
        ):
            ledger.begin_run(
                {"id": rid, "project": name, "rung": "probe", "backend": "sky", "gpu_name": "T4", "gpu_count": 1,
                 "nodes": 1, "store_uri": "file:///s", "review_id": None, "files_digest": "d",
                 "config_sha256": "c", "started_at": time.time()},
                {},
            )  # fmt: skip
            ledger.add_checks(rid, [scored(facts)])
    after = json.loads(run_cli(["memory", "--gpus", "T4:1", "--json"], cwd=project).out)["ranks"][0]
    assert "largest GPU error so far 25%" not in before["allowance"]
    assert after["allowance"]["largest GPU error so far 25%"] == int(after["peak"] * 0.25)
    assert after["needed"] - before["needed"] == int(after["peak"] * 0.25)

"""The plan and rung 0 of a command that starts several processes: rung 0 of a `torchrun`
command runs in the interpreter that torchrun belongs to, and the dry run states the shape
its legs train in, warning where they would run another than the command says (launcher.ops.shape; the refusal of a resume in another shape is unit-tested
in tests/unit/test_plan_shape.py)."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import details, edit_config, run_cli
from tests.legs.test_examples import copy_example, hf_python


def test_a_bare_torchrun_of_the_trainers_venv_passes_rung_0(tmp_path: Path, leg_tmp: Path) -> None:
    """The HF example imports transformers, which only .venv-hf has: a bare `torchrun` found on
    PATH in .venv-hf is neither rebound to the launcher's venv (which has a torchrun and no
    transformers) nor checked in the launcher's interpreter ("No module named 'transformers'")."""
    root = copy_example("hf_trainer", tmp_path)
    edit_config(root, trainer__command="torchrun --standalone --nproc_per_node 2 train.py --save-steps 5")
    assert run_cli(["review"], cwd=root).code == 0
    path = {"PATH": f"{Path(hf_python()).parent}{os.pathsep}{os.environ['PATH']}"}
    res = run_cli(["up", "static", "--json"], cwd=root, env=path)
    assert res.code == 0, res.out + res.err
    assert '"save_steps": 5' in details(res, Kind.TRAINER_STATIC)
    dry = run_cli(["up", "rehearsal", "--dry-run"], cwd=root, env=path)
    assert dry.code == 0, dry.out + dry.err
    assert "/.venv-hf/bin/torchrun --standalone" in dry.out  # the leg runs the same torchrun
    assert "shape: 2 ranks (torchrun --nproc_per_node 2)" in dry.out
    nodes = run_cli(["up", "rehearsal", "--dry-run", "--nodes", "2"], cwd=root, env=path)  # the plan's warnings
    assert nodes.code == 0 and "shape: 2 ranks (2 nodes x 1 processes: one on a CPU node)" in nodes.out, nodes.out
    assert "each node's run: script starts 1 process(es) (one on a CPU node), not 2" in nodes.out

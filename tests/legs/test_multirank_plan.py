"""The plan and rung 0 of a command that starts several processes: rung 0 of a `torchrun`
command runs in the interpreter that torchrun belongs to, and the dry run states the shape
its legs train in, warning where they would run another than the command says (launcher.ops.shape; the refusal of a resume in another shape is unit-tested
in tests/unit/test_plan_shape.py)."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import assert_one_line_error, details, edit_config, run_cli, run_rows
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


def test_a_command_waiting_for_more_nodes_than_the_leg_has_is_refused_alike(project: Path) -> None:
    """`torchrun --nnodes 2` on a leg of one node waits for its rendezvous until the leg's budget:
    the dry run and the launch refuse it with the same line, exit 3, nothing recorded."""
    edit_config(project, trainer__command="torchrun --nnodes 2 --nproc_per_node 1 train.py --ckpt-every 5")
    assert run_cli(["review"], cwd=project).code == 0
    before = run_rows(project)
    needle = "the command's `torchrun --nnodes 2` waits for 2 nodes; this plan runs 1"
    assert_one_line_error(run_cli(["up", "rehearsal", "--dry-run"], cwd=project), 3, needle)
    assert_one_line_error(run_cli(["up", "rehearsal"], cwd=project), 3, needle)
    assert run_rows(project) == before

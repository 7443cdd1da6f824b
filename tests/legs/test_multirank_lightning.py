"""examples/lightning_ddp (examples/lightning with `Trainer(devices=2, strategy="ddp")` on CPU) on
the ladder: static -> rehearsal -> `drill cold-resume --kills 2 --at mid-push` -> report, proofs
1-4 and 6-8 PASS, 5 MISSING, on the two shapes its users run it in: 2 ranks of one node under
Lightning's own launcher (with accumulate_grad_batches 4: micro-batches and optimizer steps
counted apart, every stop at a window's end), and 2 nodes x 1 rank under each node's torchrun
(each node its own disk, only the store shared). Every rank prints its own step events, and the
launcher compares each rank's with the straight-through run's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind
from tests.helpers import check, failed, run_cli
from tests.legs.test_examples import EXAMPLES, drill_and_report, pl_python

NAME = "lightning_ddp"


RANK_SEEDS = (
    "    def on_fit_start(self) -> None:\n"
    "        torch.manual_seed(100 + self.global_rank)  # each rank its own dropout (Lightning seeded all alike)\n\n"
    "    def configure_optimizers(self)"
)


def copy_ddp(dest: Path, accumulate: int = 1, leg_env: dict[str, str] | None = None, rank_seeds: bool = False) -> Path:
    """examples/lightning_ddp, reviewed, its `python` Lightning's interpreter, ACCUMULATE set;
    `rank_seeds`: each rank on its own RNG stream from the fit's start (a rank resumed on
    another rank's stream trains another dropout: the launcher compares each rank's)."""
    root = dest / NAME
    shutil.copytree(EXAMPLES / NAME, root)
    train = root / "train.py"
    text = train.read_text().replace("ACCUMULATE = 1\n", f"ACCUMULATE = {accumulate}\n")
    train.write_text(text.replace("    def configure_optimizers(self)", RANK_SEEDS) if rank_seeds else text)
    cfg = root / "launcher.yaml"
    text = cfg.read_text().replace("command: python ", f"command: {pl_python()} ")
    if leg_env:
        text += "leg_env:\n" + "".join(f'  {k}: "{v}"\n' for k, v in leg_env.items())
    cfg.write_text(text)
    assert run_cli(["review"], cwd=root).code == 0
    return root


def test_the_ddp_example_climbs_on_two_ranks_of_one_node_with_accumulation(tmp_path: Path, leg_tmp: Path) -> None:
    """Lightning's own launcher (the script started again for rank 1 inside `fit`, before any
    process group: the resume is chosen at `setup`), accumulate_grad_batches 4: both ranks'
    steps identical to the straight run's, every resume at a window's end."""
    root = copy_ddp(tmp_path, accumulate=4)
    assert run_cli(["up", "static", "--json"], cwd=root).code == 0
    rehearsal = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    drill_and_report(root)


@pytest.fixture
def lightning_torchrun_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node's `run:` starts `torchrun` from PATH: the one beside Lightning's interpreter."""
    monkeypatch.setenv("PATH", f"{Path(pl_python()).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def test_the_ddp_example_climbs_on_two_nodes_of_one_rank(
    tmp_path: Path, leg_tmp: Path, lightning_torchrun_first: None
) -> None:
    """Two nodes x 1 rank (torchrun on each; Lightning's devices=2 is torchrun's world of 2): the
    store is all the nodes share; rank 1's node fetches the checkpoint rank 0 chose; each rank on
    its own RNG stream, each resumed on its own (the callback saves every rank's)."""
    root = copy_ddp(tmp_path, leg_env={"PREFLIGHT_NPROC_PER_NODE": "1"}, rank_seeds=True)
    nodes = ["--nodes", "2"]
    assert run_cli(["up", "static", "--json"], cwd=root).code == 0
    rehearsal = run_cli(["up", "rehearsal", *nodes, "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, failed(rehearsal)
    assert "identical at every step" in check(rehearsal, Kind.TIMELINE)["detail"]
    drill_and_report(root, nodes)


def test_a_strategy_the_adapter_has_not_run_is_refused_at_rung_0(tmp_path: Path) -> None:
    """`strategy="ddp_spawn"` (the ranks spawned from this process, the callback's state left
    behind): `up static` refuses it, exit 3, one line naming the line and the strategy to use,
    before any leg could fail or hang."""
    root = copy_ddp(tmp_path)
    train = root / "train.py"
    train.write_text(train.read_text().replace('strategy="ddp"', 'strategy="ddp_spawn"'))
    assert run_cli(["review"], cwd=root).code == 0
    static = run_cli(["up", "static"], cwd=root)
    lines = [line for line in static.err.splitlines() if line.strip()]
    assert static.code == 3 and len(lines) == 1 and "train.py:" in lines[0] and 'strategy="ddp"' in lines[0], static

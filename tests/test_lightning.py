"""examples/lightning: a Lightning script (ModelCheckpoint, a StatefulDataLoader, a warm-up
stepped every batch, dropout) on the ladder through runtime.adapters.lightning, in its own
interpreter (.venv-lightning), and the Lightning resume bugs it must catch."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli
from tests.test_examples import EXAMPLES, copy_example, drill_and_report
from tests.test_planted_bugs import failed, plant, rehearse, report_fails


def test_the_lightning_example_climbs_the_ladder(tmp_path: Path, leg_tmp: Path) -> None:
    diff = (EXAMPLES / "lightning" / "ladder.diff").read_text().splitlines()
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]
    assert len(added) <= 3, added
    root = copy_example("lightning", tmp_path)
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out
    code, checks = rehearse(root)
    assert code == 0, failed(checks)
    assert "identical at every step" in checks["resumed run = straight-through run"]["detail"]
    drill_and_report(root)


def test_fit_from_last_on_a_fresh_disk_trains_from_scratch(tmp_path: Path, leg_tmp: Path) -> None:
    """Lightning's own `ckpt_path="last"` looks on the local disk: a leg on a fresh machine finds
    nothing there, warns, and trains from step 0 while the store holds a verified checkpoint."""
    root = copy_example("lightning", tmp_path)
    plant(root, "ckpt_path=pf.resume())", 'ckpt_path="last")')
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "printed no `resume` event: it started from scratch" in bad["leg 1 resumed from the store"], bad
    assert "did not pull a checkpoint back" in report_fails(root, 1, 2, 3, 4)[1]


def test_a_module_that_drops_the_scheduler_on_load_restarts_its_warm_up(tmp_path: Path, leg_tmp: Path) -> None:
    """`on_load_checkpoint` empties the schedulers' list (a "re-tune the schedule on resume" hook):
    Lightning restores nothing into the LambdaLR, whose warm-up starts over."""
    root = copy_example("lightning", tmp_path)
    plant(root, "    def configure_optimizers(self) -> dict:\n",
          "    def on_load_checkpoint(self, checkpoint: dict) -> None:\n"
          "        checkpoint[\"lr_schedulers\"] = []\n\n"
          "    def configure_optimizers(self) -> dict:\n")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "the straight-through run's LR there is" in bad["leg 1: LR follows the schedule"], bad
    assert "scheduler as loaded at step" in bad["leg 1: optimizer, scheduler loaded as saved (state digests)"], bad
    assert "LR follows the schedule" in report_fails(root, 3)[3]

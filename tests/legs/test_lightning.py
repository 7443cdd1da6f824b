"""examples/lightning: a Lightning script (ModelCheckpoint, a StatefulDataLoader, a warm-up
stepped every batch, dropout) on the ladder through runtime.adapters.lightning, in its own
interpreter (.venv-lightning): the Lightning resume bugs it must catch, and the resume's own check
of what the store hands it. The example's climb (static -> rehearsal -> drill -> report) is in
tests/legs/test_examples.py with the others."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, failed
from tests.legs.test_examples import REPO, copy_example, pl_python
from tests.legs.test_planted_bugs import plant, rehearse, report_fails


def test_fit_from_last_on_a_fresh_disk_trains_from_scratch(tmp_path: Path, leg_tmp: Path) -> None:
    """Lightning's own `ckpt_path="last"` looks on the local disk: a leg on a fresh machine finds
    nothing there, warns, and trains from step 0 while the store holds a verified checkpoint."""
    root = copy_example("lightning", tmp_path)
    plant(root, "ckpt_path=pf.resume())", 'ckpt_path="last")')
    code, checks = rehearse(root)
    bad = failed(checks)
    assert (
        code == 1 and "printed no `resume` event: it started from scratch" in check(bad, Kind.RESUMED, leg=1)["detail"]
    ), bad
    assert "did not pull a checkpoint back" in report_fails(root, 1, 2, 3, 4)[1]


def test_a_module_that_drops_the_scheduler_on_load_restarts_its_warm_up(tmp_path: Path, leg_tmp: Path) -> None:
    """`on_load_checkpoint` empties the schedulers' list (a "re-tune the schedule on resume" hook):
    Lightning restores nothing into the LambdaLR, whose warm-up starts over."""
    root = copy_example("lightning", tmp_path)
    plant(
        root,
        "    def configure_optimizers(self) -> dict:\n",
        "    def on_load_checkpoint(self, checkpoint: dict) -> None:\n"
        '        checkpoint["lr_schedulers"] = []\n\n'
        "    def configure_optimizers(self) -> dict:\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "the straight-through run's LR there is" in check(bad, Kind.LR, leg=1)["detail"], bad
    assert "scheduler as loaded at step" in check(bad, Kind.STATE_RESTORED, leg=1)["detail"], bad
    assert "LR follows the schedule" in report_fails(root, 3)[3]


CHECKS = r"""
import os, pickle, random, sys
from pathlib import Path
import numpy as np, torch
from runtime.adapters.lightning import CKPT_FILE, _check, rng_state, set_rng_state
from runtime.store.base import CheckpointDamaged

root = Path(sys.argv[1])
def folder(name, payload):
    f = root / name
    f.mkdir()
    torch.save(payload, f / CKPT_FILE) if not isinstance(payload, bytes) else (f / CKPT_FILE).write_bytes(payload)
    return f

class Boom:
    def __reduce__(self):
        return (os.system, ("touch " + str(root / "pwned"),))

_check(folder("step-00000005", {"global_step": 5, "state_dict": {}}), None)  # loads, says its step
for name, payload, why in [
    ("step-00000006", pickle.dumps({"global_step": 6, "x": Boom()}), "weights_only"),
    ("step-00000007", {"global_step": 9}, "global_step 9"),
    ("step-00000008", b"not a checkpoint", "weights_only"),
]:
    try:
        _check(folder(name, payload), None)
    except CheckpointDamaged as err:
        assert why in str(err), (name, str(err))
    else:
        raise AssertionError(name + " was not refused")
assert not (root / "pwned").exists(), "a forged checkpoint ran code"

torch.manual_seed(3); random.seed(3); np.random.seed(3)
torch.save(rng_state(), root / "rng.pt")
want = (torch.rand(3), random.random(), np.random.rand())
set_rng_state(torch.load(root / "rng.pt", weights_only=True))  # weights_only reads it back
got = (torch.rand(3), random.random(), np.random.rand())
assert torch.equal(want[0], got[0]) and want[1:] == got[1:], (want, got)
print("ok")
"""


def test_a_forged_or_mislabelled_lightning_checkpoint_is_damaged_and_the_rng_round_trips(tmp_path: Path) -> None:
    """The resume's own check, in Lightning's interpreter: a pickle that would run code, a file
    that names another step, bytes that are no checkpoint: each refused as damaged (the next older
    verified one is tried), nothing run; the RNG streams the callback saves load with
    weights_only=True and continue exactly."""
    proc = subprocess.run(
        [pl_python(), "-c", CHECKS, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]

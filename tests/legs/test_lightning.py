"""Lightning scripts on the ladder through runtime.adapters.lightning, in their own interpreter
(.venv-lightning): examples/lightning (the public examples' shape: a plain DataLoader(shuffle=True),
SGD, epoch-end checkpoints) and tests/assets/lightning_stateful (a StatefulDataLoader of its own,
a warm-up stepped every batch, a ModelCheckpoint every 5 steps). The Lightning resume bugs they
must catch, the resumes that must stay green (an epoch-end checkpoint), the loaders the adapter
refuses, and the resume's own check of what the store hands it. The example's climb (static ->
rehearsal -> drill -> report) is in tests/legs/test_examples.py with the others."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, failed, run_cli
from tests.legs.test_examples import EXAMPLES, REPO, copy_example, pl_python
from tests.legs.test_planted_bugs import plant, rehearse, report_fails

STATEFUL = REPO / "tests" / "assets" / "lightning_stateful"


def copy_stateful(dest: Path) -> Path:
    """tests/assets/lightning_stateful, reviewed, its `python` Lightning's interpreter."""
    root = dest / "lightning_stateful"
    shutil.copytree(STATEFUL, root)
    cfg = root / "launcher.yaml"
    cfg.write_text(cfg.read_text().replace("command: python ", f"command: {pl_python()} "))
    assert run_cli(["review"], cwd=root).code == 0
    return root


def test_fit_from_last_on_a_fresh_disk_trains_from_scratch(tmp_path: Path, leg_tmp: Path) -> None:
    """Lightning's own `ckpt_path="last"` looks on the local disk: a leg on a fresh machine finds
    nothing there, warns, and trains from step 0 while the store holds a verified checkpoint."""
    root = copy_stateful(tmp_path)
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
    root = copy_stateful(tmp_path)
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

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from runtime.adapters.lightning_data import NotResumable, Seed, position, resumable

class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))

data = TensorDataset(torch.arange(20))
own = StatefulDataLoader(data, batch_size=4)
assert resumable(own, Seed(0)) is own  # a loader with state of its own is left alone
for bad, why in [
    (DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 4, False)), "custom batch_sampler"),
    (DataLoader(Stream(), batch_size=2), "IterableDataset"),
    (DataLoader(data, sampler=list(range(20)), batch_size=4), "sampler is a list"),
]:
    try:
        resumable(bad, Seed(0))
    except NotResumable as err:
        assert why in str(err), str(err)
    else:
        raise AssertionError(why + " was made resumable")

def plain(seed):
    return resumable(DataLoader(data, batch_size=6, shuffle=True, num_workers=0), Seed(seed))

def orders(seed):
    loader, out = plain(seed), []
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        before = torch.get_rng_state()
        out.append([b[0].tolist() for b in loader])
        assert torch.equal(before, torch.get_rng_state()), "iter() drew from the global RNG"
    return out

first = orders(7)
assert first == orders(7) and first[0] != first[1] and first != orders(8), first
assert sorted(sum(first[0], [])) == list(range(20)) and len(first[0][-1]) == 2  # every item, drop_last kept off
loader = plain(7)
it = iter(loader)
next(it), next(it)
again = plain(7)
again.load_state_dict(loader.state_dict())  # mid-epoch: the rest of epoch 0, then epoch 1 as before
assert [b[0].tolist() for b in again] == first[0][2:]
again.sampler.set_epoch(1)
assert [b[0].tolist() for b in again] == first[1]
done = {"_num_yielded": 4, "_iterator_finished": False}
assert position(done, 0, 4, 7) == position({"_num_yielded": 0, "_iterator_finished": False}, 1, 4, 7)
assert position({"_num_yielded": 3, "_iterator_finished": False}, 0, 4, 7) != position(done, 0, 4, 7)

from torch.utils.data.distributed import DistributedSampler
from runtime.adapters.lightning_state import last_batch_as_mid_epoch, named_step

def injected(seed):  # the loader Lightning hands over on 2 ranks: a DistributedSampler seeded by PL_GLOBAL_SEED
    return resumable(DataLoader(data, batch_size=4, sampler=DistributedSampler(data, 2, 0, seed=5)), seed)

fresh, resumed = Seed(), Seed(9)
assert injected(fresh).sampler.inner.seed == 5 and fresh.value == 5  # the seed it uses is the one saved
assert injected(resumed).sampler.inner.seed == 9  # a resume's saved seed, whatever this leg seeded

def saved(batches_completed, epochs_processed):
    return {"loops": {"fit_loop": {
        "epoch_loop.batch_progress": {"total": {"processed": 10, "completed": batches_completed}, "is_last_batch": True},
        "epoch_progress": {"total": {"started": 1, "processed": epochs_processed}},
    }}}
stop, epoch_end = saved(9, 0), saved(10, 1)  # on_train_batch_end of the last batch; ModelCheckpoint's epoch end
assert last_batch_as_mid_epoch(stop) and not stop["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"]
assert not last_batch_as_mid_epoch(epoch_end) and epoch_end["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"]
assert named_step({"global_step": 3, "callbacks": {"Preflight": {"micro_step": 12}}}) == 12
assert named_step({"global_step": 3, "callbacks": {}}) == 3
from runtime.adapters.lightning_state import rank_rng
from runtime.session.rules import LegEnd
assert rank_rng(["r0", "r1"], 1, 2) == "r1" and rank_rng({"torch": 1}, 0, 1) == {"torch": 1}  # each rank its own
try:
    rank_rng(["r0", "r1"], 0, 1)
except LegEnd as err:
    assert err.exit_code == 3, err.exit_code  # a checkpoint of 2 ranks on 1: refused
else:
    raise AssertionError("2 ranks' RNG taken by a world of 1")

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
    weights_only=True and continue exactly. And the loaders (runtime.adapters.lightning_data): a
    StatefulDataLoader left alone; a custom batch_sampler, an IterableDataset, a sampler of no
    known order each refused, the change named; a plain DataLoader(shuffle=True) rebuilt with an
    order that is a function of (seed, epoch), an iter() that draws nothing from the global RNG,
    a mid-epoch position that resumes exactly; a state at an epoch's end is the next one's start;
    Lightning's injected DistributedSampler seeded by the resume's saved seed (another
    seed_everything shuffled another order, unseen), the seed saved the one it uses; each rank its
    own saved RNG (a checkpoint of 2 ranks on 1 refused, exit 3); the two saves
    of an epoch's last step told apart by their loops state; a checkpoint named by its batches."""
    proc = subprocess.run(
        [pl_python(), "-c", CHECKS, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["ok"], proc.stderr[-3000:]  # after the refusal's stop


def _leg(root: Path, steps: int, leg: int) -> tuple[int, list[dict]]:
    """train.py run by hand as leg `leg` of a run (the store in root/store), up to `steps`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    env.update(PYTHONPATH=str(REPO), LAUNCHER_MAX_STEPS=str(steps), LAUNCHER_LEG=str(leg), OMP_NUM_THREADS="1")
    proc = subprocess.run([pl_python(), "train.py"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def test_a_plain_loader_resumes_exactly_from_either_save_of_an_epochs_last_step(tmp_path: Path) -> None:
    """examples/lightning's plain DataLoader(shuffle=True), made resumable by the adapter, resumed
    at step 10 (an epoch is 10 batches) from each of the two saves of an epoch's last step:
    Lightning's own epoch-end checkpoint, and a stop's save in `on_train_batch_end` of the last
    batch (Lightning resumed that one into an empty epoch 1 and trained epoch 2, exit 0: the
    adapter now tells the two apart from the checkpoint's loops state). Every resumed step, into
    epoch 1, is the straight run's (the fed inputs' hash, the loss bit for bit, the epoch), and the loader as loaded
    is the loader as saved: a saved state that yielded all of epoch 0 and the fresh iterator of
    epoch 1 are one position (their raw bytes differ: proof 2 FAILed on it). The save says what
    the state holds: SGD without momentum has no optimizer bytes (proof 7 sizes by it). A
    custom batch_sampler ends the leg refused, exit 3, the change named."""
    straight, legs, stopped, refused = (tmp_path / name for name in ("straight", "legs", "stopped", "refused"))
    for folder in (straight, legs, stopped, refused):
        folder.mkdir()
        shutil.copy(EXAMPLES / "lightning" / "train.py", folder)
    ref = {e["step"]: e for e in _of(_leg(straight, 14, 0)[1], "step")}
    code, first = _leg(legs, 12, 0)
    assert code == 0 and [e["step"] for e in _of(first, "state_digest")] == [10, 12], first[-3:]
    shutil.rmtree(legs / "store" / "runs" / "local" / "step-00000012")  # the epoch-end one is the newest
    code, second = _leg(legs, 14, 1)
    resume = _of(second, "resume")
    assert code == 0 and resume and resume[0]["from_step"] == 10, second[-3:]
    assert resume[0]["digests"] == _of(first, "state_digest")[0]["digests"]
    steps = _of(second, "step")
    assert [e["step"] for e in steps] == [11, 12, 13, 14] and all(e["batch_from"] == "forward" for e in steps)
    assert all((e["loss"], e["batch_hash"]) == (ref[e["step"]]["loss"], ref[e["step"]]["batch_hash"]) for e in steps)
    code, first = _leg(stopped, 10, 0)  # the stop's save at the epoch's last batch
    assert code == 0 and [e["step"] for e in _of(first, "state_digest")] == [10], first[-3:]
    code, second = _leg(stopped, 14, 1)
    steps = _of(second, "step")
    assert code == 0 and [e["step"] for e in steps] == [11, 12, 13, 14], second[-3:]
    keys = ("loss", "batch_hash", "epoch")
    assert all([e[k] for k in keys] == [ref[e["step"]][k] for k in keys] for e in steps), (steps, ref)
    params = _of(first, "start")[0]["params"]
    assert _of(first, "save")[0]["state_bytes"] == {"model": 4 * params}
    train = refused / "train.py"
    train.write_text(
        train.read_text().replace(
            "batch_size=BATCH_SIZE, shuffle=True)",
            "batch_sampler=torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), BATCH_SIZE, False))",
        )
    )
    code, events = _leg(refused, 4, 0)
    stop = _of(events, "stop")
    assert code == 3 and stop[0]["reason"] == "loader_not_resumable" and "batch_sampler" in stop[0]["error"], events


def test_a_curriculum_counter_not_saved_feeds_the_model_other_inputs(tmp_path: Path, leg_tmp: Path) -> None:
    """A LightningModule that cuts each batch by a counter of its own (a curriculum lengthening the
    windows) and leaves it out of the checkpoint: after a resume the counter starts over and the
    model is fed shorter windows than the straight run's at those steps, while the batch handed to
    training_step is the same one. The adapter hashes what the model was fed, as the Session does
    (it hashed the batch handed to training_step, and only the loss told): proof 2 says no."""
    root = copy_example("lightning", tmp_path)
    plant(
        root,
        "        inputs, target = batch\n",
        "        inputs, target = batch\n"
        "        self.seen = getattr(self, 'seen', 0) + 1\n"
        "        cut = 4 + self.seen // 2\n"
        "        inputs, target = inputs[:, :cut].contiguous(), target[:, :cut].contiguous()\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and checks_of(bad, Kind.DATA_POSITION), bad
    report_fails(root, 2)

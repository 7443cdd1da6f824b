"""Classic resume bugs, planted one at a time into trainers that otherwise climb the
ladder: each must be caught -- the rung answers no, naming the check, and the
report's proof FAILs. None of them is visible in what the trainer says about
itself (its sample index, its `verify` event): the checks rest on the batch hashes
the leg API measures, the straight-through run, and the launcher's own read of
the store. A loader position not saved (the epoch re-read) is planted in
tests/legs/test_planted_loaders.py, a StatefulDataLoader left untracked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, details, failed, run_cli
from tests.legs.test_examples import copy_example
from tests.legs.test_report import reword_checks


def plant(root: Path, old: str, new: str) -> None:
    train = root / "train.py"
    text = train.read_text()
    assert old in text, old
    train.write_text(text.replace(old, new, 1))
    assert run_cli(["review"], cwd=root).code == 0


def rehearse(root: Path) -> tuple[int, list[dict]]:
    res = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    return res.code, res.json()["checks"]


def report_fails(root: Path, *numbers: int) -> dict[int, str]:
    res = run_cli(["report", "--json"], cwd=root, timeout=600)
    status = {p["number"]: (p["status"], p["summary"]) for p in res.json()["proofs"]}
    assert res.code == 1, status  # a FAILed proof: the report says no
    for n in numbers:
        assert status[n][0] == "FAIL", (n, status[n])
    return {n: s for n, (st, s) in status.items() if st == "FAIL"}


def report_status(root: Path) -> dict[int, tuple[str, str]]:
    res = run_cli(["report", "--json"], cwd=root, timeout=600)
    return {p["number"]: (p["status"], p["summary"]) for p in res.json()["proofs"]}


def test_a_fresh_optimizer_state_breaks_bit_identity(tmp_path: Path, leg_tmp: Path) -> None:
    """Optimizer not tracked: its state starts fresh each leg. Proof 3 cannot say whether it
    was restored (MISSING, with the reason), and the exact replay sees the difference."""
    root = copy_example("flat_gpt", tmp_path)
    plant(root, "sess.track(model=model, optimizer=optimizer)", "sess.track(model=model)")
    code, checks = rehearse(root)
    bad = failed(checks)
    detail = check(bad, Kind.TIMELINE)["detail"]
    assert code == 1 and "first difference at step" in detail and "loss" in detail, bad
    # leg 0 (a fresh start) agreed with the straight-through run over its steps: no second
    # straight-through leg was spent to ask whether the trainer reproduces itself
    assert not checks_of(bad, Kind.CPU_DETERMINISM)
    legs = run_cli(["ledger", "--json"], cwd=root).json()[0]["legs"]
    assert [leg["role"] for leg in legs][-1] == "straight" and len(legs) == 4, [leg["role"] for leg in legs]
    status = report_status(root)
    assert status[4][0] == "FAIL", status
    assert status[3][0] == "MISSING" and "no optimizer is tracked" in status[3][1], status


def test_an_optimizer_re_created_after_the_resume_is_named(tmp_path: Path, leg_tmp: Path) -> None:
    """The tracked optimizer is restored, then the loop builds a new one and steps that: the LR
    is set by hand each step, so the LR check holds; the tracked optimizer's step count does not."""
    root = copy_example("flat_gpt", tmp_path)
    plant(
        root,
        "iter_num = sess.resume()\n",
        "iter_num = sess.resume()\nif iter_num:\n    optimizer = "
        "torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1)\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert (
        code == 1
        and "the loop steps an optimizer the session does not track"
        in check(bad, Kind.OPTIMIZER_IN_USE, leg=1)["detail"]
    ), bad
    assert check(checks, Kind.LR, leg=1)["ok"]  # the LR alone would have passed it
    status = report_status(root)
    assert status[3][0] == "FAIL" and "does not track" in status[3][1], status


def copy_asset(name: str, dest: Path) -> Path:
    root = dest / name
    shutil.copytree(Path(__file__).parents[1] / "assets" / name, root)
    assert run_cli(["review"], cwd=root).code == 0
    return root


def test_a_prefetching_loop_is_checked_on_the_batch_the_model_ate(tmp_path: Path, leg_tmp: Path) -> None:
    """nanoGPT's shape: the next batch is fetched right after the forward. Correct (the first
    fetch after the resume): clean, with no change to the loop. The first fetch moved before
    `sess.resume()`: every resume re-trains on leg 0's first batch, and the data check says so."""
    good = copy_asset("prefetch", tmp_path / "good")
    code, checks = rehearse(good)
    assert code == 0, failed(checks)
    assert (
        check(checks, Kind.DATA_POSITION, leg=1, ok=True)["ok"]
        and check(checks, Kind.DATA_POSITION, leg=2, ok=True)["ok"]
    )
    bad_root = copy_asset("prefetch", tmp_path / "bad")
    plant(
        bad_root,
        "iter_num = sess.resume()  # session\nX, Y = get_batch(iter_num)  # fetch the very first batch\n",
        "X, Y = get_batch(0)  # fetch the very first batch\niter_num = sess.resume()  # session\n",
    )
    code, checks = rehearse(bad_root)
    bad = failed(checks)
    assert code == 1 and "already consumed" in details(bad, Kind.DATA_POSITION, leg=1), bad
    report_fails(bad_root, 2)


def test_a_report_over_legs_that_crashed_after_a_verified_checkpoint_fails(tmp_path: Path, leg_tmp: Path) -> None:
    """A rank-0-only assert after the final checkpoint verified: the leg exits 1 after a
    graceful SIGTERM stop whose `done` says verified. That passed as a graceful stop (the
    leniency torchrun needs, given to every trainer); now the rung answers no, and the report
    PASSes nothing resting on that leg: the storage cycle it printed FAILs, naming it."""
    root = copy_example("plain_loop", tmp_path)
    plant(
        root, "sys.exit(sess.finish())", "sess.finish()\nassert sess.world.rank != 0, 'a check meant for other ranks'"
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "exited 1" in check(bad, Kind.LEG_FINISHED, leg=0)["detail"], bad
    res = run_cli(["report", "--json"], cwd=root, timeout=600)
    status = {p["number"]: (p["status"], p["summary"]) for p in res.json()["proofs"]}
    assert res.code == 1 and not [n for n, (st, _) in status.items() if st == "PASS"], status
    assert (
        status[7][0] == "FAIL"
        and "exited non-zero outside a planned kill" in status[7][1]
        and "leg 0 exited 1" in status[7][1]
    ), status[7]


def test_a_recurrent_state_zeroed_on_resume_is_a_state_digest_difference(tmp_path: Path, leg_tmp: Path) -> None:
    """word_language_model's shape: the hidden state runs on from chunk to chunk and lives in
    `sess.extra`; the whole model is saved with `torch.save(model, f)` and loaded back with
    `weights_only=True`; tokens are replaced at random (`--noise`), so `step(batch=...)` is never
    the batch the model was fed. As it is: clean, proofs 2 and 4 PASS (the session's hooks are
    nowhere in the saved model; the fed-batch cross-check only reports; the float state
    reproducible from one process to the next on one thread). Started from zeros on every
    resume: the model's `hidden` input at the first resumed step and the state digest of
    `extra` at the next checkpoint differ from the straight run's, and proof 4 FAILs on those
    checks, not on the loss; the data is not blamed (the hidden state is not in the batch hash)."""
    good = copy_asset("recurrent", tmp_path / "good")
    code, checks = rehearse(good)
    assert code == 0, failed(checks)
    assert "the model was not fed" in check(checks, Kind.FED_BATCH)["detail"]  # said, and PASS
    status = report_status(good)
    assert status[2][0] == "PASS" and status[4][0] == "PASS", status
    assert not [n for n, (st, _) in status.items() if st == "FAIL"], status
    root = copy_asset("recurrent", tmp_path / "bad")
    plant(root, 'hidden = sess.extra.get("hidden")', "hidden = None")
    code, checks = rehearse(root)
    bad = failed(checks)
    state = " ".join(c["detail"] for c in checks_of(bad, Kind.STATE_STRAIGHT))
    assert code == 1 and "extra's state" in state, bad
    fed = check(bad, Kind.FIELDS_STRAIGHT)["detail"]
    assert "the model's `hidden` input at step" in fed and "the batch is the same" in fed, fed
    assert check(checks, Kind.DATA_POSITION, leg=1, ok=True)["ok"]  # not a data bug, and not said to be one
    assert not checks_of(bad, Kind.DATA_POSITION), bad
    fails = report_fails(root, 4)
    assert "extra" in fails[4] and 2 not in fails, fails


def test_a_recurrent_loop_that_forgets_its_seek_is_a_data_position_error(tmp_path: Path, leg_tmp: Path) -> None:
    """The same loop restores its hidden state but reads the stream from its start again: the
    batch hash covers the tokens, not the hidden state carried into the forward, so the first
    resumed batch is found among those already consumed (with the hidden state in the hash,
    every resumed batch looked new and this passed)."""
    root = copy_asset("recurrent", tmp_path)
    cfg = root / "launcher.yaml"
    cfg.write_text(cfg.read_text().replace(" --noise 0.2", ""))  # no augmentation: each batch as read
    plant(root, "pos = step % CHUNKS  # the seek", "pos = 0  # the bug: no seek")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "already consumed at step 1" in details(bad, Kind.DATA_POSITION, leg=1), bad
    report_fails(root, 2)


def test_an_epoch_counter_restarted_on_resume_is_a_field_difference(tmp_path: Path, leg_tmp: Path) -> None:
    """The loop counts epochs itself and the count restarts at 0 on every leg: the LR, the data
    and the loss all hold; the `epoch` the resumed steps print differs from the straight run's."""
    root = copy_example("plain_loop", tmp_path)
    cfg = root / "launcher.yaml"  # 8 batches an epoch: leg 2 resumes (step 14) in epoch 1
    cfg.write_text(cfg.read_text().replace("--ckpt-every 5", "--ckpt-every 5 --batch 32"))
    plant(
        root, "for epoch in loader.epochs(args.epochs):\n", "for epoch, _ in enumerate(loader.epochs(args.epochs)):\n"
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "epoch" in check(bad, Kind.FIELDS_STRAIGHT)["detail"], bad
    assert check(checks, Kind.TIMELINE)["ok"]  # not the loss comparison that saw it
    report_fails(root, 4)


def test_a_reshuffle_with_another_seed_each_leg_is_refused(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("plain_loop", tmp_path)
    plant(root, "seed=args.seed)  # a shuffle", "seed=args.seed + int(os.environ['LAUNCHER_LEG']))  # a shuffle")
    plant(root, "import sys\n", "import os\nimport sys\n")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert (
        code == 1
        and "cursor_mismatch" in check(bad, Kind.LEG_FINISHED, leg=1)["detail"]
        and "seed=" in check(bad, Kind.LEG_FINISHED, leg=1)["detail"]
    ), bad
    report_fails(root, 1, 2)


def test_a_cursor_one_batch_off_behind_an_honest_looking_index(project: Path) -> None:
    """The trainer skips a batch on resume but reports the index it should have read:
    only the batch hash and the straight-through run can see it."""
    plant(
        project,
        "    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))\n",
        "    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))\n"
        "    if data.next_step:\n        data.next_step += 1  # the bug\n",
    )
    plant(project, "sample_index=first_sample)", "sample_index=sess.step_count * 8)")  # derived, so it looks right
    code, checks = rehearse(project)
    bad = failed(checks)
    assert code == 1 and "batch_hash" in check(bad, Kind.TIMELINE)["detail"], bad
    assert check(checks, Kind.SAMPLE_INDEX)["ok"]  # the index alone says all is well
    report_fails(project, 8)


VERIFY_LOCAL = """
import hashlib as _h
import runtime.checkpoint.cycle as _cycle
import runtime.store.local as _local
from runtime.checkpoint.verify import VerifyResult as _VR

_push = _local.LocalDirStore.push


def _torn_push(self, local_dir, manifest):  # the upload loses its last bytes
    _push(self, local_dir, manifest)
    path = self._ckpt(manifest.name) / "state.pt"
    path.write_bytes(path.read_bytes()[:-100])


def _verify_local(store, manifest, local_dir, budget_bytes=0, **_):  # reads the local copy, not the store
    data = (local_dir / "state.pt").read_bytes()
    return _VR(ok=True, windows=1, bytes_read=len(data), read=[("state.pt", 0, len(data), _h.sha256(data).hexdigest())])


_local.LocalDirStore.push = _torn_push
_cycle.verify_checkpoint = _verify_local
"""


def test_a_verify_that_reads_the_local_copy_is_caught_by_the_launchers_read(project: Path) -> None:
    plant(project, "from runtime.session import", VERIFY_LOCAL + "\nfrom runtime.session import")
    code, checks = rehearse(project)
    bad = failed(checks)
    read = check(bad, Kind.READBACK, leg=0)["detail"]
    assert code == 1 and "CheckpointDamaged" in read and "the manifest says" in read, bad
    assert "CheckpointDamaged" in report_fails(project, 1)[1]


SIGTERM_DEFAULT = (
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)  # the bug: SIGTERM kills, no final push\n"
)


def test_no_final_push_on_sigterm(project: Path) -> None:
    plant(
        project,
        "    model.train()\n",
        "    model.train()\n" + "".join("    " + ln + "\n" for ln in SIGTERM_DEFAULT.splitlines()),
    )
    code, checks = rehearse(project)
    bad = failed(checks)
    assert code == 1 and check(bad, Kind.STOPPED_AS_ASKED, leg=0)["facts"]["want"] == "sigterm", bad
    assert "stopped on sigterm" in report_fails(project, 1)[1]


@pytest.mark.parametrize(
    "example,after", [("flat_gpt", "iter_num = sess.resume()\n"), ("plain_loop", "sess.resume()\n")]
)
def test_no_final_push_on_sigterm_in_the_examples(example: str, after: str, tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example(example, tmp_path)
    plant(root, after, after + SIGTERM_DEFAULT)
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and check(bad, Kind.STOPPED_AS_ASKED, leg=0)["facts"]["want"] == "sigterm", bad
    report_fails(root, 1)


def test_the_hf_trainer_told_to_ignore_its_data_skip_re_reads_the_epoch(tmp_path: Path, leg_tmp: Path) -> None:
    """transformers' own knob: with ignore_data_skip a resumed Trainer starts the epoch over. The
    example's one process otherwise resumes clean: the failed checks are the re-read's and its
    consequences only (the SIGTERM and deadline stops, the LR, optimizer, RNG and store read all
    hold), the one-process control since the example's clean climb went (session 21); its clean
    climbs on two ranks are tests/legs/test_multirank_hf.py's."""
    root = copy_example("hf_trainer", tmp_path)
    plant(root, "dataloader_num_workers=0,", "dataloader_num_workers=0, ignore_data_skip=True,")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "already consumed" in details(bad, Kind.DATA_POSITION, leg=1), bad
    assert sorted((c["kind"], c.get("leg") or 0) for c in bad) == [
        (Kind.DATA_POSITION, 1),
        (Kind.DATA_POSITION, 1),
        (Kind.DATA_POSITION, 2),
        (Kind.LOSS_CONTINUITY, 1),
        (Kind.NO_REPEAT, 0),
        (Kind.TIMELINE, 0),
    ], bad
    assert sorted(report_fails(root, 2)) == [2, 4, 8]


@pytest.mark.parametrize("example", ["flat_gpt", "plain_loop", "hf_trainer"])
def test_an_import_by_absolute_path_fails_rung_0(example: str, tmp_path: Path, leg_tmp: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "helpers_outside.py").write_text("VALUE = 1\n")
    root = copy_example(example, tmp_path)
    plant(
        root,
        "import argparse\n",
        f"import argparse\nimport sys\nsys.path.insert(0, {str(outside)!r})\nimport helpers_outside\n",
    )
    res = run_cli(["up", "static", "--json"], cwd=root)
    assert res.code == 1 and "helpers_outside" in details(res, Kind.TRAINER_STATIC, ok=False), res.out


TORN_SAVE = """
import threading as _th
import time as _tm

import runtime.session.core as _sess
from runtime.checkpoint.disk import save_local as _save_local

_ckpt, _fin = _sess.Session.checkpoint, _sess.Session.finish


def _torn_checkpoint(self):  # the bug: no snapshot; the state is serialised later, from live tensors
    if getattr(self, "_final", False) or self.pusher is None:
        return _ckpt(self)
    step, tokens, rngs = self.step_count, self.tokens, self.world.gather(_sess.rng_state())
    self.pushed_at = step

    def later():
        _tm.sleep(0.3)  # training goes on meanwhile: the weights below belong to a later step
        state = {n: o.state_dict() for n, o in self.tracked.items()}
        state.update(rng=rngs, step=step, tokens=tokens, extra=self.extra)
        folder, manifest = _save_local(state, self.work / "ckpt", step, {"run_id": self.run_id})
        self.pusher.submit(folder, manifest)
    _th.Thread(target=later).start()


def _finish(self):
    self._final = True
    _tm.sleep(0.5)  # let the late saves land before the final one
    return _fin(self)


_sess.Session.checkpoint, _sess.Session.finish = _torn_checkpoint, _finish
"""


def test_a_checkpoint_torn_by_a_save_that_does_not_snapshot_first(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("flat_gpt", tmp_path)
    plant(root, "from runtime.session import Session\n", "from runtime.session import Session\n" + TORN_SAVE)
    # The rehearsal resumes from final checkpoints (not torn: taken at the stop); a kill after a
    # cadence push makes the next leg resume from a torn one.
    res = run_cli(["drill", "cold-resume", "--kills", "2", "--at", "after-push", "--json"], cwd=root, timeout=900)
    bad = failed(res)
    detail = " ".join(c["detail"] for c in checks_of(bad, Kind.TIMELINE))
    assert res.code == 1 and "first difference at step" in detail and "loss" in detail, bad
    assert checks_of(bad, Kind.LOSS_CONTINUITY), bad  # the re-run steps differ from the killed leg's
    report_fails(root, 4)


def test_a_plateau_scheduler_left_out_of_the_state(tmp_path: Path, leg_tmp: Path) -> None:
    """ReduceLROnPlateau's memory (the best loss so far) restarts: invisible until a resume
    past the first plateau step, then the LR at the next epoch's end differs. The default
    drill (`--at auto`, two kills) places a kill just after the LR's first cut, read from the
    straight-through run, and sees it (a kill-only drill needed 4 kills over 40 steps)."""
    root = copy_example("plain_loop", tmp_path)
    cfg = root / "launcher.yaml"
    cfg.write_text(
        cfg.read_text()
        .replace("drill: {steps: 30", "drill: {steps: 32")
        .replace("--ckpt-every 5", "--ckpt-every 5 --batch 32")
    )  # 8 batches an epoch, 4 epochs
    plant(root, "scheduler=sched, loader=loader)", "loader=loader)")
    res = run_cli(["drill", "cold-resume", "--json"], cwd=root, timeout=900)
    bad = failed(res)
    assert res.code == 1 and "lr" in check(bad, Kind.TIMELINE)["detail"], bad
    assert checks_of(bad, Kind.LR), bad
    report_fails(root, 3)


def drill(root: Path, *args: str) -> tuple[int, list[dict]]:
    res = run_cli(["drill", "cold-resume", *args, "--json"], cwd=root, timeout=900)
    return res.code, res.json()["checks"]


def short_drill(root: Path) -> None:
    """15 steps (a checkpoint every 5): room for one kill after the first storage cycle."""
    cfg = root / "launcher.yaml"
    cfg.write_text(cfg.read_text().replace("drill: {steps: 30", "drill: {steps: 15"))


def test_a_resume_from_a_host_local_cache_is_named_by_the_launchers_read(tmp_path: Path, leg_tmp: Path) -> None:
    """The trainer keeps its own copy of the state on the host's disk (every 5 steps, outside
    the leg's disk) and loads it over what `sess.resume()` restored: on a cloud's fresh instance
    that copy is gone (or stale). The `resume` event still names the store's checkpoint; the
    state the first training forward used is compared with the launcher's own read of it."""
    root = copy_example("plain_loop", tmp_path)
    short_drill(root)
    cache = tmp_path / "host-cache.pt"  # outside every leg's fresh dir: survives the kill
    plant(
        root,
        "sess.resume()\n",
        "sess.resume()\n"
        f"CACHE = {str(cache)!r}  # the bug: the host's own copy wins over the store's\n"
        "import os\n"
        "if sess.step_count and os.path.exists(CACHE):\n"
        "    cached = torch.load(CACHE, weights_only=True)\n"
        "    model.load_state_dict(cached['model'])\n"
        "    opt.load_state_dict(cached['opt'])\n",
    )
    plant(
        root,
        "        sess.step(loss=loss, batch=x, tokens=x.numel(), epoch=epoch)\n",
        "        sess.step(loss=loss, batch=x, tokens=x.numel(), epoch=epoch)\n"
        "        if sess.step_count % 5 == 3:  # never a checkpoint's step\n"
        "            torch.save({'model': model.state_dict(), 'opt': opt.state_dict()}, CACHE)\n"
        "        __import__('time').sleep(0.05)  # 50 ms steps: the kill lands a step or two past step 5's cycle\n",
    )
    code, checks = drill(root, "--kills", "1", "--at", "mid-step")  # two steps past the first verified one
    bad = failed(checks)
    resumed = check(bad, Kind.RESUMED_NEWEST, leg=1)["detail"]
    assert code == 1 and "is not that checkpoint's: model" in resumed, bad
    assert "matches no checkpoint the store held" in resumed, resumed
    assert "matches no checkpoint the store held" in report_fails(root, 6)[6]
    reword_checks(root)  # the report selects checks by kind: reworded, proof 6 still FAILs
    assert 6 in report_fails(root, 6)


SLOW_VERIFY = """
import time as _time
import runtime.checkpoint.cycle as _cycle

_verify = _cycle.verify_checkpoint


def _slow_verify(*args, **kwargs):  # a slow store: the read-back takes a second, so a kill lands in it
    _time.sleep(1.0)
    return _verify(*args, **kwargs)


_cycle.verify_checkpoint = _slow_verify
"""


def test_a_resume_from_a_checkpoint_that_never_verified_is_named_by_the_launchers_read(
    tmp_path: Path, leg_tmp: Path
) -> None:
    """Killed while the step-10 checkpoint was being read back: the store holds it, without a
    verified mark. The trainer looks past `sess.resume()` (which restored step 5, the newest
    verified) for the newest checkpoint in the store, verified or not, and trains from it."""
    root = copy_example("plain_loop", tmp_path)
    short_drill(root)
    anchor = "from runtime.session import EpochLoader, Session\n"
    plant(root, anchor, anchor + SLOW_VERIFY)
    plant(
        root,
        "sess.resume()\n",
        "sess.resume()\n"
        "from pathlib import Path\n"
        "newer = [c for c in sess.store.scan().checkpoints if c.step > sess.step_count]  # the bug: verified or not\n"
        "if newer:\n"
        "    folder = sess.store.fetch(newer[-1].name, Path('newer'))\n"
        "    state = torch.load(folder / 'state.pt', weights_only=True)\n"
        "    model.load_state_dict(state['model'])\n"
        "    opt.load_state_dict(state['optimizer'])\n",
    )
    code, checks = drill(root, "--kills", "1", "--at", "mid-verify")
    bad = failed(checks)
    resumed = check(bad, Kind.RESUMED_NEWEST, leg=1)["detail"]
    assert code == 1 and "resumed at step 5" in resumed, bad
    assert "the store's step-10 checkpoint, which never verified" in resumed, resumed
    assert "which never verified" in report_fails(root, 6)[6]

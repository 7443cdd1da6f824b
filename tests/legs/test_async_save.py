"""Checkpoint saves off the critical path: the snapshot is the state at one step, the
background worker keeps the storage cycle's order, and a kill while the worker writes
never leaves a checkpoint the store counts unless it is complete (the kill drill)."""

from __future__ import annotations

import copy
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import runtime.checkpoint.disk as ckpt
from launcher.checks.evidence import LegEvents
from launcher.checks.measure import cycle_cost
from runtime.checkpoint.disk import SnapshotPool, load_local, snapshot_state
from runtime.checkpoint.restore import restore_newest
from runtime.reference.model import GPT, GPTConfig
from runtime.session import Session
from runtime.store import open_store
from runtime.store.base import checkpoint_name
from runtime.store.local import LocalDirStore

ROOT = Path(__file__).resolve().parents[2]
RUN = "async1"


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"event"')]


def small_model() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 16, 1, 2, 32))  # tied embedding/head: two names, one storage
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: GPT, opt: torch.optim.Optimizer, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(seed))
    loss = model(x, x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return x, loss


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.cpu(), b.cpu()), f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# --- the snapshot itself --------------------------------------------------------------------


def test_snapshot_is_unchanged_by_the_next_steps_in_place_updates() -> None:
    model, opt = small_model()
    train_step(model, opt, 0)
    extra = {"seen": [1, 2], "note": "x"}
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra, "step": 1}
    expected = copy.deepcopy(state)  # what the state was at step 1
    pool = SnapshotPool()
    snap = snapshot_state(state, pool)
    # the next step mutates everything in place: weights, Adam moments, its step counters, plain values
    train_step(model, opt, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    extra["seen"].append(3)
    extra["note"] = "y"
    assert_same(expected, snap.state)
    assert not torch.equal(snap.state["model"]["tok.weight"], model.tok.weight.detach())
    # tied weights stay one storage (as torch.save writes them); the module's _metadata is kept
    sd = snap.state["model"]
    assert sd["tok.weight"].untyped_storage().data_ptr() == sd["head.weight"].untyped_storage().data_ptr()
    assert getattr(sd, "_metadata", None) == getattr(expected["model"], "_metadata", None)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(snap.state)}
    assert snap.bytes == sum(storages.values())  # each storage once
    # its buffers are reused by the next snapshot once it is written: no new allocation
    allocated = pool.allocations
    snap.release()
    again = snapshot_state({"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra}, pool)
    assert pool.allocations == allocated and pool.free_bytes() == 0
    assert_same({"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra}, again.state)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def test_a_snapshot_writes_and_loads_like_the_live_state(tmp_path: Path) -> None:
    model, opt = small_model()
    train_step(model, opt, 0)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    snap = snapshot_state(state)
    folder_a, manifest_a = ckpt.save_local(snap.state, tmp_path / "a", 1, {})
    folder_b, manifest_b = ckpt.save_local(state, tmp_path / "b", 1, {})
    assert manifest_a.total_bytes == manifest_b.total_bytes  # same storages, same layout
    assert_same(load_local(folder_b)[0], load_local(folder_a)[0])
    assert sorted(os.listdir(tmp_path / "a")) == [checkpoint_name(1)]  # the partial folder took its real name


def test_a_write_that_fails_leaves_no_folder_with_the_checkpoints_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(state: Any, path: Path) -> None:
        path.write_bytes(b"half a state")
        raise OSError("disk full (the test)")

    monkeypatch.setattr(ckpt, "write_state", broken)
    with pytest.raises(OSError):
        ckpt.save_local({"step": 3}, tmp_path, 3, {})
    assert not (tmp_path / checkpoint_name(3)).exists() and not (tmp_path / ckpt.partial_name(3)).exists()


# --- through a Session ----------------------------------------------------------------------


def session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    *,
    async_save: bool = True,
    max_steps: int = 6,
    ckpt_every: int = 2,
) -> tuple[Session, GPT, torch.optim.Optimizer]:
    monkeypatch.setenv("LAUNCHER_RUN_ID", RUN)
    monkeypatch.setenv("LAUNCHER_STORE", (tmp_path / f"store-{name}").as_uri())
    monkeypatch.setenv("LAUNCHER_MAX_STEPS", str(max_steps))
    for var in ("LAUNCHER_DEADLINE", "LAUNCHER_FILES_SHA256", "LAUNCHER_STORE_KEY"):
        monkeypatch.delenv(var, raising=False)
    sess = Session(ckpt_every=ckpt_every, workdir=tmp_path / f"work-{name}", device="cpu", metrics_every=10**6)
    sess.async_save = async_save
    model, opt = small_model()
    sess.track(model=model, optimizer=opt)
    sess.resume()
    return sess, model, opt


def one_step(sess: Session, model: GPT, opt: torch.optim.Optimizer) -> None:
    x, loss = train_step(model, opt, sess.step_count)
    sess.lap("compute")
    sess.step(loss=loss, batch=x, tokens=x.numel())


def stored_state(tmp_path: Path, name: str, step: int) -> dict[str, Any]:
    store = open_store((tmp_path / f"store-{name}").as_uri(), f"runs/{RUN}")
    info = next(c for c in store.list() if c.step == step)
    assert info.verified
    store.fetch(info.name, tmp_path / f"fetched-{name}")
    return load_local(tmp_path / f"fetched-{name}" / info.name, seal=info.seal, fetched=True)[0]


def test_a_session_saves_the_state_at_the_checkpoint_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # noqa: ANN001
    gate, writing = threading.Event(), threading.Event()
    real_write = ckpt.write_state

    def held(state: Any, path: Path) -> None:  # the worker writes only after the test mutated the live state
        writing.set()
        assert gate.wait(30)
        real_write(state, path)

    monkeypatch.setattr(ckpt, "write_state", held)
    sess, model, opt = session(tmp_path, monkeypatch, "a", max_steps=2, ckpt_every=2)
    assert sess.running()
    one_step(sess, model, opt)
    assert sess.running()
    x, loss = train_step(model, opt, 1)
    sess.step(loss=loss, batch=x, tokens=x.numel())  # step 2: the checkpoint
    expected = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()})
    with torch.no_grad():  # right after checkpoint() returned: the next step's in-place updates
        for p in model.parameters():
            p.mul_(-3.0)
    train_step(model, opt, 99)
    assert writing.wait(30)
    gate.set()
    assert sess.finish() == 0
    saved = stored_state(tmp_path, "a", 2)
    assert saved["step"] == 2
    assert_same(expected, {"model": saved["model"], "optimizer": saved["optimizer"]})
    evs = events_of(capsys.readouterr().out)
    save = next(e for e in evs if e["event"] == "save")
    serialized = next(e for e in evs if e["event"] == "serialized")
    push = next(e for e in evs if e["event"] == "push")
    assert save["async_save"] is True and save["step"] == serialized["step"] == push["step"] == 2
    assert serialized["bytes"] == push["bytes"] and save["bytes"] <= serialized["bytes"]


def test_async_and_sync_saves_hold_the_same_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    for name, mode in (("async", True), ("sync", False)):
        sess, model, opt = session(tmp_path, monkeypatch, name, async_save=mode, max_steps=4, ckpt_every=2)
        while sess.running():
            one_step(sess, model, opt)
        assert sess.finish() == 0
    evs = events_of(capsys.readouterr().out)
    saves = [e for e in evs if e["event"] == "save"]
    assert [e["async_save"] for e in saves] == [True, True, False, False]
    assert len([e for e in evs if e["event"] == "serialized"]) == 2  # the background writes only
    for step in (2, 4):
        a, s = stored_state(tmp_path, "async", step), stored_state(tmp_path, "sync", step)
        assert_same({k: v for k, v in s.items() if k != "rng"}, {k: v for k, v in a.items() if k != "rng"})


def test_the_worker_keeps_the_cycle_order_and_two_snapshots_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # noqa: ANN001
    real_push = LocalDirStore.push

    def slow_push(self, local_dir, manifest) -> None:  # noqa: ANN001 - uploads slower than the steps
        time.sleep(0.25)
        real_push(self, local_dir, manifest)

    monkeypatch.setattr(LocalDirStore, "push", slow_push)
    sess, model, opt = session(tmp_path, monkeypatch, "order", max_steps=7, ckpt_every=1)
    assert sess.running()
    one_step(sess, model, opt)  # step 1: the first snapshot allocates one set of buffers
    pool: SnapshotPool = sess.saver.pool
    per_set = pool.allocations
    while sess.running():
        one_step(sess, model, opt)
    assert pool.allocations <= 2 * per_set  # one snapshot being written + one waiting, reused after
    assert sess.finish() == 0
    out = capsys.readouterr().out
    evs = events_of(out)
    cycle = [(e["event"], e["step"]) for e in evs if e["event"] in ("serialized", "push", "verify")]
    assert cycle == [(kind, s) for s in range(1, 8) for kind in ("serialized", "push", "verify")]
    assert all(e["ok"] for e in evs if e["event"] == "verify")
    waits = [e for e in evs if e["event"] == "push_wait"]
    assert waits  # the loop did wait for a place: no third snapshot was taken meanwhile
    saves = {e["step"]: e for e in evs if e["event"] == "save"}
    assert all(saves[w["step"]]["blocked_s"] == pytest.approx(w["seconds"], abs=1e-3) for w in waits)
    assert all(saves[w["step"]]["seconds"] >= w["seconds"] for w in waits)  # the wait is on the critical path
    store = open_store((tmp_path / "store-order").as_uri(), f"runs/{RUN}")
    assert [c.step for c in store.list() if c.verified] == [6, 7]  # prune kept 2
    assert not list((tmp_path / "work-order" / "ckpt").iterdir())  # every local copy deleted once verified

    # the host's reading of the leg: every line a usable event; the cadence cost is the critical path
    log = tmp_path / "leg0.log"
    log.write_text(out)
    leg = LegEvents.read(0, log)
    assert not leg.damaged()
    cost = cycle_cost(leg)
    assert cost is not None and cost["background_save"] and cost["serialize_s"] > 0
    assert cost["save_s"] == pytest.approx(sum(e["seconds"] for e in saves.values()) / len(saves))
    assert cost["bytes"] == [e for e in evs if e["event"] == "push"][-1]["bytes"]
    assert cost["interval_steps"] == 1 and cost["push_waits"] == len(waits)


# --- the kill drill ---------------------------------------------------------------------------

WRAPPER = '''
import io, os, sys, time

import torch

import runtime.checkpoint.disk as ckpt

TEAR = int(os.environ["TEAR_STEP"])
_write = ckpt.write_state


def torn_write(state, path):
    """For one step: write half the state file, say so, and hang (the test kills us)."""
    if state.get("step") == TEAR:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        with open(path, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
        print("TORN-WRITE-STARTED", TEAR, flush=True)
        time.sleep(600)
    return _write(state, path)


ckpt.write_state = torn_write
if os.environ.get("TEAR_MODE") == "sync":
    from runtime.session import Session

    _init = Session.__init__

    def sync_init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.async_save = False

    Session.__init__ = sync_init

from runtime.reference import trainer

sys.exit(trainer.main(sys.argv[1:]))
'''
TRAINER_ARGS = ["--ckpt-every", "4", "--data-tokens", "20000", "--device", "cpu", "--metrics-every", "1000"]


def leg_env(store: Path, max_steps: int, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LAUNCHER_DEADLINE", "LAUNCHER_FILES_SHA256", "LAUNCHER_STORE_KEY", "LAUNCHER_LEG")
    }
    env.update(
        LAUNCHER_RUN_ID=RUN,
        LAUNCHER_STORE=store.as_uri(),
        LAUNCHER_MAX_STEPS=str(max_steps),
        PYTHONPATH=str(ROOT),
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env


def kill_mid_write(tmp_path: Path, mode: str, tear: int = 8) -> tuple[Path, Path, list[str]]:
    """Leg 0 through the wrapper: wait until the worker (or, sync, the loop) is halfway through
    writing step `tear`'s state, step tear-4 is verified and (async) the loop has trained two
    steps past the checkpoint, then SIGKILL the whole process group. The leg's output lines."""
    store, work = tmp_path / "store", tmp_path / "work"
    wrapper = tmp_path / "torn_trainer.py"
    wrapper.write_text(WRAPPER)
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), "--workdir", str(work), *TRAINER_ARGS],
        cwd=ROOT,
        env=leg_env(store, 40, TEAR_STEP=str(tear), TEAR_MODE=mode),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 90
    torn = previous_verified = False
    trained_past = mode == "sync"  # the sync loop is the one writing: it cannot train on
    try:
        while not (torn and previous_verified and trained_past):
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no torn write within 90 s:\n" + "".join(seen[-30:])) from None
            assert line is not None, "the leg ended before the torn write:\n" + "".join(seen[-30:])
            seen.append(line)
            torn = torn or line.startswith("TORN-WRITE-STARTED")
            event = events_of(line)[0] if line.startswith('{"event"') else {}
            if event.get("event") == "verify" and event["step"] == tear - 4 and event["ok"]:
                previous_verified = True
            if event.get("event") == "step" and event["step"] >= tear + 2:
                trained_past = True
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return store, work, seen


def plain_leg(store: Path, work: Path, max_steps: int) -> tuple[int, list[dict[str, Any]]]:
    res = subprocess.run(
        [sys.executable, "-m", "runtime.reference.trainer", "--workdir", str(work), *TRAINER_ARGS],
        cwd=ROOT,
        env=leg_env(store, max_steps, LAUNCHER_LEG="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, events_of(res.stdout)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_kill_during_the_write_never_leaves_a_checkpoint_counted_unless_complete(tmp_path: Path, mode: str) -> None:
    tear = 8
    store_dir, work, lines = kill_mid_write(tmp_path, mode, tear)
    leg0 = events_of("".join(lines))
    kinds = [(e["event"], e.get("step")) for e in leg0]
    if mode == "async":
        # the worker's order: step 4 went through its whole cycle before step 8's write began,
        # while the loop trained on (the write is off its critical path)
        verified_at = next(i for i, x in enumerate(lines) if '"verify"' in x and f'"step": {tear - 4},' in x)
        torn_at = next(i for i, x in enumerate(lines) if x.startswith("TORN-WRITE-STARTED"))
        assert verified_at < torn_at and ("save", tear) in kinds
    assert ("push", tear) not in kinds and ("serialized", tear) not in kinds
    store = open_store(store_dir.as_uri(), f"runs/{RUN}")
    scan = store.scan()
    assert tear not in [c.step for c in scan.checkpoints] + [d.step for d in scan.damaged]  # never reached it
    assert [c.step for c in scan.checkpoints if c.verified] == [tear - 4]
    restored = restore_newest(store, tmp_path / "restore")
    assert restored.info is not None and restored.info.step == tear - 4 and restored.state["step"] == tear - 4
    # on the leg's disk the torn write never carried the checkpoint's name
    local = work / "ckpt"
    assert not (local / checkpoint_name(tear)).exists() and (local / ckpt.partial_name(tear)).is_dir()

    # the next leg (plain trainer, same disk: the partial folder is swept) resumes from step 4
    code, leg1 = plain_leg(store_dir, work, 12)
    assert code == 0, leg1[-3:]
    resume = next(e for e in leg1 if e["event"] == "resume")
    assert resume["from_step"] == tear - 4
    done = leg1[-1]
    assert done["event"] == "done" and done["step"] == 12 and done["final_checkpoint_verified"] is True
    assert [c.step for c in store.list() if c.verified] == [tear, 12]
    # Nothing partial left, and every checkpoint leg 1 pushed deleted locally once verified. Leg 0's
    # step 4 copy may remain: the kill can land between its verify and its local delete (both on
    # the pusher's thread), and it is verified in the store, so it is never what a resume needs.
    left = sorted(p.name for p in local.iterdir())
    assert left in ([], [checkpoint_name(tear - 4)]), left

"""The reference trainer and its cursor: exact resume on CPU, refusal on a wrong cursor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runtime import contract
from runtime.reference import trainer
from runtime.reference.cursor import CursorMismatch, DataOrder
from runtime.reference.data import make_corpus, open_tokens


def run_leg(work: Path, store: Path, max_steps: int, monkeypatch: pytest.MonkeyPatch, capsys, *extra: str):  # noqa: ANN001, ANN201
    work.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("LAUNCHER_RUN_ID", "t1")
    monkeypatch.setenv("LAUNCHER_STORE", store.as_uri())
    monkeypatch.setenv("LAUNCHER_MAX_STEPS", str(max_steps))
    code = trainer.main(["--workdir", str(work), "--ckpt-every", "4", "--data-tokens", "20000", *extra])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"event"')]
    return code, events


def test_data_order_is_a_permutation_per_epoch(tmp_path: Path) -> None:
    make_corpus(tmp_path / "t.bin", 20_000, seed=3)
    order = DataOrder(20_000, 64, 8, seed=3)
    n = order.n_samples
    for epoch in (0, 1):
        windows = [order.sample_window(epoch * n + i) for i in range(n)]
        assert sorted(windows) == list(range(n))
    first = [order.sample_window(i) for i in range(n)]
    second = [order.sample_window(n + i) for i in range(n)]
    assert first != second  # a new order each epoch


def test_corpus_is_deterministic(tmp_path: Path) -> None:
    a = make_corpus(tmp_path / "a.bin", 5000, seed=1)
    b = make_corpus(tmp_path / "b.bin", 5000, seed=1)
    c = make_corpus(tmp_path / "c.bin", 5000, seed=2)
    assert a == b != c


def test_cursor_refuses_other_data(tmp_path: Path) -> None:
    make_corpus(tmp_path / "t.bin", 20_000, seed=3)
    tokens = open_tokens(tmp_path / "t.bin")
    order = DataOrder(int(tokens.size), 64, 8, seed=3)
    cursor = order.cursor(tokens, 5)
    assert order.check_cursor(tokens, cursor) == cursor
    with pytest.raises(CursorMismatch, match="batch"):
        order.check_cursor(tokens, dict(cursor, next_batch_sha256="0" * 64))
    with pytest.raises(CursorMismatch, match="seed"):
        DataOrder(int(tokens.size), 64, 8, seed=4).check_cursor(tokens, cursor)
    changed = np.array(tokens)
    changed[:] = 0
    with pytest.raises(CursorMismatch, match="hashes"):
        order.check_cursor(changed, cursor)


def test_resume_is_bit_identical_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    _, straight = run_leg(tmp_path / "a", tmp_path / "store-a", 10, monkeypatch, capsys)
    code0, first = run_leg(tmp_path / "b0", tmp_path / "store-b", 6, monkeypatch, capsys)
    code1, second = run_leg(tmp_path / "b1", tmp_path / "store-b", 10, monkeypatch, capsys)
    assert code0 == code1 == 0
    resume = next(e for e in second if e["event"] == "resume")
    assert resume["from_step"] == 6 and resume["lr"] == resume["lr_expected"]
    losses = {e["step"]: e["loss"] for e in straight if e["event"] == "step"}
    resumed = {e["step"]: e["loss"] for e in first + second if e["event"] == "step"}
    assert resumed == losses  # every step, including all 4 after the resume


def test_wrong_data_refuses_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    run_leg(tmp_path / "a", tmp_path / "store", 4, monkeypatch, capsys)
    code, events = run_leg(tmp_path / "b", tmp_path / "store", 8, monkeypatch, capsys, "--seed", "7")
    assert code == contract.EXIT_REFUSED
    stop = events[-1]
    assert stop["event"] == "stop" and stop["reason"] == "cursor_mismatch" and "seed" in stop["error"]


def test_lr_schedule_warms_up_then_decays() -> None:
    f = [trainer.lr_factor(s, warmup=10, total=100) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[99] < 0.15
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_deadline_pushes_a_final_checkpoint_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    import time

    deadline = time.time() + 15  # margin 5 s: ~10 s of training even on a loaded machine
    monkeypatch.setenv("LAUNCHER_DEADLINE", str(deadline))
    code, events = run_leg(tmp_path / "a", tmp_path / "store", 1_000_000, monkeypatch, capsys)
    assert code == 0
    stop = next(e for e in events if e["event"] == "stop")
    assert stop["reason"] == "deadline" and stop["step"] > 0
    verify = [e for e in events if e["event"] == "verify"][-1]
    assert verify["ok"] and verify["step"] == stop["step"]
    assert events[-1]["event"] == "done" and events[-1]["t"] < deadline

"""Exact resume in the reference trainer: schedule, sequential resumes, guards, metrics."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from runtime import contract
from runtime.store import Manifest, open_store
from tests.legs.test_trainer import run_leg
from tests.unit.test_store import mark_verified


def steps_of(events: list[dict]) -> dict[int, dict]:
    return {e["step"]: e for e in events if e["event"] == "step"}


def test_linear_schedule_resumed_at_step_5_gives_the_uninterrupted_lr_at_step_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # noqa: ANN001
    flags = ("--schedule", "linear", "--warmup", "2", "--total-steps", "10", "--ckpt-every", "5")
    _, straight = run_leg(tmp_path / "a", tmp_path / "sa", 8, monkeypatch, capsys, *flags)
    run_leg(tmp_path / "b0", tmp_path / "sb", 5, monkeypatch, capsys, *flags)
    _, resumed = run_leg(tmp_path / "b1", tmp_path / "sb", 8, monkeypatch, capsys, *flags)
    resume = next(e for e in resumed if e["event"] == "resume")
    assert resume["from_step"] == 5 and resume["lr"] == resume["lr_expected"]
    assert steps_of(resumed)[6]["lr"] == steps_of(straight)[6]["lr"]  # not one step off (transformers #34053)
    assert steps_of(resumed)[6]["lr"] != steps_of(straight)[5]["lr"]  # and the schedule really moves there


def test_three_legs_read_every_sample_once_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    legs = []
    for i, max_steps in enumerate((4, 8, 12)):
        _, events = run_leg(tmp_path / f"leg{i}", tmp_path / "store", max_steps, monkeypatch, capsys)
        legs.append([e for e in events if e["event"] == "step"])
    batch = 8
    for before, after in zip(legs, legs[1:]):  # each leg starts strictly after the previous one's last
        assert after[0]["sample_index"] == before[-1]["sample_index"] + batch
    read = [e["sample_index"] + k for leg in legs for e in leg for k in range(batch)]
    assert read == list(range(12 * batch))  # no sample read twice, none skipped
    assert [len(leg) for leg in legs] == [4, 4, 4]


def test_nonfinite_loss_stops_without_pushing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    code, events = run_leg(
        tmp_path / "a", tmp_path / "store", 30, monkeypatch, capsys, "--lr", "1e38", "--ckpt-every", "100"
    )
    assert code == contract.EXIT_FAILED
    stop = next(e for e in events if e["event"] == "stop")
    assert stop["reason"] == "nonfinite_loss"
    assert not [e for e in events if e["event"] in ("save", "push")]
    assert open_store((tmp_path / "store").as_uri(), "runs/t1").list() == []


def test_stale_code_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    (tmp_path / "train.py").write_text("print('edited on the instance')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHER_FILES_SHA256", json.dumps({"train.py": hashlib.sha256(b"reviewed").hexdigest()}))
    code, events = run_leg(tmp_path / "a", tmp_path / "store", 5, monkeypatch, capsys)
    assert code == contract.EXIT_REFUSED
    assert events[-1]["reason"] == "stale_code" and "train.py" in events[-1]["error"]
    good = {"train.py": hashlib.sha256((tmp_path / "train.py").read_bytes()).hexdigest()}
    monkeypatch.setenv("LAUNCHER_FILES_SHA256", json.dumps(good))
    assert run_leg(tmp_path / "b", tmp_path / "store", 2, monkeypatch, capsys)[0] == 0


def test_memory_and_rate_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    _, events = run_leg(
        tmp_path / "a", tmp_path / "store", 30, monkeypatch, capsys, "--metrics-every", "10", "--total-steps", "1000"
    )
    memory = [e for e in events if e["event"] == "memory"]
    assert [m["step"] for m in memory] == [10, 20, 30]
    assert all(m["peak_max"] >= m["peak"] > 0 and m["reserved_max"] >= m["allocated"] for m in memory)
    assert steps_of(events)[30]["mem_max_bytes"] == memory[-1]["peak_max"]
    rate = [e for e in events if e["event"] == "rate"][-1]
    assert rate["step"] == 30 and rate["window_first"] == 21 and rate["tok_s"] > 0
    assert rate["eta_s"] == pytest.approx((1000 - 30) * 8 * 64 / rate["tok_s"], rel=0.01)


def test_a_tampered_cursor_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    import torch

    run_leg(tmp_path / "a", tmp_path / "store", 4, monkeypatch, capsys)
    folder = tmp_path / "store" / "runs" / "t1" / "step-00000004"
    state = torch.load(folder / "state.pt", weights_only=True)
    state["cursor"]["next_batch_sha256"] = "0" * 64  # a cursor that points at other data
    torch.save(state, folder / "state.pt")
    manifest = json.loads((folder / "manifest.json").read_text())  # consistent bytes: only the cursor lies
    for entry in manifest["files"]:
        data = (folder / entry["path"]).read_bytes()
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    store = open_store((tmp_path / "store").as_uri(), "runs/t1")
    mark_verified(store, Manifest.from_json(manifest), folder)  # read back and sealed: a consistent checkpoint
    code, events = run_leg(tmp_path / "b", tmp_path / "store", 8, monkeypatch, capsys)
    assert code == contract.EXIT_REFUSED
    assert events[-1]["reason"] == "cursor_mismatch" and "checkpoint recorded 000000000000" in events[-1]["error"]
    assert not [e for e in events if e["event"] == "step"]  # refused before training on the wrong data

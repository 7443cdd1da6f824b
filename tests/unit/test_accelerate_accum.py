"""The accumulated gradients of a save inside a window (runtime/adapters/accelerate_accum.py):
torch only, an Accelerator stood in for by the three attributes the module reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from runtime.adapters.accelerate_accum import GRADS, load_accumulated, save_accumulated


def _acc(model: torch.nn.Module, k: int, synced: bool) -> SimpleNamespace:
    return SimpleNamespace(gradient_accumulation_steps=k, sync_gradients=synced, _models=[model])


def test_gradients_inside_a_window_come_back_and_a_window_end_saves_none(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False))
    model(torch.randn(4, 3)).sum().backward()
    model[0].bias.grad = None  # a parameter with no gradient yet stays without one
    want = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    path = tmp_path / GRADS.format(rank=1)
    assert not save_accumulated(_acc(model, 4, synced=True), path) and not path.exists()  # a window's end
    assert not save_accumulated(_acc(model, 1, synced=False), path) and not path.exists()  # no accumulation
    assert save_accumulated(_acc(model, 4, synced=False), path)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False))
    assert load_accumulated(_acc(fresh, 4, synced=True), path)
    got = [p.grad for p in fresh.parameters()]
    assert [g is None for g in got] == [w is None for w in want]
    assert all(torch.equal(g, w) for g, w in zip(got, want) if w is not None)
    assert not load_accumulated(_acc(fresh, 4, synced=True), tmp_path / GRADS.format(rank=0))  # none saved

"""Gradient accumulation across a save (runtime/adapters/accelerate.py).

With `Accelerator(gradient_accumulation_steps=K)` and `accumulate`, the gradients of a window's
micro-batches sum in each parameter's `.grad` (each rank its own: DDP's `no_sync` reduces them
only at the window's end) until the optimizer steps. `save_state` keeps the window's count
(`step`, in random_states_{rank}.pkl: the resumed leg ends the window where the straight run
did) but not the gradients: a resume inside a window stepped the optimizer on the remaining
micro-batches only, and the loss left the straight run's at the step after (measured on
examples/accelerate, K=4, resumed at micro-step 5). Each rank's gradients are saved beside it
and put back by `load_state`: the resumed window sums what the straight one summed, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

GRADS = "accumulated_grads_{rank}.pt"


def _inside_a_window(acc: Any) -> bool:
    """Whether the last micro-batch left gradients for a later optimizer step: accumulation on,
    and the last `accumulate` did not sync (a window's end steps the optimizer)."""
    return int(acc.gradient_accumulation_steps) > 1 and not acc.sync_gradients


def _parameters(acc: Any) -> list[torch.nn.Parameter]:
    return [p for model in acc._models for p in model.parameters()]


def save_accumulated(acc: Any, path: Path) -> bool:
    """This rank's accumulated gradients into `path` where a save falls inside a window; whether
    it wrote (every rank sees the same window: all write or none do)."""
    if not _inside_a_window(acc):
        return False
    grads = {i: p.grad.detach().cpu() for i, p in enumerate(_parameters(acc)) if p.grad is not None}
    torch.save(grads, path)
    return True


def load_accumulated(acc: Any, path: Path) -> bool:
    """The gradients `save_accumulated` wrote, back into the prepared models' parameters (where
    the folder has them: a save at a window's end has none). Whether any were put back."""
    if not path.is_file():
        return False
    grads = torch.load(path, map_location="cpu", weights_only=True)
    for i, p in enumerate(_parameters(acc)):
        g = grads.get(i)
        p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
    return True

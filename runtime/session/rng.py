"""What a checkpoint holds besides the model: every RNG stream, per rank.

RNG state is per rank (each rank's CUDA generator, and python/numpy/torch CPU
streams, can differ): a checkpoint stores the list of every rank's state and a
resume restores each rank's own.

Every stream is kept in a form `torch.load(weights_only=True)` accepts without
an allow-list: tensors, ints, floats, strings, tuples. numpy's state (a tuple
holding an ndarray) is stored with its key as an int64 tensor.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    name, key, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (
        str(name),
        torch.from_numpy(np.asarray(key, dtype=np.int64)),
        int(pos),
        int(has_gauss),
        float(cached),
    )
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore this rank's streams. A checkpoint loaded with map_location='cuda:N'
    brings the generator states back as CUDA tensors, and both torch setters
    take only a CPU ByteTensor (found by the smoke rung on an H200: every
    resume on a GPU died with "RNG state must be a torch.ByteTensor")."""
    random.setstate(state["python"])
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_cpu_bytes(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_cpu_bytes(s) for s in state["cuda"]])


def _cpu_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.uint8)

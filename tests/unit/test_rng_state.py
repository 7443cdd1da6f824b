"""RNG streams survive a checkpoint round trip, including one loaded onto a GPU."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from runtime.session.rng import rng_state, set_rng_state


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _round_trip(map_location: str) -> None:
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    buf = io.BytesIO()
    torch.save({"rng": rng_state()}, buf)
    expected = _draws()
    buf.seek(0)
    state = torch.load(buf, map_location=map_location, weights_only=False)
    _draws()  # move every stream on, so a restore that does nothing is caught
    set_rng_state(state["rng"])
    assert _draws() == expected


def test_rng_round_trip_on_cpu() -> None:
    _round_trip("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the checkpoint is loaded onto cuda:0")
def test_rng_round_trip_loaded_onto_a_gpu() -> None:
    # torch.load(map_location='cuda:0') turns the saved generator states into
    # CUDA tensors; torch's setters take only CPU ByteTensors.
    _round_trip("cuda:0")

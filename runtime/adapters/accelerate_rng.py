"""The RNG between `load_state` and the first training forward after it (runtime/adapters/accelerate.py).

`load_state` restores the python, numpy and torch RNG of the checkpoint's step: the straight run's
RNG at that step. What the loop does with it before its next forward decides whether the
resumed run goes on as the straight one does:
- a loader the loop did not prepare draws its iterator's base seed (one int64 from the torch
  RNG) when the loop makes the resumed epoch's iterator: the straight run drew it at the
  epoch's start, so after a mid-epoch resume that one draw is put back (at an epoch's start
  both runs drew it). The prepared loaders draw nothing (runtime/adapters/accelerate_loaders.py);
- a loop that seeds the RNG there (`set_seed(...)` after `load_state`: `torch.manual_seed`,
  `np.random.seed`, `random.seed`) leaves the saved stream: that is the loop's doing, not put
  back (putting it back would hide, on a mid-epoch resume, what an epoch-end resume shows) and
  named in the `resume` event (`rng_set_after_load`: the streams seeded). Those three functions
  are wrapped only in that window, and put back at the first forward;
- any other draw (a mask or noise drawn before each forward) is the straight run's too: left
  alone."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch

from runtime.session.step_evidence import state_digest

STREAMS = ("torch", "numpy", "python")


def rng_states() -> tuple[Any, Any, Any]:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def rng_digests(states: tuple[Any, Any, Any] | None = None) -> dict[str, str]:
    torch_rng, np_rng, py_rng = states if states is not None else rng_states()
    return dict(zip(STREAMS, (state_digest(torch_rng), state_digest(list(np_rng)), state_digest(list(py_rng)))))


def _one_draw_on(torch_state: torch.Tensor) -> str:
    """The digest of the torch RNG after one int64 draw from `torch_state`: what a DataLoader
    iterator's base seed (`torch.empty((), dtype=torch.int64).random_()`) leaves."""
    gen = torch.Generator()
    gen.set_state(torch_state)
    torch.empty((), dtype=torch.int64).random_(generator=gen)
    return state_digest(gen.get_state())


_SEEDERS = ((torch, "manual_seed", "torch"), (np.random, "seed", "numpy"), (random, "seed", "python"))


class AfterLoad:
    """From `load_state` to the first training forward: the RNG `load_state` left, and the streams
    the loop seeded in between."""

    def __init__(self, mid_epoch: bool) -> None:
        self.loaded = rng_states()
        self.mid_epoch = mid_epoch
        self.seeded: list[str] = []
        self._originals = [(owner, name, getattr(owner, name)) for owner, name, _ in _SEEDERS]
        for (owner, name, stream), (_, _, original) in zip(_SEEDERS, self._originals):
            setattr(owner, name, self._noting(original, stream))

    def _noting(self, original: Callable[..., Any], stream: str) -> Callable[..., Any]:
        def seed(*args: Any, **kwargs: Any) -> Any:
            if stream not in self.seeded:
                self.seeded.append(stream)
            return original(*args, **kwargs)

        return seed

    def close(self) -> list[str]:
        """At the first training forward: the seeders as they were; the one draw of an unprepared
        loader's iterator put back after a mid-epoch resume; the streams the loop seeded."""
        for owner, name, original in self._originals:
            setattr(owner, name, original)
        if not self.seeded and self.mid_epoch:
            was, now = rng_digests(self.loaded), rng_digests()
            if [s for s in STREAMS if was[s] != now[s]] == ["torch"] and now["torch"] == _one_draw_on(self.loaded[0]):
                torch.set_rng_state(self.loaded[0])
        return list(self.seeded)

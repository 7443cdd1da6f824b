"""The RNG window between Accelerate's `load_state` and the first training forward
(runtime/adapters/accelerate_rng.AfterLoad; torch and numpy only, no accelerate needed):
a `set_seed` there is named and left as the loop set it; the one base-seed draw of a loader's
iterator is put back after a mid-epoch resume and kept at an epoch's start; any other draw is
the loop's own and left alone; the seeders are put back as they were."""

from __future__ import annotations

import random

import numpy as np
import torch

from runtime.adapters.accelerate_rng import AfterLoad, rng_digests


def _base_seed_draw() -> None:
    """What a DataLoader iterator's start draws from the global torch RNG (torch's dataloader.py)."""
    torch.empty((), dtype=torch.int64).random_()


def test_a_seed_after_load_is_named_and_not_undone() -> None:
    torch.manual_seed(3)
    seeders = (torch.manual_seed, np.random.seed, random.seed)
    after = AfterLoad(mid_epoch=True)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    seeded_state = rng_digests()
    assert after.close() == ["python", "numpy", "torch"]
    assert rng_digests() == seeded_state  # the loop's seed stands
    assert (torch.manual_seed, np.random.seed, random.seed) == seeders


def test_one_iterator_draw_is_put_back_mid_epoch_and_kept_at_an_epochs_start() -> None:
    torch.manual_seed(3)
    loaded = rng_digests()
    after = AfterLoad(mid_epoch=True)
    _base_seed_draw()
    assert after.close() == [] and rng_digests() == loaded
    after = AfterLoad(mid_epoch=False)  # the straight run drew it at the epoch's start too
    _base_seed_draw()
    drawn = rng_digests()
    assert after.close() == [] and rng_digests() == drawn != loaded


def test_other_draws_are_the_loops_own() -> None:
    torch.manual_seed(3)
    after = AfterLoad(mid_epoch=True)
    torch.rand(4)  # a mask drawn before each forward: the straight run draws it too
    drawn = rng_digests()
    assert after.close() == [] and rng_digests() == drawn

"""The epoch the HF adapter's step events print: the one the step trained in (the Trainer's
`state.epoch` after a step is the epoch plus the share of it done; an epoch's last step reads the
next whole number), which `--at epoch-end` places its stop by (launcher.rungs.drill_moments)."""

from __future__ import annotations

from runtime.adapters.common import epoch_of_step


def test_an_epochs_last_step_is_in_that_epoch() -> None:
    per_epoch = 16
    printed = [epoch_of_step(e + (k + 1) / per_epoch) for e in range(3) for k in range(per_epoch)]
    assert printed == [0] * 16 + [1] * 16 + [2] * 16  # step 16 in epoch 0, step 17 the first of epoch 1


def test_before_any_step_the_epoch_is_0() -> None:
    assert epoch_of_step(None) == 0 and epoch_of_step(0.0) == 0

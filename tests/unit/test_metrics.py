"""Throughput and continuity arithmetic."""

from __future__ import annotations

import random

from runtime.metrics import eta_seconds, loss_continuity, sustained_rate, warmup_steps


def trace(
    n: int, step_s: float = 0.3, tokens: int = 1000, warm: int = 15, seed: int = 0
) -> list[tuple[int, float, float]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for step in range(1, n + 1):
        slow = 4.0 if step == 1 else (1.0 + 2.0 * 0.8**step if step <= warm else 1.0)
        t += step_s * slow * rng.gauss(1.0, 0.02)
        out.append((step, step * tokens, t))
    return out


def test_sustained_rate_skips_warmup_and_is_counter_based() -> None:
    rate = sustained_rate(trace(300))
    assert rate is not None and rate.first_step == 31 and rate.last_step == 300
    assert abs(rate.tok_s - 1000 / 0.3) / (1000 / 0.3) < 0.01
    assert rate.rel_err is not None and rate.rel_err < 0.01
    naive = sum(1000 / (b[2] - a[2]) for a, b in zip(trace(21), trace(21)[1:])) / 20
    assert naive < rate.tok_s * 0.95  # a 20-step mean through the warm-up is far off


def test_warmup_skip_never_eats_the_window() -> None:
    assert warmup_steps(1000) == 100 and warmup_steps(100) == 20 and warmup_steps(10) == 8
    assert sustained_rate(trace(2)) is None


def test_eta_from_the_sustained_rate() -> None:
    rate = sustained_rate(trace(300))
    assert abs(eta_seconds(rate, 300, 1300, 1000) - 1000 * 0.3) < 3


def test_continuity_passes_a_faithful_restart_and_fails_a_reset_model() -> None:
    before = [5.5, 5.3, 5.0, 4.8, 4.55, 4.4, 4.2, 4.05, 3.9, 3.8]
    faithful = loss_continuity(before, [3.68, 3.6])
    assert faithful.ok and round(faithful.band, 3) == 0.45
    reset = loss_continuity(before, [5.55, 5.5])  # weights re-initialized: back to ln(256)
    assert not reset.ok and reset.delta > 1.5
    assert loss_continuity(before[:2], [1.0]) is None

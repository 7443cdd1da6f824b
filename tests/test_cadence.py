"""launcher.cadence against numbers computed by hand (docs/notes-preemption.md, section 4):
Young's and Daly's intervals, Daly's own published optima, both goodputs, and what the
cadence is worth in GPU-hours."""

from __future__ import annotations

import math

import pytest

from launcher.cadence import NOTICE_S, compare, daly, fits_notice, goodput, goodput_first_order, young

pytestmark = pytest.mark.unit

C, R, M = 30.0, 120.0, 4 * 3600.0  # a 30 s checkpoint, a 2 min relaunch, 4 h between interruptions


def test_young_and_daly_on_the_worked_example() -> None:
    assert young(C, M) == pytest.approx(929.516, abs=1e-3)  # sqrt(864000)
    assert daly(C, M) == pytest.approx(909.624, abs=1e-3)  # 929.516 * 1.010874 - 30


@pytest.mark.parametrize("m_hours,published_min,places", [(24, 117, 0), (6, 57, 0), (0.25, 9.1, 1)])
def test_daly_reproduces_his_papers_optima(m_hours: float, published_min: float, places: int) -> None:
    """Daly (2006)'s figures: a 5-minute dump, M of 24 h, 6 h and 15 min: 117, 57 and 9.1 min
    as published (116.69, 56.71 and 9.14 unrounded)."""
    assert round(daly(300.0, m_hours * 3600.0) / 60.0, places) == published_min


def test_daly_is_m_once_a_checkpoint_costs_two_mtbfs() -> None:
    assert daly(100.0, 50.0) == 50.0


def test_goodput_first_order_and_exact() -> None:
    tau = young(C, M)
    # C/tau = tau/2M = 0.032275 at Young's optimum; R/M = 0.008333
    assert goodput_first_order(tau, C, R, M) == pytest.approx(0.92712, abs=1e-5)
    assert goodput(tau, C, R, M) == pytest.approx(0.92904, abs=1e-5)
    assert goodput_first_order(3600.0, C, R, M) == pytest.approx(1 - (30 / 3600 + 1800 / 14400 + 120 / 14400))
    assert goodput_first_order(3600.0, C, R, M) == pytest.approx(0.85833, abs=1e-5)
    assert goodput(3600.0, C, R, M) == pytest.approx(0.86475, abs=1e-5)
    # the lag from a step to its verified mark is lost too: 60 s more per interruption
    assert goodput_first_order(tau, C, R, M, lag=60.0) == pytest.approx(0.92712 - 60 / 14400, abs=1e-5)


def test_what_the_cadence_is_worth() -> None:
    """100 kept hours on 8 GPUs: 107.86 h a GPU billed at Young's cadence, 116.50 h at one an
    hour (first order): 69.1 GPU-h, at $1.17 a GPU-hour $80.9."""
    cad = compare(C, R, M, tau_now=3600.0, kept_hours=100.0, gpus=8, usd_per_gpu_hour=1.17)
    assert cad.billed_gpu_hours_young / 8 == pytest.approx(107.86, abs=0.01)
    assert cad.billed_gpu_hours_now / 8 == pytest.approx(116.50, abs=0.01)
    assert cad.gpu_hours_difference == pytest.approx(69.15, abs=0.01)
    assert cad.usd_difference == pytest.approx(69.15 * 1.17, abs=0.02)
    assert cad.tau_young == young(C, M) and cad.tau_daly == daly(C, M)


def test_a_cadence_that_never_keeps_anything_bills_without_end() -> None:
    cad = compare(C, R, 600.0, tau_now=3600.0, kept_hours=1.0, gpus=1)
    assert cad.goodput_now == 0.0 and math.isinf(cad.billed_gpu_hours_now)


def test_the_notice_presets_and_the_fit() -> None:
    assert NOTICE_S == {"aws": 110.0, "gcp": 25.0, "azure": 25.0, "k8s": 0.0}
    assert fits_notice(18.5, NOTICE_S["gcp"]) == (True, 6.5)
    assert fits_notice(31.0, NOTICE_S["gcp"]) == (False, -6.0)
    assert fits_notice(31.0, NOTICE_S["aws"]) == (True, 79.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_seconds_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        young(bad, M)
    with pytest.raises(ValueError, match="positive number of seconds"):
        goodput(600.0, C, R, bad)

"""launcher.cadence against numbers computed by hand (docs/notes-preemption.md, section 4):
Young's and Daly's intervals, Daly's own published optima, both goodputs, and what the
cadence is worth in GPU-hours."""

from __future__ import annotations

import math

import pytest

from launcher.cadence import NOTICE_S, compare, daly, fits_notice, goodput, goodput_first_order, young

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


def _events(tmp_path, events: list[dict]):  # noqa: ANN001, ANN202
    import json

    from launcher.checks.evidence import LegEvents

    log = tmp_path / "leg-0.log"
    log.write_text("".join(json.dumps(dict(e, rank=0)) + "\n" for e in events))
    return LegEvents.read(0, log)


def _leg(final_verify_t: float) -> list[dict]:
    """Ten steps of 0.5 s from t = 100, checkpoints at 5 (verified 1.5 s after its step) and at 10."""
    ev = [
        {"event": "step", "t": 100.0 + 0.5 * s, "step": s, "step_s": 0.5, "loss": 1.0, "lr": 0.1} for s in range(1, 11)
    ]
    for step, verified in ((5, 104.0), (10, final_verify_t)):
        t = 100.0 + 0.5 * step
        ev += [
            {"event": "save", "t": t + 0.2, "step": step, "seconds": 0.2, "bytes": 1000},
            {"event": "serialized", "t": t + 0.5, "step": step, "seconds": 0.3, "bytes": 1100, "name": "c"},
            {"event": "push", "t": verified - 0.1, "step": step, "seconds": 0.4, "bytes": 1100, "name": "c"},
            {
                "event": "verify",
                "t": verified,
                "step": step,
                "ok": True,
                "seconds": 0.1,
                "bytes_read": 1100,
                "name": "c",
                "windows": 1,
            },
        ]
    return sorted(ev, key=lambda e: e["t"])


def test_the_final_path_is_step_to_verified_plus_one_step(tmp_path) -> None:  # noqa: ANN001
    from launcher.report.notice import _lost_max, final_path, lag_to_verified

    ev = _events(tmp_path, _leg(final_verify_t=135.0))  # step 10 ended at t = 105: 30 s to verified
    f = final_path(ev)
    assert (f["step"], f["bytes"], f["seconds"], f["step_s"], f["needed_s"]) == (10, 1100, 30.0, 0.5, 30.5)
    assert f["parts"] == {"save": 0.2, "write": 0.3, "push": 0.4, "verify": 0.1}
    assert [p.line for p in f["evidence"]] == [14, 15, 18]  # step 10, its save, its verify (lines, by t)
    assert not fits_notice(f["needed_s"], NOTICE_S["gcp"])[0] and fits_notice(f["needed_s"], NOTICE_S["aws"])[0]
    # L: step 5 verified 1.5 s after its step (the final one, 30 s, is the final path, not the
    # cadence's lag); lost at most the interval, 5, plus the 3 steps trained while step 5 verified
    assert lag_to_verified(ev) == pytest.approx(1.5)
    assert _lost_max(5, 1.5, 0.5) == 5 + 3 and _lost_max(None, 1.5, 0.5) is None


def test_no_final_path_without_a_verified_final_checkpoint(tmp_path) -> None:  # noqa: ANN001
    from launcher.report.notice import final_path

    events = [e for e in _leg(135.0) if not (e["event"] == "verify" and e["step"] == 10)]
    assert final_path(_events(tmp_path, events)) is None


def test_m_is_the_configured_figure_else_the_clouds_published_one() -> None:
    from launcher.cadence import SpotConfig
    from launcher.config.schema import Config
    from launcher.errors import ConfigError
    from launcher.report.notice import mtbf
    from launcher.report.runs import RunData

    on = RunData({"legs": [{"placement": {"cloud": "AWS"}}, {"placement": {"cloud": "aws"}}]}, [])
    nowhere = RunData({"legs": [{"placement": None}]}, [])
    assert mtbf(Config(project="p"), on)[::2] == (3650.0, "aws")
    m, source, cloud = mtbf(Config(project="p"), nowhere)
    assert (m, cloud) == (160.0, None) and "no cloud recorded" in source
    assert mtbf(Config(project="p", spot=SpotConfig(mtbf_hours=12.5)), on)[:2] == (
        12.5,
        "spot.mtbf_hours in launcher.yaml",
    )
    for bad in (0, -1.0, float("nan"), True, 1e9):
        with pytest.raises(ConfigError, match="spot.mtbf_hours"):
            SpotConfig(mtbf_hours=bad)


def test_up_run_on_spot_warns_when_the_final_checkpoint_does_not_fit() -> None:
    """launcher.cadence.notice_warning: the dry run and the launch show the same line (Plan.warnings)."""
    from types import SimpleNamespace

    from launcher.cadence import notice_warning

    per = [
        {"provider": p, "label": lab, "notice_s": NOTICE_S[p], "fits": ok}
        for p, lab, ok in (
            ("gcp", "GCP", False),
            ("azure", "Azure", False),
            ("aws", "AWS", True),
            ("k8s", "Kubernetes", False),
        )
    ]
    gate = {
        "gate": "passed",
        "notice": {"per_provider": per, "needed_s": 30.5, "lost_steps_max": 37, "run": "r-probe", "leg": 0},
    }
    run_sky = SimpleNamespace(rung=SimpleNamespace(name="run"), backend="sky")
    [line] = notice_warning(run_sky, gate, None)
    assert line == (
        "warning: on spot, the final checkpoint needs 30.5 s (r-probe leg 0): it does not fit GCP's (25 s) "
        "or Azure's (25 s) notice; a preemption there loses up to 37 steps at the current cadence"
    )
    assert "it does not fit GCP's (25 s) notice;" in notice_warning(run_sky, gate, SimpleNamespace(cloud="GCP"))[0]
    assert notice_warning(run_sky, gate, SimpleNamespace(cloud="AWS")) == []  # it fits the pick's cloud
    assert notice_warning(SimpleNamespace(rung=run_sky.rung, backend="local"), gate, None) == []  # no spot
    assert notice_warning(run_sky, {"gate": "skipped", "reason": "x"}, None) == []

"""The report's notice lines (launcher/report/notice_md.py) from the plan's `notice` entry
(launcher.report.notice.notice_plan) on a leg whose final checkpoint took 30 s to verify: the
fit against each provider, its margin, and the wording of a fit and of a miss. The legs test
(tests/legs/test_probe.py::test_cpu_probe_measures_and_resumes_cold) shows the same on a real
probe's final push, held by a short Hub hang."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.test_cadence import _events, _leg


def test_a_final_push_that_misses_gcps_notice_is_said_with_the_plans_seconds(tmp_path: Path) -> None:
    from launcher.report.notice import notice_plan
    from launcher.report.notice_md import notice_lines

    ev = _events(tmp_path, _leg(final_verify_t=135.0))  # step 10 ended at t = 105: 30 s, + one 0.5 s step
    run = SimpleNamespace(id="r-probe", gpus="cpu", row={"legs": []}, legs=[])
    plan = notice_plan(None, [], run, ev, None, SimpleNamespace(cite=lambda run, pointers: []))  # type: ignore[arg-type]
    notice = plan["notice"]
    assert notice["step"] == 10 and notice["seconds"] == 30.0 and notice["needed_s"] == 30.5
    fits = {f["provider"]: f for f in notice["per_provider"]}
    assert not fits["gcp"]["fits"] and fits["gcp"]["margin_s"] == pytest.approx(25 - 30.5)
    assert not fits["azure"]["fits"] and fits["azure"]["margin_s"] == pytest.approx(25 - 30.5)
    assert fits["aws"]["fits"] and fits["aws"]["margin_s"] == pytest.approx(110 - 30.5)
    assert not fits["k8s"]["fits"]  # no notice reaches the trainer: a margin is no fit
    assert plan["cadence"] == {"missing": "no cold resume was measured (R)"}
    text = "\n".join(notice_lines(plan))
    assert "**does not fit GCP's notice** (25 s) by 5.5 s" in text
    assert "**does not fit Azure's notice** (25 s) by 5.5 s" in text
    assert "fits AWS's notice (110 s) with a margin of 79.5 s" in text
    assert "Kubernetes: no notice reaches the trainer" in text and "it needs **30.50 s**" in text


def test_the_margin_is_printed_as_the_plan_holds_it() -> None:
    """A margin of -2.15 recomputed from 27.15 - 25 is -2.1499...: it could print 2.1 where the
    plan's JSON says 2.15; the line prints the plan's own figure."""
    from launcher.report.notice_md import notice_lines

    per = [
        {"provider": "gcp", "label": "GCP", "notice_s": 25.0, "fits": False, "margin_s": -2.16},
        {"provider": "aws", "label": "AWS", "notice_s": 110.0, "fits": True, "margin_s": 82.84},
    ]
    notice = {
        "run": "r",
        "leg": 0,
        "on": "cpu",
        "bytes": 1,
        "step": 5,
        "seconds": 27.0,
        "step_s": 0.16,
        "needed_s": 27.16,
        "parts": {"save": 0.1, "write": None, "push": 1.0, "verify": 0.2},
        "per_provider": per,
        "lost_steps_max": None,
        "evidence": [],
    }
    [line] = notice_lines({"notice": notice})
    assert "by 2.2 s" in line and "with a margin of 82.8 s" in line and "write -" in line

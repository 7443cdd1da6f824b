"""A GPU rung's memory, predicted against measured (launcher.checks.memscore) and the report's
section (launcher.report.memory): the error from the legs' GPU `memory` events, MISSING where the
legs measured no GPU, and the margin the guard's allowance grows by."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import Kind, LegEvents
from launcher.checks.memfit import GIB, MIB
from launcher.checks.memscore import margin, scored
from launcher.report.memory import lines

DECISION = {
    "world_size": 2,
    "ranks": [
        {"rank": 0, "gpu": "T4", "capacity": 15 * GIB, "peak": 6 * GIB, "needed": 7 * GIB, "fits": True},
        {"rank": 1, "gpu": "T4", "capacity": 15 * GIB, "peak": 5 * GIB, "needed": 6 * GIB, "fits": True},
    ],
}


def _leg(tmp: Path, leg: int, *windows: dict) -> LegEvents:
    log = tmp / f"leg-{leg}.log"
    rows = [{"event": "memory", "rank": 0, "step": 10 * (i + 1), **w} for i, w in enumerate(windows)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return LegEvents.read(leg, log)


def test_the_largest_rank_is_scored_against_the_gpu_peak_of_every_leg(tmp_path: Path) -> None:
    a = _leg(tmp_path, 0, {"kind": "cuda", "peak_max": 5 * GIB, "peak_reserved_max": 6 * GIB})
    b = _leg(tmp_path, 1, {"kind": "cuda", "peak_max": 7 * GIB + 512 * MIB, "peak_reserved_max": 8 * GIB})
    c = scored(DECISION, [a, b])
    assert c.ok and c.kind == Kind.MEMORY_SCORED
    f = c.facts
    assert (f["predicted"], f["allocated"], f["reserved"], f["rank"]) == (6 * GIB, 7.5 * GIB, 8 * GIB, 0)
    assert abs(f["error"] - (6 / 7.5 - 1)) < 1e-12 and "error -20.0 %" in c.detail
    assert c.evidence[0].leg == 1 and c.evidence[0].line == 1  # the event that held the peak
    assert margin([{"checks": [c.to_json()]}]) == 0.25  # measured 25 % over the prediction


def test_legs_that_measured_the_host_are_missing_never_a_gpu_figure(tmp_path: Path) -> None:
    host = _leg(tmp_path, 0, {"kind": "host_rss", "peak_max": 300 * GIB})
    c = scored(DECISION, [host])
    assert c.ok and c.facts["allocated"] is None and c.facts["error"] is None
    assert "MISSING" in c.detail and c.evidence == ()
    assert margin([{"checks": [c.to_json()]}]) == 0.0  # nothing measured: the allowance does not move
    over = scored(DECISION, [_leg(tmp_path, 1, {"kind": "cuda", "peak_max": 3 * GIB})])
    assert over.facts["error"] == 1.0 and margin([{"checks": [over.to_json()]}]) == 0.0  # over-predicted
    warned = {**DECISION, "guard": "warn", "ranks": [{**DECISION["ranks"][0], "needed": 16 * GIB, "fits": False}]}
    went = scored(warned, [host])
    assert went.facts["over"] is True and "launched over the guard's figure (memory.guard: warn)" in went.detail
    assert scored(DECISION, [host]).facts["over"] is False
    none = scored({"world_size": 1, "ranks": [{"rank": 0, "error": "SystemExit: no fakes"}]}, [host])
    assert none.facts == {"predicted": None} and "no fakes" in none.detail


def test_the_report_section_states_each_rung_and_missing(tmp_path: Path) -> None:
    gpu = scored(DECISION, [_leg(tmp_path, 0, {"kind": "cuda", "peak_max": 6 * GIB + 300 * MIB})])
    cpu = scored(DECISION, [_leg(tmp_path, 1, {"kind": "host_rss", "peak_max": GIB})])
    rows = [
        {"run": f"r{i}", "rung": "probe", "on": "T4:2", **c.facts, "detail": c.detail} for i, c in enumerate([gpu, cpu])
    ]
    text = "\n".join(lines({"memory_scores": {"rows": rows, "margin": 0.0}}))
    assert "| r0 | probe | T4:2 | 6.00 GiB | 7.00 GiB | 6.29 GiB | MISSING | -4.7 % |" in text
    assert "| r1 | probe | T4:2 | 6.00 GiB | 7.00 GiB | MISSING | MISSING | - |" in text
    assert "no GPU rung was launched" in "\n".join(lines({"memory_scores": {"rows": [], "margin": 0.0}}))


def test_a_leg_s_unusable_figures_are_never_a_measurement_nor_a_crash(tmp_path: Path) -> None:
    """Trust no input: a `memory` event whose peak is not a byte count (text, negative, a bool)
    is left out; a leg with only such events measured nothing."""
    bad = _leg(
        tmp_path,
        0,
        {"kind": "cuda", "peak_max": -5, "peak_reserved_max": "lots"},
        {"kind": "cuda", "peak_max": True},
        {"kind": "cuda", "peak_max": 4 * GIB, "peak_reserved_max": "lots"},
    )
    c = scored(DECISION, [bad])
    assert c.facts["allocated"] == 4 * GIB and c.facts["reserved"] is None
    only_bad = _leg(tmp_path, 1, {"kind": "cuda", "peak_max": "6 GiB"})
    assert scored(DECISION, [only_bad]).facts["allocated"] is None

"""`launcher status`'s step-time breakdown (launcher.ops.status._measures) of a leg whose batches
wait on the input pipeline: the largest phase is the data wait. The legs test
(tests/legs/test_status_stop.py::test_breakdown_names_the_bottleneck) measures a real data-bound
leg 0 and shows status reading the newest leg."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import LegEvents
from launcher.ops.status import _measures


def _leg(tmp_path: Path, data_s: float) -> LegEvents:
    steps = [
        {"event": "step", "step": s, "t": 100.0 + s, "loss": 1.0, "lr": 0.1, "step_s": data_s + 0.02}
        | {"phases": {"data": data_s, "compute": 0.015, "optimizer": 0.005}}
        for s in range(1, 41)
    ]
    log = tmp_path / f"leg-{data_s}.log"
    log.write_text("".join(json.dumps(dict(e, rank=0)) + "\n" for e in steps))
    return LegEvents.read(0, log)


def test_status_names_the_data_wait_of_a_slow_input_pipeline(tmp_path: Path) -> None:
    run = {"gpu_name": None, "gpu_count": 0, "nodes": 1}
    slow = _measures(run, _leg(tmp_path, 0.15))["breakdown"]
    assert slow["largest"] == "data" and slow["shares"]["data"] > 0.8, slow
    assert "data wait 88 % of step time: the input pipeline is the bottleneck" in slow["summary"], slow
    fast = _measures(run, _leg(tmp_path, 0.001))["breakdown"]
    assert fast["largest"] == "compute", fast

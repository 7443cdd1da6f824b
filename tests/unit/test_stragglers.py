"""A straggler named from each rank's own work outside the step's collectives (launcher.checks.
stragglers), on legs written here: named where it is persistent and large, never for a rank
slower now and then, a slow compute phase (it holds the wait for the others), or too few steps."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import LegEvents
from launcher.checks.stragglers import check_stragglers, stragglers


def leg(tmp: Path, own: dict[int, list[float]], compute: dict[int, list[float]] | None = None) -> LegEvents:
    """Step events of each rank: its `data` phase from `own`, its `compute` from `compute`."""
    lines = []
    for rank, values in own.items():
        for step, value in enumerate(values, start=1):
            phases = {
                "data": value,
                "compute": (compute or {}).get(rank, [0.02] * len(values))[step - 1],
                "optimizer": 0.001,
            }
            event = {"event": "step", "t": 100.0 + step, "rank": rank, "step": step, "loss": 1.0, "lr": 0.1}
            lines.append(json.dumps({**event, "step_s": 0.1, "phases": phases}))
    path = tmp / "leg-0.log"
    path.write_text("\n".join(lines) + "\n")
    return LegEvents.read(0, path)


def test_a_rank_persistently_slower_on_its_own_is_named_with_what_the_others_wait(tmp_path: Path) -> None:
    ev = leg(tmp_path, {0: [0.001] * 30, 1: [0.05] * 30, 2: [0.002] * 30})
    s = stragglers(ev)
    assert s is not None and s["rank"] == 1 and s["steps"] == [1, 30] and s["ranks"] == 3, s
    assert abs(s["excess_s"] - 0.0485) < 1e-6 and s["longest_share"] == 1.0
    check = check_stragglers(ev)
    assert check is not None and check.ok and check.detail.startswith("rank 1 is a straggler (steps 1..30, 3 ranks)")


def test_no_straggler_among_even_ranks_a_rank_slow_now_and_then_or_a_long_compute(tmp_path: Path) -> None:
    even = leg(tmp_path, {0: [0.010] * 30, 1: [0.011] * 30})  # 1 ms apart in a 100 ms step: under 10 %
    assert stragglers(even)["rank"] is None
    bursts = [0.06 if step % 4 == 0 else 0.001 for step in range(30)]  # slowest in a quarter of the steps
    assert stragglers(leg(tmp_path, {0: [0.002] * 30, 1: bursts}))["rank"] is None
    # Rank 0's compute is long because it waits for rank 1 in the all-reduce: not its own work.
    waits = leg(tmp_path, {0: [0.001] * 30, 1: [0.001] * 30}, compute={0: [0.09] * 30, 1: [0.02] * 30})
    assert stragglers(waits)["rank"] is None
    assert stragglers(leg(tmp_path, {0: [0.001] * 9, 1: [0.05] * 9})) is None  # too few steps to say
    assert stragglers(leg(tmp_path, {0: [0.001] * 30})) is None  # one rank: nobody to compare with
    assert check_stragglers(leg(tmp_path, {0: [0.001] * 30})) is None

"""Where a run's billed hours went (launcher.checks.hours), on legs written here with known times:
every second of a leg in exactly one part, the parts summing to the bill, and a bill that does not
match the legs' own times named as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.checks.hours import BILLED, account, check_hours, describe_hours

T0 = 1_000_000.0


def write_leg(path: Path, events: list[dict]) -> str:
    path.write_text("".join(json.dumps({"event": e["event"], "rank": 0, **e}) + "\n" for e in events))
    return str(path)


def steps(first: int, last: int, t0: float, every: float, data: float = 0.0, ckpt: float = 0.0) -> list[dict]:
    """Steps `first..last`, one `every` s apart from t0, each `every` s long by its own timer
    (so nothing falls between steps) with `data` and `ckpt` of it in its phases."""
    return [
        {
            "event": "step",
            "step": s,
            "t": t0 + (s - first + 1) * every,
            "loss": 1.0,
            "lr": 0.1,
            "step_s": every,
            "phases": {"data": data, "ckpt": ckpt, "compute": every - data - ckpt},
        }
        for s in range(first, last + 1)
    ]


def leg(tmp: Path, n: int, started: float, ended: float, events: list[dict], **row: object) -> dict:
    return {
        "leg": n,
        "started_at": started,
        "ended_at": ended,
        "log_path": write_leg(tmp / f"leg-{n}.log", events),
        "role": None,
        "killed": False,
        "end_reason": "exited",
        "cost_usd": None,
        **row,
    }


def test_a_kill_a_preemption_a_hang_and_the_reference_each_land_in_their_part(tmp_path: Path) -> None:
    # leg 0: 10 s of start-up, steps 1..8 of 1 s (0.25 s data, 0.125 s ckpt each), killed 0.5 s
    # into step 9; the checkpoint of step 6 was the newest verified, so steps 7 and 8 were lost.
    leg0 = leg(
        tmp_path, 0, T0, T0 + 18.5, [{"event": "start", "t": T0 + 9}, *steps(1, 8, T0 + 10, 1.0, 0.25, 0.125)],
        killed=True, end_reason="drill kill",
    )  # fmt: skip
    # leg 1: 6 s of start-up with a 2 s restore from step 6, steps 7..10, SIGTERM: stop, 3 s final save.
    leg1 = leg(
        tmp_path, 1, T0 + 20, T0 + 33,
        [
            {"event": "start", "t": T0 + 24}, {"event": "resume", "t": T0 + 26, "from_step": 6},
            *steps(7, 10, T0 + 26, 1.0), {"event": "stop", "t": T0 + 30, "step": 10},
        ],
    )  # fmt: skip
    # leg 2: resumes at 10, steps 11..12, then silent: ended as hung 20 s after its last step.
    leg2 = leg(
        tmp_path, 2, T0 + 40, T0 + 64,
        [{"event": "start", "t": T0 + 41}, {"event": "resume", "t": T0 + 42, "from_step": 10}, *steps(11, 12, T0 + 42, 1.0)],
        killed=True, end_reason="hung: rank 1 silent 16.0 s ...",
    )  # fmt: skip
    leg3 = leg(tmp_path, 3, T0 + 70, T0 + 75, [], role="straight")
    hours = account({"legs": [leg0, leg1, leg2, leg3], "gpu_count": 0, "backend": "local"}, now=T0 + 100)
    parts = hours["parts"]
    assert parts["startup"] == pytest.approx(10 + 4 + 1)  # 2 s of leg 1's 6 s and 1 s of leg 2's were restoring
    assert parts["restore"] == pytest.approx(2 + 1)
    assert parts["lost"] == pytest.approx(2 + 0.5)  # steps 7, 8 and the half step the kill cut
    assert parts["data"] == pytest.approx(6 * 0.25) and parts["saves"] == pytest.approx(6 * 0.125)
    assert parts["productive"] == pytest.approx(6 * 0.625 + 4 + 2)
    assert parts["finish"] == pytest.approx(3) and parts["hang"] == pytest.approx(20)
    assert parts["reference"] == pytest.approx(5) and parts["rounding"] == 0 and parts["outside"] == pytest.approx(0)
    assert hours["billed_s"] == pytest.approx(18.5 + 13 + 24 + 5) == hours["accounted_s"]
    assert hours["gap_s"] == pytest.approx(1.5 + 7 + 6)
    assert hours["goodput"] == pytest.approx(parts["productive"] / hours["billed_s"], abs=1e-4)
    assert check_hours(hours).ok
    assert "goodput 16.1 %" in describe_hours(hours) and "hung 20.0 s" in describe_hours(hours)


def test_the_providers_rounding_is_billed_on_every_node_and_a_short_bill_is_named(tmp_path: Path) -> None:
    """sky bills every node, with a one-minute minimum: a 20 s leg on 2 nodes bills 120
    instance-seconds, 80 of them rounding. A bill under the legs' own time fails the check."""
    one = leg(tmp_path, 0, T0, T0 + 20, [*steps(1, 10, T0 + 5, 1.0)], billed_s=120.0, cost_usd=0.3)
    hours = account({"legs": [one], "gpu_count": 2, "backend": "sky", "nodes": 2}, now=T0 + 50)
    assert hours["billed_s"] == 120 and hours["parts"]["rounding"] == pytest.approx(80)
    assert hours["parts"]["startup"] == pytest.approx(10) and hours["parts"]["finish"] == pytest.approx(10)
    assert hours["gpu_hours"]["rounding"] == pytest.approx(80 / 3600 * 2, abs=1e-6)
    assert hours["usd"]["rounding"] == pytest.approx(0.3 * 80 / 120, abs=1e-4)
    assert check_hours(hours).ok
    short = dict(one, billed_s=30.0)  # 30 instance-seconds for 20 s on 2 nodes: not what the legs ran
    bad = check_hours(account({"legs": [short], "gpu_count": 2, "backend": "sky", "nodes": 2}, now=T0 + 50))
    assert not bad.ok and "40.0 s accounted of 30.0 s billed (33.33 % apart)" in bad.detail, bad.detail


def test_a_running_leg_counts_to_now_and_a_damaged_row_is_left_out(tmp_path: Path) -> None:
    running = leg(tmp_path, 0, T0, None, [*steps(1, 3, T0 + 2, 1.0)])  # type: ignore[arg-type]
    damaged = leg(tmp_path, 1, None, None, [])  # type: ignore[arg-type]
    hours = account({"legs": [running, damaged], "gpu_count": 1, "backend": "local"}, now=T0 + 9)
    assert hours["billed_s"] == pytest.approx(9) and [each["leg"] for each in hours["legs"]] == [0]
    assert hours["parts"]["productive"] == pytest.approx(3) and hours["parts"]["finish"] == pytest.approx(4)
    assert set(hours["parts"]) == set(BILLED)

"""A CPU drill whose steps are the rehearsal's reuses the rehearsal's straight-through leg as its
oracle (launcher.rungs.oracle) and runs none; where the reused oracle disagrees, the drill runs a
fresh straight leg and is judged against that one: a reused oracle never fails a drill."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, edit_config, failed, run_cli
from tests.legs.test_drill import drill


def _disagree(log: Path, step: int) -> None:
    """The reused log's loss at `step` (rank 0) moved: numbers the drill's legs do not reproduce."""
    lines = log.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        at = line.find('{"event": "step"')
        event = json.loads(line[at:]) if at >= 0 else {}
        if event.get("step") == step and event.get("rank", 0) == 0:
            lines[i] = line[:at] + json.dumps(event | {"loss": event["loss"] + 1.0}) + "\n"
            log.write_text("".join(lines))
            return
    raise AssertionError(f"no step {step} in {log}")


def test_the_drill_reuses_the_rehearsals_straight_leg_and_a_disagreeing_one_costs_a_fresh_leg(project: Path) -> None:
    edit_config(project, rungs__drill={"steps": 20, "budget_minutes": 5})  # the rehearsal's 20
    rehearsal = run_cli(["up", "rehearsal", "--json"], cwd=project, timeout=600)
    assert rehearsal.code == 0, failed(rehearsal)
    code, checks, run = drill(project, "--kills", "1", "--at", "mid-push")
    assert code == 0, failed(checks)
    said = check(checks, Kind.STRAIGHT_FINISHED)
    assert said["facts"]["reused_run"] == rehearsal.json()["run_id"] and said["facts"]["reused_leg"] == 3, said
    assert "disagreed" not in said["facts"] and said["evidence"][0]["log"] == said["facts"]["log"]
    assert [leg["role"] for leg in run["legs"]] == [None, None]  # no straight leg ran
    assert "identical at every step" in check(checks, Kind.TIMELINE)["detail"]
    report = run_cli(["report", "--json"], cwd=project, timeout=600)
    status = {p["number"]: p["status"] for p in report.json()["proofs"]}
    assert all(status[n] == "PASS" for n in (1, 2, 3, 4, 6, 8)), report.json()["proofs"]

    _disagree(Path(said["facts"]["log"]), 15)  # the leg after the kill trains step 15 again
    code, checks, run = drill(project, "--kills", "1", "--at", "mid-push")
    assert code == 0, failed(checks)
    disagreed = [c for c in checks_of(checks, Kind.STRAIGHT_FINISHED) if "disagreed" in c.get("facts", {})]
    assert len(disagreed) == 1 and disagreed[0]["ok"], checks_of(checks, Kind.STRAIGHT_FINISHED)
    assert check(checks, Kind.STRAIGHT_FINISHED, leg=2, ok=True)  # the fresh one, leg 2, judged against
    assert [leg["role"] for leg in run["legs"]] == [None, None, "straight"]
    assert "identical at every step" in check(checks, Kind.TIMELINE)["detail"]

"""Where a drill's billed hours went (launcher.checks.hours), through `ledger`, `status` and the
report: the default drill kills leg 0 after an LR change and stops leg 1 with a SIGTERM after an
epoch boundary (a preemption with notice, as the trainer sees one), then a leg resumes to the end
and the straight-through reference runs. The synthetic partition: tests/unit/test_hours.py."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.hours import BILLED
from tests.helpers import failed, run_cli


def test_a_drilled_kill_and_a_preemption_are_accounted_to_the_billed_second(project: Path) -> None:
    res = run_cli(["drill", "cold-resume", "--json"], cwd=project, timeout=900)
    assert res.code == 0, failed(res.json()["checks"])
    run_id = res.json()["run_id"]
    [run] = run_cli(["ledger", run_id, "--json"], cwd=project).json()
    hours = run["hours"]
    legs = {leg["leg"]: leg for leg in run["legs"]}
    billed = sum(leg["billed_s"] for leg in run["legs"])  # the ledger's own bill, leg by leg
    assert abs(hours["accounted_s"] - billed) <= 0.01 * billed and hours["billed_s"] == round(billed, 3)
    assert set(hours["parts"]) == set(BILLED)  # every part stated, 0 where it did not happen
    parts = hours["parts"]
    for part in ("productive", "startup", "restore", "data", "saves", "lost", "finish", "reference"):
        assert parts[part] > 0, (part, parts)
    assert parts["hang"] == 0 and parts["rounding"] == 0  # no hang; the local backend bills its wall time
    assert 0 < hours["goodput"] < 1 and abs(hours["goodput"] - parts["productive"] / hours["billed_s"]) < 2e-4
    each = {leg["leg"]: leg["parts"] for leg in hours["legs"]}
    killed, stopped = legs[0], legs[1]
    assert killed["killed"] and each[0]["lost"] > 0 and each[0]["finish"] == 0  # killed mid-way: its tail lost
    assert not stopped["killed"] and each[1]["finish"] > 0  # the SIGTERM: its final checkpoint, then exit
    straight = [leg["leg"] for leg in run["legs"] if leg["role"] == "straight"]
    assert straight and all(abs(each[n]["reference"] - legs[n]["billed_s"]) < 0.001 for n in straight)
    shown = run_cli(["ledger", run_id], cwd=project).out
    assert f"goodput {100 * hours['goodput']:.1f} %" in shown and "lost (retrained)" in shown
    status = run_cli(["status", run_id, "--json"], cwd=project).json()
    assert status["hours"]["billed_s"] == hours["billed_s"]
    folder = project / "report"
    # The report's proofs are not this test's question (exit 1 where one FAILs): its hours table is.
    assert run_cli(["report", run_id, "--out", str(folder)], cwd=project).code in (0, 1)
    md = (folder / "preflight.md").read_text()
    assert f"| {run_id} | {hours['billed_s']:,.1f} | {100 * hours['goodput']:.1f} % |" in md
    assert f"- {run_id}: {hours['accounted_s']:.1f} s accounted of {hours['billed_s']:.1f} s billed" in md

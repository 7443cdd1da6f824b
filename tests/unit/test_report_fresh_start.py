"""A drill's kill that came before the first checkpoint verified (under load a push can lag the
kill's step): the next leg rightly starts fresh. The report must not call that a failed resume or
a failed cold resume (it was a FAIL of proofs 1-4 and 6 on a drill whose every check passed); it
proves nothing either. Where the store held a verified checkpoint, the same fresh start FAILs."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import Kind, LegEvents
from launcher.report.proofs_store import proof_6
from launcher.report.runs import Evidence, RunData, never_resumed


def drill_run(tmp: Path, expected: int | None) -> RunData:
    """Leg 0 killed at step 12, leg 1 started fresh; the drill's read of the store at the kill
    found `expected` as the newest verified checkpoint."""
    logs = []
    for leg, first in ((0, 1), (1, 1)):
        path = tmp / f"leg-{leg}.log"
        steps = range(first, 13 if leg == 0 else 21)
        path.write_text(
            "".join(
                json.dumps({"event": "step", "t": 1.0 + s, "rank": 0, "step": s, "loss": 1.0, "lr": 0.1}) + "\n"
                for s in steps
            )
        )
        logs.append(LegEvents.read(leg, path))
    ok = expected is None
    row = {
        "id": "r-drill",
        "rung": "drill",
        "gpu_count": 0,
        "legs": [
            {"leg": 0, "killed": True, "instance": "a", "end_reason": "drill kill at step 12", "exit_code": -9},
            {"leg": 1, "killed": False, "instance": "b", "end_reason": "exited", "exit_code": 0},
        ],
        "checks": [
            {
                "name": "leg 1 resumed from the newest verified checkpoint",
                "ok": ok,
                "detail": "",
                "kind": str(Kind.RESUMED_NEWEST),
                "leg": 1,
                "facts": {"resumed_at": None, "expected": expected},
            }
        ],
    }
    return RunData(row, logs)


def test_a_kill_before_the_first_verified_checkpoint_is_neither_a_failed_nor_a_proven_resume(tmp_path: Path) -> None:
    run = drill_run(tmp_path, None)
    assert never_resumed([run]) == []
    proof = proof_6([run], Evidence())
    assert proof.status == "MISSING" and "before the first checkpoint verified" in proof.summary, proof.summary


def test_a_fresh_start_where_the_store_held_a_verified_checkpoint_fails(tmp_path: Path) -> None:
    run = drill_run(tmp_path, 10)
    assert [n.leg.leg for n in never_resumed([run])] == [1]
    assert proof_6([run], Evidence()).status == "FAIL"

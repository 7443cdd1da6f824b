"""Gradient accumulation planted in the reference trainer: `sess.step()` once per micro-batch,
the optimizer stepping every 4th. The rehearsal's legs stop where their deadlines land, inside
a window, and the gradients accumulated there are not in the checkpoint: the loss leaves the
straight-through run's after the resumed leg's first optimizer step. Proof 3 says why, first,
by the accumulation check (launcher.checks.accumulation); before it, the report said only
proof 4's "first difference at step 9: loss", and proof 3 MISSING, "neither the tracked
optimizer nor any other stepped", for the last leg, shorter than one window (measured at 15
steps). The control, resumes at window ends, is tests/unit/test_accumulation.py's."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, failed, run_cli
from tests.legs.test_planted_bugs import plant, report_fails

ACCUMULATE = (
    "        opt.zero_grad(set_to_none=True)\n"
    "        loss.backward()\n"
    "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    '        sess.lap("compute")\n'
    "        opt.step()\n"
    "        sched.step()\n",
    "        (loss / 4).backward()\n"
    '        sess.lap("compute")\n'
    "        if (sess.step_count + 1) % 4 == 0:  # the bug: a checkpoint may come between two of these\n"
    "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    "            opt.step()\n"
    "            sched.step()\n"
    "            opt.zero_grad(set_to_none=True)\n",
)


def test_a_resume_inside_an_accumulation_window_is_named_by_proof_3(project: Path) -> None:
    plant(project, *ACCUMULATE)
    res = run_cli(["up", "rehearsal", "--steps", "8", "--json"], cwd=project, timeout=900)
    assert res.code == 1 and check(failed(res.json()["checks"]), Kind.TIMELINE), res.out[-2000:]
    proof_3 = report_fails(project, 3, 4)[3]
    assert proof_3.split("first: ")[1].startswith("resumes at the end of an accumulation window: resumed at micro-step")
    assert "inside an accumulation window of 4" in proof_3 and "gradients lost at the resume" in proof_3, proof_3

"""Gradient accumulation planted in the reference trainer on 2 ranks (torchrun): `sess.step()`
once per micro-batch, the optimizer stepping every 4th, alike on both ranks. The rehearsal's
legs stop where their deadlines land, inside a window, and the gradients accumulated there are
not in the checkpoint: the loss leaves the straight-through run's after the resumed leg's first
optimizer step. Proof 3 says why, first, by the accumulation check on every rank
(launcher.checks.ranks.check_accumulation_every_rank over launcher.checks.accumulation), naming
the ranks inside the window. On one rank, before that check, the report said only proof 4's
"first difference at step 9: loss", and proof 3 MISSING, "neither the tracked optimizer nor any
other stepped", for the last leg, shorter than one window (measured at 15 steps). The control,
resumes at window ends, is tests/unit/test_accumulation.py's; one rank inside the window while
the other is not, tests/unit/test_rank_checks.py's."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, edit_config, failed, run_cli
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


def test_a_resume_inside_an_accumulation_window_on_two_ranks_is_named_by_proof_3(project: Path) -> None:
    """9 steps: the legs stop at micro-steps 3 and 6 (leg 0's 3 losses are the fewest the loss
    continuity check measures a band from), both inside a window of 4, on both ranks."""
    edit_config(project, trainer__command="torchrun --standalone --nproc_per_node=2 train.py")
    plant(project, *ACCUMULATE)
    res = run_cli(["up", "rehearsal", "--steps", "9", "--json"], cwd=project, timeout=900)
    assert res.code == 1, res.out[-2000:] + res.err[-2000:]
    bad = failed(res)
    assert sorted(c["kind"] for c in bad) == [Kind.ACCUMULATION, Kind.TIMELINE], bad
    acc = check(bad, Kind.ACCUMULATION)
    said = "ranks 0 and 1: resumed at micro-step 3 inside an accumulation window of 4: 3 micro-batches' gradients lost"
    assert acc["detail"].startswith(said) and "summed 1 micro-batch of 4" in acc["detail"], acc["detail"]
    assert "also inside a window: micro-steps [6]" in acc["detail"] and acc["facts"]["ranks_inside"] == [0, 1], acc
    assert "first difference at step 5 (leg 1): loss" in check(bad, Kind.TIMELINE)["detail"]  # after its first window
    proof_3 = report_fails(project, 3, 4)[3]
    assert proof_3.split("first: ")[1].startswith("resumes at the end of an accumulation window: " + said), proof_3

"""Gradient accumulation named as accumulation (launcher.checks.accumulation), on event logs
written here in the shapes measured on the reference trainer and an Accelerate loop with
K=4: a resume inside a window, the control at window ends, windows counted from the resume,
an epoch's short last window, a step a GradScaler skipped, and gradients kept in the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.checks.accumulation import check_accumulation, within_first_window
from launcher.checks.evidence import Kind, LegEvents


def leg(n: int, *events: dict[str, Any]) -> LegEvents:
    return LegEvents(n, Path(f"leg-{n}.log"), [(i + 1, {"rank": 0, "t": 0.0, **e}) for i, e in enumerate(events)])


def steps(first: int, last: int, ends: set[int], loss: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """Step events first..last of one leg, the optimizer stepping at `ends` (opt_steps counted in the leg)."""
    out, n = [], 0
    for s in range(first, last + 1):
        n += s in ends
        out.append({"event": "step", "step": s, "loss": (loss or {}).get(s, 1.0), "lr": 0.1, "opt_steps": n})
    return out


def resumed(at: int) -> dict[str, Any]:
    return {"event": "resume", "from_step": at}


FOURS = {4, 8, 12, 16, 20}


def test_a_resume_inside_a_window_fails_naming_the_micro_batches_lost() -> None:
    """The reference trainer's shape: `sess.step()` per micro-batch, `opt.step()` at every 4th
    (counted on the session's step), legs stopped at 5 and 13."""
    legs = [
        leg(0, *steps(1, 5, FOURS)),
        leg(1, resumed(5), *steps(6, 13, FOURS)),
        leg(2, resumed(13), *steps(14, 15, FOURS)),
    ]
    c = check_accumulation(legs, None, exact=False)
    assert c is not None and not c.ok and c.kind == Kind.ACCUMULATION and c.leg == 1, c
    assert "resumed at micro-step 5 inside an accumulation window of 4: 1 micro-batch's gradients lost" in c.detail
    assert "summed 3 micro-batches of 4" in c.detail and "also inside a window: micro-steps [13]" in c.detail
    assert "4 micro-batches per optimizer step, constant" in c.detail and "sess.step()" in c.detail
    assert c.facts["micro_per_step"] == 4 and c.facts["constant"] is True
    assert [(x["leg"], x["step"], x["held"]) for x in c.facts["inside"]] == [(1, 5, 1), (2, 13, 1)]
    # leg 2 ended 2 micro-steps after its resume: its optimizer's 0 steps say nothing (proof 3)
    assert within_first_window(legs, 2) and not within_first_window(legs, 1)


def test_resumes_at_window_ends_pass_saying_the_window() -> None:
    legs = [
        leg(0, *steps(1, 4, FOURS)),
        leg(1, resumed(4), *steps(5, 12, FOURS)),
        leg(2, resumed(12), *steps(13, 15, FOURS)),
    ]
    c = check_accumulation(legs, None, exact=False)
    assert c is not None and c.ok and c.kind == Kind.ACCUMULATION, c
    assert "4 micro-batches per optimizer step, constant; resumed at micro-steps [4, 12]" in c.detail
    assert c.facts["inside"] == [] and within_first_window(legs, 2)


def test_no_accumulation_and_no_optimizer_count_say_nothing() -> None:
    every = set(range(1, 30))
    assert (
        check_accumulation([leg(0, *steps(1, 5, every)), leg(1, resumed(5), *steps(6, 9, every))], None, True) is None
    )
    bare = [leg(0, {"event": "step", "step": 1, "loss": 1.0, "lr": 0.1}), leg(1, resumed(1))]
    assert check_accumulation(bare, None, True) is None
    assert not within_first_window([leg(0, *steps(1, 5, every)), leg(1, resumed(5), *steps(6, 6, every))], 1)


def test_windows_counted_from_the_resume_are_said_to_move() -> None:
    """A loop whose own micro-batch counter starts at 0 in each leg: its windows move."""
    legs = [leg(0, *steps(1, 6, FOURS)), leg(1, resumed(6), *steps(7, 14, {10, 14}))]
    c = check_accumulation(legs, None, exact=False)
    assert c is not None and not c.ok and "2 micro-batches' gradients lost at the resume" in c.detail, c
    assert "every later window moved 2 micro-steps" in c.detail


def test_an_epochs_short_window_and_a_skipped_step_are_no_resume_inside() -> None:
    """Accelerate's `accumulate` closes a window at the loader's end (10 batches: 4, 4, 2); a
    GradScaler that skips an overflowing step leaves a gap of 8: neither moves the window of 4."""
    epochs = {4, 8, 10, 14, 18, 20}
    legs = [leg(0, *steps(1, 10, epochs)), leg(1, resumed(10), *steps(11, 20, epochs))]
    c = check_accumulation(legs, None, exact=False)
    assert c is not None and c.ok and not c.facts["constant"] and "also [2]" in c.detail, c
    inside = [
        leg(0, *steps(1, 10, epochs)),
        leg(1, resumed(10), *steps(11, 16, epochs)),
        leg(2, resumed(16), *steps(17, 18, epochs)),
    ]
    bad = check_accumulation(inside, None, exact=False)
    assert bad is not None and not bad.ok and "micro-step 16" in bad.detail and "2 micro-batches'" in bad.detail
    skipped = {4, 12, 16}  # the optimizer skipped at 8
    legs = [leg(0, *steps(1, 8, skipped)), leg(1, resumed(8), *steps(9, 16, skipped))]
    ok = check_accumulation(legs, None, exact=False)
    assert ok is not None and ok.ok and ok.facts["inside"] == [], ok


def test_gradients_kept_in_the_checkpoint_resume_exactly_inside_a_window() -> None:
    """The loss after the resumed leg's first window end equals the straight run's, exactly:
    the accumulated gradients came back. Without an exact straight run, the FAIL stands."""
    loss = {s: 1.0 + s / 100 for s in range(1, 13)}
    straight = leg(9, *steps(1, 12, FOURS, loss))
    legs = [leg(0, *steps(1, 5, FOURS, loss)), leg(1, resumed(5), *steps(6, 12, FOURS, loss))]
    c = check_accumulation(legs, straight, exact=True)
    assert c is not None and c.ok and "the gradients came back" in c.detail and c.facts["inside"][0]["restored"], c
    wrong = [legs[0], leg(1, resumed(5), *steps(6, 12, FOURS, {**loss, 9: 2.0}))]
    assert not check_accumulation(wrong, straight, exact=True).ok  # type: ignore[union-attr]
    assert not check_accumulation(legs, straight, exact=False).ok  # type: ignore[union-attr]
    short = legs + [leg(2, resumed(9), *steps(10, 11, FOURS, loss))]  # ended before its window's end
    assert check_accumulation(short, straight, exact=True).ok  # type: ignore[union-attr]


def test_legs_shorter_than_two_windows_are_measured_on_the_straight_run() -> None:
    """A rehearsal of 8 steps (legs stopped at 2 and 5): no leg holds two window ends, the
    straight-through run does."""
    legs = [
        leg(0, *steps(1, 2, FOURS)),
        leg(1, resumed(2), *steps(3, 5, FOURS)),
        leg(2, resumed(5), *steps(6, 8, FOURS)),
    ]
    assert check_accumulation(legs, None, exact=False) is None
    c = check_accumulation(legs, leg(9, *steps(1, 8, FOURS)), exact=False)
    assert c is not None and not c.ok and c.leg == 1 and "micro-step 2" in c.detail, c
    assert "2 micro-batches' gradients lost" in c.detail and c.facts["micro_per_step"] == 4

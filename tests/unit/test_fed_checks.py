"""The launcher's checks on the fed-input evidence (launcher.checks.data, launcher.checks.state), on
event logs written here: the batch against the straight run at every resumed step, the state
carried into the forward at each resume, and a loop with no optimizer at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.checks.data import check_batches_straight
from launcher.checks.evidence import LegEvents
from launcher.checks.state import check_fields_straight, check_optimizer_in_use
from runtime.contract import check_event


def leg(n: int, *events: dict[str, Any]) -> LegEvents:
    return LegEvents(n, Path(f"leg-{n}.log"), [(i + 1, {"rank": 0, "t": 0.0, **e}) for i, e in enumerate(events)])


def step(s: int, **fields: Any) -> dict[str, Any]:
    return {"event": "step", "step": s, "loss": 1.0, "lr": 0.1, **fields}


def resumed(at: int) -> dict[str, Any]:
    return {"event": "resume", "from_step": at}


def test_a_resumed_batch_the_straight_run_never_reads_fails_proof_2() -> None:
    """With carried state hashed apart, a fed batch found at no step of the straight run is the
    data's doing: a skip counted from the run's start, an augmentation's RNG not restored."""
    straight = leg(9, *(step(s, batch_hash=f"h{s}") for s in range(1, 7)))
    first = leg(0, *(step(s, batch_hash=f"h{s}") for s in range(1, 4)))
    same = leg(1, resumed(3), *(step(s, batch_hash=f"h{s}") for s in range(4, 7)))
    good = check_batches_straight([first, same], straight)
    assert good is not None and good.ok and "3 resumed steps" in good.detail
    new = leg(1, resumed(3), step(4, batch_hash="h4"), step(5, batch_hash="zz"), step(6, batch_hash="h6"))
    bad = check_batches_straight([first, new], straight)
    assert bad is not None and not bad.ok and bad.leg == 1, bad
    assert "step 5 (leg 1, resumed at step 3) fed the model a batch (zz) the straight-through run reads at no step" in (
        bad.detail
    )
    assert "a skip counted from the run's start rather than the epoch's" in bad.detail
    assert "an augmentation whose RNG was not restored" in bad.detail and "1 of 3 resumed steps" in bad.detail
    moved = leg(1, resumed(3), step(4, batch_hash="h5"), step(5, batch_hash="zz"), step(6, batch_hash="h6"))
    said = check_batches_straight([first, moved], straight)
    assert said is not None and not said.ok and "batch of step 5 (+1 batches)" in said.detail  # moved comes first


def carried(s: int, hidden: str | None, batch: str = "b") -> dict[str, Any]:
    return step(s, batch_hash=f"{batch}{s}", **({"fed_state": {"hidden": hidden}} if hidden else {}))


def test_a_hidden_state_not_restored_is_named_by_its_argument_not_blamed_on_the_data() -> None:
    straight = leg(9, *(carried(s, f"h{s}" if s > 1 else None) for s in range(1, 8)))
    first = leg(0, *(carried(s, f"h{s}" if s > 1 else None) for s in range(1, 5)))
    zeroed = leg(1, resumed(4), carried(5, None), carried(6, "x6"), carried(7, "x7"))
    bad = check_fields_straight([first, zeroed], straight)
    assert bad is not None and not bad.ok
    assert "the model's `hidden` input at step 5 (leg 1, resumed at step 4) differs from the straight-through" in (
        bad.detail
    )
    assert "(not given vs h5); the batch is the same" in bad.detail
    data = check_batches_straight([first, zeroed], straight)
    assert data is not None and data.ok  # the batch hash holds no hidden state: no data finding
    kept = leg(1, resumed(4), carried(5, "h5"), carried(6, "y6"), carried(7, "y7"))  # later: float noise, not compared
    good = check_fields_straight([first, kept], straight)
    assert good is not None and good.ok and "carried-state inputs (hidden)" in good.detail


def test_a_carried_state_that_does_not_reproduce_before_any_resume_is_left_out() -> None:
    straight = leg(9, *(carried(s, f"h{s}") for s in range(1, 6)))
    first = leg(0, *(carried(s, f"other{s}") for s in range(1, 4)))  # leg 0 already differs: not reproducible
    zeroed = leg(1, resumed(3), carried(4, None), carried(5, "h5"))
    assert check_fields_straight([first, zeroed], straight) is None  # nothing else printed to compare


TRACKED_MODEL = {"event": "start", "tracked": {"model": "model"}}


def test_a_loop_without_any_optimizer_is_missing_with_what_was_seen() -> None:
    """Manual SGD on p.data: no optimizer tracked, none stepped anywhere. Not 're-created after
    the resume?': nothing to answer proof 3 from."""
    manual = [
        leg(0, TRACKED_MODEL),
        leg(1, TRACKED_MODEL, resumed(2), step(3, opt_steps_all=0), step(4, opt_steps_all=0)),
    ]
    said = check_optimizer_in_use(manual, 1)
    assert said is not None and said.missing and "re-created" not in said.detail, said
    assert "no optimizer is tracked, and none stepped in leg 1 (2 steps since the resume at step 2)" in said.detail
    assert "proof 3 cannot be answered from an optimizer's state" in said.detail
    other = [
        leg(0, TRACKED_MODEL),
        leg(1, TRACKED_MODEL, resumed(2), step(3, opt_steps_all=1), step(4, opt_steps_all=2)),
    ]
    untracked = check_optimizer_in_use(other, 1)
    assert untracked is not None and untracked.missing
    assert "no optimizer is tracked (tracked: ['model']), and an optimizer stepped 2 times in leg 1" in untracked.detail
    opt = {"event": "start", "tracked": {"model": "model", "opt": "optimizer"}}
    idle = [leg(0, opt), leg(1, opt, resumed(2), step(3, opt_steps=0, opt_steps_all=0))]
    none = check_optimizer_in_use(idle, 1)
    assert none is not None and none.missing and "neither the tracked optimizer nor any other stepped" in none.detail
    swapped = [leg(0, opt), leg(1, opt, resumed(2), step(3, opt_steps=0, opt_steps_all=1))]
    bad = check_optimizer_in_use(swapped, 1)
    assert bad is not None and not bad.ok and not bad.missing and "the session does not track" in bad.detail


def test_the_fed_state_and_every_optimizers_steps_are_typed_in_the_contract() -> None:
    ok = step(2, fed_state={"hidden": "ab"}, opt_steps_all=3)
    assert check_event(ok) is None
    assert "fed_state" in (check_event(step(2, fed_state={"hidden": 3})) or "")
    assert "opt_steps_all" in (check_event(step(2, opt_steps_all="x")) or "")

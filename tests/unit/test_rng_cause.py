"""The straight comparison's first difference names an RNG cause where the legs printed one:
an RNG set after the restore, or the global RNG at the first resumed forward other than the
straight-through run's (launcher.checks.resume.rng_cause)."""

from pathlib import Path

from launcher.checks.evidence import LegEvents
from launcher.checks.resume import compare_straight


def _leg(leg: int, items: list[dict]) -> LegEvents:
    return LegEvents(leg, Path(f"leg-{leg}.log"), [(n, e) for n, e in enumerate(items)])


def _step(s: int, loss: float, **kw: object) -> dict:
    return {"event": "step", "step": s, "loss": loss, "lr": 0.1, "batch_hash": f"b{s}", **kw}


def _runs(resume: dict, rng_resumed: str, rng_straight: str) -> str:
    straight = _leg(9, [_step(1, 1.0), _step(2, 0.9), _step(3, 0.8, rng_in=rng_straight), _step(4, 0.7)])
    leg0 = _leg(0, [_step(1, 1.0), _step(2, 0.9)])
    leg1 = _leg(1, [resume, _step(3, 0.81, rng_in=rng_resumed), _step(4, 0.71)])
    check = compare_straight([leg0, leg1], straight, exact=True)
    assert not check.ok
    return check.detail


def test_a_global_rng_drawn_between_the_checkpoint_and_the_next_step_is_named() -> None:
    detail = _runs({"event": "resume", "from_step": 2}, "aaaa", "bbbb")
    assert "first difference at step 3" in detail and "global RNG at step 3's first forward" in detail, detail


def test_the_same_rng_at_the_first_forward_adds_no_cause() -> None:
    detail = _runs({"event": "resume", "from_step": 2}, "aaaa", "aaaa")
    assert "first difference at step 3" in detail and "RNG" not in detail, detail


def test_an_rng_set_after_the_restore_is_named_as_such() -> None:
    detail = _runs({"event": "resume", "from_step": 2, "rng_set_after_load": ["torch"]}, "aaaa", "bbbb")
    assert "set the RNG (torch) after its restore" in detail and "first forward" not in detail, detail

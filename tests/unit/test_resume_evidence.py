"""The session's own evidence (runtime.session.step_evidence) and the checks that read it
(launcher.checks.state), on real torch objects and on event logs written here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.checks.data import check_fed_batch
from launcher.checks.evidence import LegEvents
from launcher.checks.kills import Kill, check_resumed_newest
from launcher.checks.readback import StateReader
from launcher.checks.state import (
    PROOF_KINDS,
    check_fields_straight,
    check_optimizer_in_use,
    check_restored,
    check_state_straight,
)
from runtime.contract import check_event
from runtime.session.step_evidence import StepEvidence, kind_of, state_digest, state_digests, trained_state_digests


def test_the_step_hashes_what_the_model_was_fed_not_what_step_was_given() -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ev = StepEvidence()
    ev.watch("model", model)
    ev.watch("optimizer", opt)
    x, nxt = torch.randn(3, 4), torch.randn(3, 4)

    def train(batch: torch.Tensor) -> None:
        model(batch).sum().backward()
        opt.step()

    train(x)
    first = ev.step_fields(x)
    assert first["batch_from"] == "forward" and first["step_batch_fed"] is True and first["opt_steps"] == 1
    train(x)
    prefetched = ev.step_fields(nxt)  # a loop that fetched the next batch before calling step()
    assert prefetched["batch_hash"] == first["batch_hash"] and prefetched["step_batch_fed"] is False
    model.eval()
    model(x)  # an evaluation forward is not the step's batch
    model.train()
    with torch.no_grad():
        model(x)
    fallback = ev.step_fields(nxt)
    assert fallback["batch_from"] == "step" and fallback["batch_hash"] != first["batch_hash"]
    assert "step_batch_fed" not in fallback and fallback["opt_steps"] == 2
    tokens = torch.randint(0, 9, (2, 4)).numpy().astype("uint16")  # token ids as read, widened for the model
    emb = torch.nn.Embedding(9, 2)
    ev.watch("emb", emb)
    emb(torch.from_numpy(tokens.astype("int64"))).sum().backward()
    assert ev.step_fields(tokens)["step_batch_fed"] is True
    emb(torch.from_numpy(tokens.astype("int64"))).sum().backward()
    assert "step_batch_fed" not in ev.step_fields(torch.rand(3, 3))  # nothing of that kind and shape was fed
    model(x).sum().backward()  # two micro-batches of one step: both count, in order
    model(nxt).sum().backward()
    two = ev.step_fields(None)
    assert two["batch_hash"] not in (first["batch_hash"], fallback["batch_hash"])


def test_kinds_of_tracked_state() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)

    class Cursor:
        state_kind = "data"

    assert [kind_of(o) for o in (model, opt, sched, plateau, Cursor(), object())] == [
        "model",
        "optimizer",
        "scheduler",
        "scheduler",
        "data",
        "other",
    ]


def test_a_state_digest_is_exact_and_canonical() -> None:
    model = torch.nn.Linear(3, 3)
    state = {"w": model.state_dict(), "n": 3, "f": 0.1, "b": torch.ones(2, dtype=torch.bfloat16), "fn": len}
    same = {"fn": len, "b": torch.ones(2, dtype=torch.bfloat16), "f": 0.1, "n": 3, "w": model.state_dict()}
    assert state_digest(state) == state_digest(same)  # key order is not state
    assert state_digest({**state, "f": 0.10000000000000002}) != state_digest(state)  # one ulp of a float
    assert state_digest({**state, "n": 4}) != state_digest(state)
    got = state_digests(
        {
            "model": {"w": torch.zeros(2)},
            "extra": {"h": 1},
            "step": 5,
            "tokens": 9,
            "rng": [{"torch": torch.zeros(3), "python": (1, 2)}, {"torch": torch.ones(3)}],
        },
        ["model", "extra", "step", "tokens", "rng"],
    )
    assert set(got) == {"model", "extra", "rng.torch", "rng.python"}


def test_one_ulp_of_one_weight_changes_the_digest() -> None:
    w = torch.zeros(4)
    before = state_digest({"w": w.clone()})
    w[2] = torch.nextafter(w[2], torch.tensor(1.0))
    assert state_digest({"w": w}) != before


# --- the checks, on event logs -----------------------------------------------------------


def leg(n: int, *events: dict[str, Any]) -> LegEvents:
    return LegEvents(n, Path(f"leg-{n}.log"), [(i + 1, {"rank": 0, "t": 0.0, **e}) for i, e in enumerate(events)])


def step(s: int, **fields: Any) -> dict[str, Any]:
    return {"event": "step", "step": s, "loss": 1.0, "lr": 0.1, **fields}


TRACKED = {"event": "start", "tracked": {"model": "model", "optimizer": "optimizer", "sched": "scheduler"}}


def test_the_optimizer_in_use() -> None:
    resumed = [
        leg(0, TRACKED, step(1, opt_steps=1)),
        leg(1, TRACKED, {"event": "resume", "from_step": 1}, step(2, opt_steps=0), step(3, opt_steps=0)),
    ]
    bad = check_optimizer_in_use(resumed, 1)
    assert (
        bad is not None and not bad.ok and "does not track: 2 steps since the resume at step 1, 0 steps" in bad.detail
    )
    resumed[1] = leg(1, TRACKED, {"event": "resume", "from_step": 1}, step(2, opt_steps=1), step(3, opt_steps=2))
    good = check_optimizer_in_use(resumed, 1)
    assert good is not None and good.ok and "2 steps of the tracked optimizer in 2 steps" in good.detail
    untracked = [
        leg(0),
        leg(1, {"event": "start", "tracked": {"model": "model"}}, {"event": "resume", "from_step": 1}, step(2)),
    ]
    absent = check_optimizer_in_use(untracked, 1)
    assert absent is not None and absent.missing and "no optimizer is tracked" in absent.detail
    assert check_optimizer_in_use([leg(0), leg(1, {"event": "start"}, step(2))], 1) is None  # an older trainer


def test_restoration_is_proved_by_digests() -> None:
    saved = {"event": "state_digest", "step": 5, "digests": {"model": "m5", "optimizer": "o5", "sched": "s5"}}
    legs = [
        leg(0, TRACKED, saved),
        leg(
            1,
            TRACKED,
            {"event": "resume", "from_step": 5, "digests": {"model": "m5", "optimizer": "oX", "sched": "s5"}},
            step(6),
        ),
    ]
    bad = check_restored(legs, 1, PROOF_KINDS[3])
    assert bad is not None and not bad.ok and "optimizer as loaded at step 5 differs" in bad.detail
    good = check_restored(legs, 1, PROOF_KINDS[4])
    assert good is not None and good.ok and "model" in good.name
    assert check_restored(legs, 1, PROOF_KINDS[2]) is None  # no data object tracked


def test_state_digests_against_the_straight_run() -> None:
    def digests(s: int, **d: str) -> dict[str, Any]:
        return {"event": "state_digest", "step": s, "digests": d}

    legs = [
        leg(0, TRACKED, digests(5, model="m5", sched="s5", **{"rng.python": "p0"})),
        leg(
            1,
            TRACKED,
            {"event": "resume", "from_step": 5},
            digests(10, model="m10", sched="sX", **{"rng.python": "p1"}),
        ),
    ]
    straight = leg(
        9,
        TRACKED,
        digests(5, model="m5", sched="s5", **{"rng.python": "pS"}),
        digests(10, model="m10", sched="s10", **{"rng.python": "pT"}),
    )
    bad = check_state_straight(legs, straight, PROOF_KINDS[3])
    assert bad is not None and not bad.ok and "step 10 (leg 1): sched's state" in bad.detail
    rng = check_state_straight(legs, straight, PROOF_KINDS[4])
    # the python stream differed before any resume (unseeded): left out and named, not a failure;
    # the model's weights go by the loss (float32 resolution), not by digest
    assert rng is None
    legs[1].items.append((9, {"event": "state_digest", "rank": 0, "step": 12, "digests": {"extra": "e1"}}))
    straight.items.append((9, {"event": "state_digest", "rank": 0, "step": 12, "digests": {"extra": "e2"}}))
    extra = check_state_straight(legs, straight, PROOF_KINDS[4])
    assert extra is not None and not extra.ok and "step 12 (leg 1): extra's state" in extra.detail
    assert "left out, not reproducible from one process to the next: ['rng.python']" in extra.detail


def test_every_printed_field_is_compared() -> None:
    legs = [
        leg(0, step(1, epoch=0, acc=0.5)),
        leg(1, {"event": "resume", "from_step": 1}, step(2, epoch=0, acc=0.25 + 1e-9, step_s=9.0)),
    ]
    straight = leg(9, step(1, epoch=0, acc=0.5), step(2, epoch=1, acc=0.25, step_s=0.1))
    bad = check_fields_straight(legs, straight)
    assert bad is not None and not bad.ok and "step 2 (leg 1): epoch 0 vs 1" in bad.detail
    straight = leg(9, step(1, epoch=0, acc=0.5), step(2, epoch=0, acc=0.25, step_s=0.1))
    good = check_fields_straight(legs, straight)
    assert good is not None and good.ok and "acc, epoch" in good.detail  # timings are not compared


def test_a_step_given_another_batch_than_the_model_ate_is_reported_not_failed() -> None:
    """A random augmentation feeds the model another batch than the one `step()` is given: the
    data checks judge the fed batches; this one only says how many steps differed."""
    legs = [leg(0, step(1, step_batch_fed=True)), leg(1, step(2, step_batch_fed=False))]
    said = check_fed_batch(legs)
    assert said is not None and said.ok and "1 of 2 steps gave step() a batch the model was not fed" in said.detail
    assert "first: leg 1 step 2" in said.detail and said.evidence
    assert check_fed_batch([leg(0, step(1))]) is None


def test_the_new_fields_are_typed_in_the_contract() -> None:
    assert check_event({"event": "state_digest", "step": 1, "digests": {"model": "ab"}}) is None
    assert "digests" in (check_event({"event": "state_digest", "step": 1, "digests": {"model": 3}}) or "")
    assert "opt_steps" in (check_event({"event": "step", "step": 1, "loss": 1.0, "lr": 0.1, "opt_steps": "x"}) or "")


def test_the_state_training_starts_from_is_digested_alike_by_the_leg_and_the_launchers_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a resume the first training forward prints the digests of the weights and the
    optimizer's moments it trains from (once; an evaluation forward does not count); the
    launcher's reader computes the same from the saved state, loaded as a leg loads it. An LR
    the loop sets before the forward (nanoGPT) is not a difference; one changed weight is."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "state.pt")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    printed: list[dict[str, Any]] = []
    monkeypatch.setattr("runtime.events.emit", lambda event, **f: printed.append({"event": event, **f}))
    ev = StepEvidence()
    ev.watch("model", model)
    ev.watch("optimizer", opt)
    ev.trains_from({"model": model, "optimizer": opt}, 7)
    for group in opt.param_groups:
        group["lr"] = 0.05  # the loop's own schedule, set before the forward
    model.eval()
    model(torch.randn(3, 4))  # an evaluation forward trains nothing
    assert printed == []
    model.train()
    model(torch.randn(3, 4)).sum().backward()
    model(torch.randn(3, 4)).sum().backward()  # once only
    kinds = {"model": "model", "optimizer": "optimizer"}
    assert printed == [{"event": "trains_from", "step": 7, "digests": trained_state_digests(saved, kinds)}]
    with torch.no_grad():
        model.weight[0, 0] += 1e-3
    assert (
        trained_state_digests({"model": model.state_dict(), "optimizer": opt.state_dict()}, kinds)["model"]
        != printed[0]["digests"]["model"]
    )


def kill_with(reads: dict[int, dict[str, Any]], expected: int = 5) -> Kill:
    return Kill(leg=0, moment="mid-verify", at_line="", expected=expected, reads=reads)


def test_the_resume_point_is_checked_against_the_launchers_read_of_the_store() -> None:
    store5 = {
        "ok": True,
        "verified": True,
        "trains_from": {"model": "m5", "optimizer": "o5"},
        "digests": {"model": "M5"},
    }
    store10 = {"ok": True, "verified": False, "trains_from": {"model": "m10", "optimizer": "o10"}}
    resume = {"event": "resume", "from_step": 5, "digests": {"model": "M5"}}

    def check(*events: dict[str, Any], reads: dict[int, dict[str, Any]] | None = None) -> Any:
        return check_resumed_newest(
            leg(1, resume, *events), kill_with({5: store5, 10: store10} if reads is None else reads)
        )

    good = check({"event": "trains_from", "step": 5, "digests": {"model": "m5", "optimizer": "o5"}})
    assert good.ok and "(model, optimizer) = the launcher's read" in good.detail
    unverified = check({"event": "trains_from", "step": 5, "digests": {"model": "m10", "optimizer": "o10"}})
    assert not unverified.ok and "it is the store's step-10 checkpoint, which never verified" in unverified.detail
    cached = check({"event": "trains_from", "step": 5, "digests": {"model": "mX", "optimizer": "o5"}})
    assert not cached.ok and "model mX vs m5" in cached.detail and "matches no checkpoint" in cached.detail
    assert check().ok and "each object as loaded (model)" in check().detail  # no training forward: the resume's
    unread = check(
        {"event": "trains_from", "step": 5, "digests": {"model": "m5"}},
        reads={5: {"ok": False, "error": "the launcher could not read the state (no torch)"}},
    )
    assert not unread.ok and "no torch" in unread.detail
    silent = check_resumed_newest(leg(1, {"event": "resume", "from_step": 5}), kill_with({5: store5}))
    assert silent.ok and "printed no state digests" in silent.detail  # a trainer of the contract alone
    assert not check_resumed_newest(leg(1, {"event": "resume", "from_step": 10}), kill_with({5: store5})).ok


def test_a_reader_that_cannot_run_says_why_on_each_read(tmp_path: Path) -> None:
    for python, why in (("/nonexistent/python", "could not start"), ("/bin/false", "ended")):
        reader = StateReader(python, tmp_path.as_uri(), "runs/x", {})
        try:
            out = reader.read("step-00000005", {})
            assert not out["ok"] and why in out["error"] and "the launcher could not read the state" in out["error"]
            assert not reader.read("step-00000010", {})["ok"]  # broken stays broken, said again
        finally:
            reader.close()


@pytest.mark.parametrize(
    ("losses", "resumed_at", "moved", "said"),
    [
        # a loss jump beyond the band passes only as the straight-through run's own jump (a rank's
        # local loss can jump so), and says so; any other jump fails
        (
            {1: 5.0, 2: 4.9, 3: 4.8, 4: 4.7, 5: 4.6, 6: 4.5, 7: 4.0, 8: 3.9},
            6,
            (7, 4.45),
            "the straight-through run's own jump at steps 6-7, exactly",
        ),
        # a resume 2 steps into the run has no band to measure (a drill's `mid-epoch` on 4-step
        # epochs failed so, every step exact): the losses either side are compared to the straight run
        ({1: 5.0, 2: 4.9, 3: 4.8, 4: 4.7}, 2, (3, 4.7), "equal the straight-through run's exactly"),
    ],
)
def test_a_restart_the_band_cannot_judge_is_judged_by_the_exact_straight_run(
    losses: dict[int, float], resumed_at: int, moved: tuple[int, float], said: str
) -> None:
    """Exact CPU: where the band fails or cannot be measured, the straight-through run's losses
    at the same steps decide, and a wrong one still fails; without a straight run, or not exact,
    the check cannot pass."""
    from launcher.checks.resume import check_loss

    after = [s for s in losses if s > resumed_at][:2]
    legs = [
        leg(0, *(step(s, loss=losses[s]) for s in losses if s <= resumed_at)),
        leg(1, {"event": "resume", "from_step": resumed_at}, *(step(s, loss=losses[s]) for s in after)),
    ]
    same = leg(9, *(step(s, loss=v) for s, v in losses.items()))
    passed = check_loss(legs, 1, exact=True, straight=same)
    assert passed.ok and said in passed.detail, passed.detail
    other = leg(9, *(step(s, loss=moved[1] if s == moved[0] else v) for s, v in losses.items()))
    assert not check_loss(legs, 1, exact=True, straight=other).ok
    assert not check_loss(legs, 1, exact=True).ok  # no straight run: the band alone, or nothing
    assert not check_loss(legs, 1, exact=False, straight=same).ok  # not exact: the band alone


def test_a_first_batch_from_further_on_is_a_moved_position_and_an_unknown_one_is_not() -> None:
    """The first batch after the resume is the straight run's batch of a later step: the
    position moved (skipped twice), by how many batches. One found nowhere in the straight run
    (a forward input that is not data, e.g. a recurrent state) is not called a data bug here."""
    from launcher.checks.data import check_batches

    straight = leg(9, *(step(s, batch_hash=f"h{s}") for s in range(1, 9)))
    first = leg(0, *(step(s, batch_hash=f"h{s}") for s in range(1, 4)))
    skipped = leg(1, {"event": "resume", "from_step": 3}, step(4, batch_hash="h6"), step(5, batch_hash="h7"))
    moved = check_batches([first, skipped], 1, straight)
    assert not moved.ok and "but its batch of step 6: +2 batches" in moved.detail, moved.detail
    other = leg(1, {"event": "resume", "from_step": 3}, step(4, batch_hash="zz"), step(5, batch_hash="h5"))
    assert check_batches([first, other], 1, straight).ok

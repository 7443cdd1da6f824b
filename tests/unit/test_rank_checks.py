"""Every rank proved (launcher.checks.ranks), on event logs written here: two ranks, 64 samples,
4 a rank a step over 8 steps, a leg stopped at step 4 and resumed. Each count (seen twice, never
seen, out of order, one sample trained by two ranks in a step) and each named cause (another
rank's RNG, a rank's RNG not restored, a rank's optimizer steps, a rank inside an accumulation
window) answered no, each control yes, and None where there is one rank or no straight run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from launcher.checks.evidence import Kind, LegEvents
from launcher.checks.ranks import check_accumulation_every_rank, check_rank_state, check_samples

RANKS, PER, STEPS = 2, 4, 8


def rows(rank: int, step: int) -> list[str]:
    """The samples rank `rank` trains at `step` in the straight run (a DistributedSampler's split)."""
    return [f"s{(step - 1) * RANKS * PER + rank * PER + k:02d}" for k in range(PER)]


def step_event(rank: int, step: int, opt: int, **over: Any) -> dict[str, Any]:
    e = {"event": "step", "rank": rank, "step": step, "loss": 1.0 / step, "lr": 0.1, "opt_steps": opt}
    e |= {"rows": rows(rank, step), "batch_hash": f"b{rank}-{step}", "rng_in": f"rng{rank}-{step}"}
    return e | over


Plant = Callable[[int, int], dict[str, Any]]


def leg(n: int, first: int, last: int, resume: int | None = None, plant: Plant | None = None) -> LegEvents:
    events: list[dict[str, Any]] = []
    for r in range(RANKS):
        if resume is not None:
            events.append({"event": "resume", "rank": r, "from_step": resume})
        for s in range(first, last + 1):
            events.append(step_event(r, s, s - first + 1, **(plant(r, s) if plant else {})))
    return LegEvents(n, Path(f"leg-{n}.log"), [(i + 1, {"t": 0.0, **e}) for i, e in enumerate(events)])


def straight() -> LegEvents:
    return leg(9, 1, STEPS)


def run(plant: Plant | None = None) -> list[LegEvents]:
    """Leg 0 trains 1..5 and is lost after its checkpoint at 4; leg 1 resumes at 4 and trains 5..8."""
    return [leg(0, 1, 5), leg(1, 5, STEPS, resume=4, plant=plant)]


def test_an_exact_resume_on_two_ranks_passes_with_its_counts() -> None:
    c = check_samples(run(), straight())
    assert c is not None and c.ok and c.kind == Kind.RANK_SAMPLES, c
    assert "(rank 0: 32, rank 1: 32): 0 seen twice, 0 never seen, 0 out of order" in c.detail
    assert c.facts["unit"] == "samples" and c.facts["across"]["of"] == 64
    state = check_rank_state(run(), straight(), exact=True)
    assert state is not None and state.ok and state.kind == Kind.RANK_STATE, state
    assert "2 resumes of a rank" in state.detail and "8 resumed steps of a rank" in state.detail


def test_a_rank_that_starts_its_shard_over_is_counted_seen_twice_and_never_seen() -> None:
    c = check_samples(run(lambda r, s: {"rows": rows(r, s - 4)} if r == 1 else {}), straight())
    assert c is not None and not c.ok, c
    assert c.detail.startswith("rank 1: 16 samples seen twice, 16 never seen, 0 out of order of 32"), c.detail
    assert "across the ranks: 16 samples seen twice, 16 never seen, 0 out of order of 64" in c.detail
    assert "first difference: rank 1, step 5 (leg 1)" in c.detail
    assert (c.facts["rank"], c.facts["step"], c.facts["leg"]) == (1, 5, 1)
    assert c.facts["per_rank"][0] == {"twice": 0, "never": 0, "order": 0, "other": 0, "of": 32}


def test_samples_trained_at_other_steps_are_out_of_order() -> None:
    c = check_samples(run(lambda r, s: {"rows": rows(r, 13 - s)} if r == 1 else {}), straight())
    assert c is not None and not c.ok, c
    assert c.detail.startswith("rank 1: 0 samples seen twice, 0 never seen, 16 out of order of 32"), c.detail


def test_two_ranks_training_one_sample_in_a_step_is_named() -> None:
    c = check_samples(run(lambda r, s: {"rows": rows(0, s)} if r == 1 else {}), straight())
    assert c is not None and not c.ok, c
    assert "rank 1: 0 samples seen twice, 16 never seen, 0 out of order, 16 the straight run" in c.detail
    assert "ranks 0 and 1 both trained 4 of the same samples at step 5 (16 in all" in c.detail
    assert "across the ranks: 16 samples seen twice, 16 never seen" in c.detail


def test_a_padded_last_batch_the_straight_run_shares_too_is_no_finding() -> None:
    """A DistributedSampler pads the last batch with samples another rank trains: both runs do."""

    def pad(r: int, s: int) -> dict[str, Any]:
        return {"rows": rows(0, s)} if (r, s) == (1, STEPS) else {}

    ref = leg(9, 1, STEPS, plant=pad)
    c = check_samples(run(pad), ref)
    assert c is not None and c.ok and "4 trained by two ranks in one step, as in the straight run" in c.detail, c


def test_without_row_digests_the_batch_hashes_are_counted() -> None:
    def bare(legs: list[LegEvents]) -> list[LegEvents]:
        return [
            LegEvents(ev.leg, ev.log, [(n, {k: v for k, v in e.items() if k != "rows"}) for n, e in ev.items])
            for ev in legs
        ]

    plant: Plant = lambda r, s: {"batch_hash": f"b{r}-{s - 4}"} if r == 1 else {}  # noqa: E731
    c = check_samples(bare(run(plant)), bare([straight()])[0])
    assert c is not None and not c.ok and c.facts["unit"] == "batches", c
    assert c.detail.startswith("rank 1: 4 batches seen twice, 4 never seen, 0 out of order of 8"), c.detail
    assert check_samples(bare(run()), bare([straight()])[0]).ok  # type: ignore[union-attr]


def test_one_rank_or_no_straight_run_is_left_to_rank_0s_checks() -> None:
    one = [LegEvents(ev.leg, ev.log, [(n, e) for n, e in ev.items if e["rank"] == 0]) for ev in run()]
    assert check_samples(one, LegEvents(9, Path("s"), [(n, e) for n, e in straight().items if e["rank"] == 0])) is None
    assert check_samples(run(), None) is None and check_rank_state(run(), None, exact=True) is None


def test_a_rank_that_resumed_another_ranks_rng_is_named() -> None:
    c = check_rank_state(run(lambda r, s: {"rng_in": "rng0-5"} if (r, s) == (1, 5) else {}), straight(), exact=True)
    assert c is not None and not c.ok and c.kind == Kind.RANK_STATE and c.leg == 1, c
    assert c.detail.startswith("rank 1 resumed rank 0's RNG: its global RNG at step 5"), c.detail
    assert c.facts == {"rank": 1, "ranks": 2, "other": 0}


def test_a_rank_whose_rng_was_not_restored_is_named_only_where_its_loss_left() -> None:
    drawn = {"rng_in": "rng1-fresh"}
    quiet = check_rank_state(run(lambda r, s: drawn if (r, s) == (1, 5) else {}), straight(), exact=True)
    assert quiet is not None and quiet.ok, quiet  # a draw that changed nothing: no false alarm
    c = check_rank_state(
        run(lambda r, s: (drawn if s == 5 else {}) | {"loss": 2.0} if r == 1 else {}), straight(), exact=True
    )
    assert c is not None and not c.ok and "rank 1's global RNG at step 5" in c.detail, c
    assert "where rank 0's is" in c.detail and "its loss left the straight run's at step 5" in c.detail


def test_a_rank_whose_optimizer_steps_differ_is_named() -> None:
    c = check_rank_state(run(lambda r, s: {"opt_steps": s - 5} if r == 1 else {}), straight(), exact=True)
    assert c is not None and not c.ok, c
    assert c.detail.startswith("rank 1 stepped its optimizer 0 times from the resume at step 4 to step 5 (leg 1)")
    assert c.detail.endswith("the straight-through run 1") and c.facts["rank"] == 1
    # compared within a band (not exact), the optimizer steps are not judged
    assert check_rank_state(run(lambda r, s: {"opt_steps": s - 5} if r == 1 else {}), straight(), exact=False).ok  # type: ignore[union-attr]


def test_accumulation_is_judged_on_every_rank() -> None:
    """Rank 1 steps its optimizer at 3 and 7 (rank 0 at 4 and 8): the resume at 4 is inside its window."""

    def windows(rank: int, first: int, last: int) -> dict[int, int]:
        ends = {4, 8} if rank == 0 else {3, 7}
        return {s: sum(1 for e in ends if first <= e <= s) for s in range(first, last + 1)}

    def plant(first: int, last: int) -> Plant:
        return lambda r, s: {"opt_steps": windows(r, first, last)[s]}

    legs = [leg(0, 1, 5, plant=plant(1, 5)), leg(1, 5, STEPS, resume=4, plant=plant(5, STEPS))]
    c = check_accumulation_every_rank(legs, None, exact=False)
    assert c is not None and not c.ok and c.kind == Kind.ACCUMULATION and c.facts["rank"] == 1, c
    assert c.detail.startswith("rank 1: resumed at micro-step 4 inside an accumulation window"), c.detail


def test_accumulation_inside_the_window_on_every_rank_names_every_rank() -> None:
    """The loop accumulates alike on both ranks, stepping at 3 and 7: the resume at 4 is inside the
    window on both, and the answer names both (rank 0's alone named none)."""

    def plant(first: int) -> Plant:
        return lambda r, s: {"opt_steps": sum(1 for e in (3, 7) if first <= e <= s)}

    legs = [leg(0, 1, 5, plant=plant(1)), leg(1, 5, STEPS, resume=4, plant=plant(5))]
    c = check_accumulation_every_rank(legs, None, exact=False)
    assert c is not None and not c.ok and c.kind == Kind.ACCUMULATION, c
    assert c.detail.startswith("ranks 0 and 1: resumed at micro-step 4 inside an accumulation window"), c.detail
    assert (c.facts["rank"], c.facts["ranks_inside"]) == (0, [0, 1])


def test_fed_inputs_print_a_digest_per_sample_within_the_caps() -> None:
    """runtime.session.samples: one digest a row of the fed tensors (a sample), the same row the
    same digest wherever it sits in the batch, every micro-batch's in order; none past the caps."""
    import torch

    from runtime.session.batches import FedInputs
    from runtime.session.samples import ROW_CAP

    model, fed = torch.nn.Linear(3, 1), FedInputs()
    fed.watch(model)
    x = torch.arange(12.0).reshape(4, 3)
    model(x)
    model(x[[3, 2]])  # a second micro-batch of the same step
    rows = fed.step_fields()["rows"]
    assert len(rows) == 6 and len(set(rows)) == 4 and rows[4:] == [rows[3], rows[2]] and len(rows[0]) == 12
    model(torch.zeros(ROW_CAP + 1, 3))
    out = fed.step_fields()
    assert "rows" not in out and "batch_hash" in out
    fed.close()


def test_a_rank_that_resumed_into_another_epoch_is_named() -> None:
    ref = leg(9, 1, STEPS, plant=lambda r, s: {"epoch": s // 5})
    c = check_rank_state(run(lambda r, s: {"epoch": s // 5 + (r == 1)}), ref, exact=True)
    assert c is not None and not c.ok and c.facts["rank"] == 1, c
    assert (
        c.detail == "rank 1 trained step 5 (leg 1, resumed at step 4) in epoch 2, the straight-through run in epoch 1"
    )


def test_inputs_copied_from_a_gpu_are_hashed_into_rows_at_take() -> None:
    """The CUDA branch (no GPU here): a forward's host copies, queued with the copy's event, hashed
    in `take()` as a CPU forward's are: the same batch hash, the same row digests."""
    import torch

    from runtime.session.batches import FedInputs, _tensors

    class Done:
        def synchronize(self) -> None:
            pass

    x = torch.arange(12.0).reshape(4, 3)
    model, cpu = torch.nn.Linear(3, 1), FedInputs()
    cpu.watch(model)
    model(x)
    want = cpu.step_fields()
    cpu.close()
    gpu = FedInputs()
    gpu.parts.append(("host", list(_tensors({"input": x})), [], Done()))
    got = gpu.step_fields()
    assert got["rows"] == want["rows"] and got["batch_hash"] == want["batch_hash"], (got, want)

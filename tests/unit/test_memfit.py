"""Will it fit (launcher.checks.memfit): a prediction plus its allowance against a GPU's memory."""

from __future__ import annotations

from launcher.checks.memfit import GIB, MIB, allowance, fits, gpu_memory


def _rank(peak: int, world: int = 1, ddp: bool = False, rank: int = 0) -> dict:
    cats = {"parameters": peak // 4, "gradients": peak // 4, "optimizer": peak // 2}
    return {"rank": rank, "world_size": world, "peak_bytes": peak, "categories": cats, "ddp": ddp}


def test_the_allowance_names_each_part_and_grows_with_the_world() -> None:
    one = allowance(10 * GIB, 1)
    assert one.parts == {"CUDA context": 512 * MIB, "allocator reserve 10%": GIB}
    two = allowance(10 * GIB, 2, margin=0.05)
    assert two.parts["NCCL buffers"] == 256 * MIB
    assert two.parts["largest GPU error so far 5%"] == GIB // 2
    assert two.total == sum(two.parts.values()) > one.total


def test_a_rank_past_the_card_does_not_fit_and_the_line_says_by_how_much() -> None:
    assert gpu_memory("t4") == 15360 * MIB and gpu_memory("A100-80GB") == 81920 * MIB
    assert gpu_memory("T44") is None
    small, big = fits("T4", [_rank(4 * GIB), _rank(14 * GIB, rank=1)])
    assert small.fits is True and big.fits is False  # 14 GiB + 0.5 + 1.4 > 15 GiB
    line = big.line()
    assert line.startswith("the one rank: predicted peak 14.00 GiB (optimizer 7.00 GiB, parameters 3.50 GiB, ")
    assert line.endswith("against T4's 15.00 GiB: does not fit")
    (unknown,) = fits("X9", [_rank(GIB)])
    assert unknown.fits is None and "cannot be judged" in unknown.line()


def test_ddp_and_fsdp_ranks_get_the_same_allowance_for_the_same_peak() -> None:
    """The prediction holds DDP's buckets itself (its reducer's allocations run under fake mode);
    the "extra copy" CPU runs once showed was the profiler missing frees made on gloo's thread."""
    (ddp,) = fits("T4", [_rank(8 * GIB, world=2, ddp=True)])
    (fsdp,) = fits("T4", [_rank(8 * GIB, world=2, ddp=False)])
    assert ddp.allowance == fsdp.allowance and ddp.needed == fsdp.needed
    (grown,) = fits("T4", [_rank(8 * GIB, world=2)], margin=0.25)
    assert grown.needed - fsdp.needed == 2 * GIB  # the project's largest GPU error, a quarter of 8 GiB


def test_micro_batch_headroom_takes_the_largest_multiple_every_rank_fits() -> None:
    from launcher.ops.headroom import _micro_batch

    def rank(r: int, scaled: dict[int, int]) -> dict:
        return {
            "rank": r,
            "world_size": 2,
            "optimizer_steps": 2,
            "backwards": 16,
            "scaled_peaks": {str(k): v for k, v in scaled.items()},
        }

    # 8 micro-batches a step; rank 1 fits twice and four times the micro-batch on a T4, not eight times
    ranks = [rank(0, {2: 3 * GIB, 4: 5 * GIB, 8: 9 * GIB}), rank(1, {2: 4 * GIB, 4: 9 * GIB, 8: 14 * GIB})]
    said = _micro_batch(ranks, "T4", 0.0)
    assert said is not None and (said["accumulation"], said["multiple"], said["peak"]) == (8, 4, 9 * GIB)
    assert "4x the micro-batch and 2 accumulation step(s)" in said["line"]
    tight = _micro_batch([rank(0, {2: 14 * GIB})], "T4", 0.0)
    assert tight is not None and tight["multiple"] is None and tight["line"].endswith("the accumulation is needed")
    assert _micro_batch([rank(0, {2: GIB})], "X9", 0.0) is None  # a card with no listed memory: no statement

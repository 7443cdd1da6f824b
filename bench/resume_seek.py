"""Resume to a late data position: O(1) seek vs iterate-and-discard, side by side, in one run.

Same corpus, same DataOrder (the reference trainer's defaults: block 64,
batch 8, seed 1337), target step 100,000, two ways:

- seek (ours): `DataOrder.check_cursor` on the cursor saved at that step
  (recomputes the hash of the batch there, refuses on mismatch), then
  `batch_at(step)`; median over --repeats;
- iterate-and-discard (baseline): what a dataloader that skips consumed
  batches by iterating does (transformers #11284: 28 h for 660k batches): a
  generator yielding `batch_at(s)` for s = 0, 1, 2, ..., each batch assembled
  and thrown away until the target, then the batch at the target. Measured
  once; if a probe says it would take over --max-baseline-s, only a prefix is
  run and the time is extrapolated linearly (the table says which).

Both must land on the identical batch (np.array_equal), else the seek is no win
(with an extrapolated baseline there is no batch to compare: "not reached").

    .venv/bin/python bench/resume_seek.py [--step 100000] [--tokens 2000000] [--max-baseline-s 60]

Goal: seek >= 1000x faster than the baseline and under 10 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

from runtime.reference.cursor import DataOrder  # noqa: E402
from runtime.reference.data import make_corpus, open_tokens  # noqa: E402

Batch = tuple[np.ndarray, np.ndarray, int]


def seek(order: DataOrder, tokens: np.ndarray, cursor: dict) -> Batch:
    order.check_cursor(tokens, cursor)
    return order.batch_at(tokens, cursor["next_step"])


def batches(order: DataOrder, tokens: np.ndarray) -> Iterator[Batch]:
    step = 0
    while True:
        yield order.batch_at(tokens, step)
        step += 1


def iterate_to(order: DataOrder, tokens: np.ndarray, target: int) -> tuple[Batch, float]:
    """Consume and discard `target` batches, return the next one and the seconds it took."""
    began = time.perf_counter()
    it = batches(order, tokens)
    for _ in range(target):
        next(it)
    batch = next(it)
    return batch, time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--step", type=int, default=100_000)
    p.add_argument("--tokens", type=int, default=2_000_000)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--max-baseline-s", type=float, default=60.0)
    ns = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.bin"
        make_corpus(path, ns.tokens, ns.seed)
        tokens = open_tokens(path)
        order = DataOrder(int(tokens.size), ns.block, ns.batch, ns.seed)
        cursor = order.cursor(tokens, ns.step)  # what the checkpoint at this step saved

        seek_times = []
        for _ in range(ns.repeats):
            began = time.perf_counter()
            sought = seek(order, tokens, cursor)
            seek_times.append(time.perf_counter() - began)
        seek_s = statistics.median(seek_times)

        # Probe the per-batch cost; run the whole baseline if it fits the budget.
        probe = min(ns.step, 2_000)
        _, probe_s = iterate_to(order, tokens, probe)
        projected = probe_s / (probe + 1) * (ns.step + 1)
        if projected <= ns.max_baseline_s:
            iterated, base_s = iterate_to(order, tokens, ns.step)
            base_step = ns.step
            how = f"measured ({ns.step + 1:,} batches)"
        else:
            prefix = max(probe, int(ns.max_baseline_s / 2 / projected * ns.step))
            _, prefix_s = iterate_to(order, tokens, prefix)
            base_s = prefix_s / (prefix + 1) * (ns.step + 1)
            base_step = prefix
            iterated = None  # the baseline never reached the target: nothing to compare
            how = f"extrapolated from {prefix + 1:,} batches"

        same: bool | str = "not reached"
        if iterated is not None:
            same = all(np.array_equal(a, b) for a, b in zip(sought[:2], iterated[:2])) and sought[2] == iterated[2]
        reached = f"{iterated[2]:,}" if iterated is not None else "-"
        epoch = cursor["epoch"]
        print(
            f"corpus {ns.tokens:,} tokens, block {ns.block}, batch {ns.batch}, seed {ns.seed}: "
            f"{order.n_samples:,} samples/epoch; step {ns.step:,} = sample index {sought[2]:,} (epoch {epoch})"
        )
        print()
        print("| method | seconds | how | step reached | sample index | same batch |")
        print("|---|---|---|---|---|---|")
        print(
            f"| seek: check_cursor + batch_at (ours) | {seek_s:.6f} | median of {ns.repeats} | "
            f"{ns.step:,} | {sought[2]:,} | {same} |"
        )
        print(f"| iterate-and-discard (baseline) | {base_s:.3f} | {how} | {base_step:,} | {reached} | {same} |")
        print(f"| ratio baseline/seek | {base_s / seek_s:,.0f}x | goal >= 1000x, seek < 10 ms | | | |")


if __name__ == "__main__":
    main()

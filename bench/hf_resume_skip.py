"""Resume at step 10,000 of an epoch: transformers' own skip vs the session's seek, one run.

Run it with the interpreter that has transformers (`make test` builds .venv-hf):

    .venv-hf/bin/python bench/hf_resume_skip.py [--skip 10000] [--samples 100000]

A map-style dataset of token-id rows, batch 8, a shuffled order, resumed 10,000
batches into the epoch, three ways, each timed to its first batch:
- iterate-and-discard: what a loader with no skip support does (load every consumed batch);
- transformers: `Trainer` resumes mid-epoch through accelerate's `skip_first_batches`,
  which for a map-style dataset skips *indices* through the batch sampler (no data is
  loaded for skipped batches, but every skipped index is still drawn);
- session: `runtime.session.EpochLoader` with its saved position: the epoch's
  permutation sliced at the position, then the first batch.
Each must land on the batch its own uninterrupted order has at that position.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402
from accelerate import skip_first_batches  # noqa: E402

from runtime.session import EpochLoader  # noqa: E402


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 50_000, (n, 64), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i]}


def timed(fn, repeats: int = 3) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", type=int, default=10_000)
    p.add_argument("--samples", type=int, default=100_000)
    a = p.parse_args()
    ds = Rows(a.samples)

    def loader() -> torch.utils.data.DataLoader:
        sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler, drop_last=True)

    def iterate() -> torch.Tensor:
        it = iter(loader())
        for _ in range(a.skip):
            next(it)
        return next(it)["input_ids"]

    def hf() -> torch.Tensor:
        return next(iter(skip_first_batches(loader(), a.skip)))["input_ids"]

    def seek() -> torch.Tensor:
        el = EpochLoader(ds, batch_size=8, seed=1)
        el.consumed = a.skip
        return next(iter(el))["input_ids"]

    def seek_reference() -> torch.Tensor:
        el = EpochLoader(ds, batch_size=8, seed=1)
        it = iter(el)
        for _ in range(a.skip):
            next(it)
        return next(it)["input_ids"]

    t_iter, b_iter = timed(iterate, 1)
    t_hf, b_hf = timed(hf)
    t_seek, b_seek = timed(seek)
    same_hf = torch.equal(b_hf, b_iter)
    same_seek = torch.equal(b_seek, seek_reference())
    print(f"resume {a.skip:,} batches (batch 8) into an epoch of {a.samples:,} samples; torch {torch.__version__}")
    print(f"{'way':<40}{'to first batch':>16}{'right batch':>14}")
    print(f"{'iterate and discard (load everything)':<40}{t_iter * 1e3:>13.1f} ms{'yes':>14}")
    print(f"{'transformers (accelerate skip, indices)':<40}{t_hf * 1e3:>13.1f} ms{('yes' if same_hf else 'NO'):>14}")
    print(f"{'session (EpochLoader seek)':<40}{t_seek * 1e3:>13.1f} ms{('yes' if same_seek else 'NO'):>14}")
    print(f"seek vs transformers: {t_hf / t_seek:.1f}x; vs iterate-and-discard: {t_iter / t_seek:.0f}x")
    return 0 if same_hf and same_seek else 1


if __name__ == "__main__":
    sys.exit(main())

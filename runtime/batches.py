"""What a step read, measured by the session itself, and a loader that seeks.

`batch_digest` hashes a batch's content (its tensors' bytes, shapes and dtypes):
the launcher's data checks rest on that hash, not on the index a trainer prints.
A batch up to `FULL_HASH_BYTES` is hashed whole; a larger one is hashed in
`SAMPLED_WINDOWS` evenly spaced windows plus its shape (hashing a 150 MB image
batch whole would cost more than the step: bench/session_overhead.py).

`EpochLoader` is the loader a plain loop needs to resume exactly: a shuffled
order that is a pure function of (seed, epoch), a position counted in batches
the loop consumed (not batches a worker prefetched), and a resume that seeks
by skipping *indices*, never by loading and dropping consumed batches.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import numpy as np
import torch

from runtime.leg import ResumeRefused

FULL_HASH_BYTES = 4 << 20
SAMPLED_WINDOWS = 64
WINDOW_BYTES = 64 << 10


def _tensors(batch: Any) -> Iterator[tuple[str, Any]]:
    """(path, array-like) for every tensor/array in a batch, in a stable order."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        yield "", batch
    elif isinstance(batch, dict):
        for key in sorted(batch, key=str):
            for path, t in _tensors(batch[key]):
                yield f"{key}/{path}", t
    elif isinstance(batch, (list, tuple)):
        for i, item in enumerate(batch):
            for path, t in _tensors(item):
                yield f"{i}/{path}", t


def _bytes_of(t: Any) -> memoryview:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: hash the raw 16-bit words
            t = t.view(torch.int16)
        t = t.numpy()
    return memoryview(np.ascontiguousarray(t)).cast("B")


def batch_digest(batch: Any) -> str | None:
    """sha256 (hex, 32 chars) of the batch's tensors; None when it holds none.

    Pass the batch as read from the data (before `.to(device)` when you can: a
    batch already on a GPU is copied back to hash it)."""
    digest = hashlib.sha256()
    found = False
    for path, t in _tensors(batch):
        found = True
        raw = _bytes_of(t)
        digest.update(f"{path}|{getattr(t, 'dtype', '')}|{tuple(t.shape)}|".encode())
        if raw.nbytes <= FULL_HASH_BYTES:
            digest.update(raw)
        else:
            stride = (raw.nbytes - WINDOW_BYTES) // (SAMPLED_WINDOWS - 1)
            for i in range(SAMPLED_WINDOWS):
                digest.update(raw[i * stride:i * stride + WINDOW_BYTES])
    return digest.hexdigest()[:32] if found else None


class _Order(torch.utils.data.Sampler):
    """Indices of one epoch from position `start` on: a permutation drawn from (seed, epoch)."""

    def __init__(self, n: int, seed: int, epoch: int, start: int, shuffle: bool) -> None:
        self.n, self.seed, self.epoch, self.start, self.shuffle = n, seed, epoch, start, shuffle

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start:])

    def __len__(self) -> int:
        return self.n - self.start


class EpochLoader:
    """A DataLoader per epoch whose order and position survive a restart.

        loader = EpochLoader(dataset, batch_size=32, seed=0, shuffle=True)
        sess.track(loader=loader)            # saved and restored with the checkpoint
        for epoch in loader.epochs(n_epochs):
            for x, y in loader:              # resumes mid-epoch at the next unread batch
                ...

    Its state is (epoch, batches of it trained on: one per `Session.step`); a resume skips the consumed
    samples' indices (cheap) instead of loading them. `drop_last` is always on:
    every batch of an epoch has the same size, so a position is a batch count.
    Keyword arguments go to `torch.utils.data.DataLoader` (num_workers, collate_fn...)."""

    def __init__(self, dataset: Any, batch_size: int, seed: int = 0, shuffle: bool = True, **loader_kw: Any) -> None:
        self.dataset, self.batch_size, self.seed, self.shuffle = dataset, batch_size, seed, shuffle
        self.loader_kw = loader_kw
        self.epoch = 0
        self.consumed = 0  # batches of this epoch the loop has taken

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def epochs(self, n: int) -> Iterator[int]:
        """Epoch numbers from the restored one up to `n` (exclusive)."""
        while self.epoch < n:
            yield self.epoch
            self.epoch, self.consumed = self.epoch + 1, 0

    def __iter__(self) -> Iterator[Any]:
        sampler = _Order(len(self.dataset), self.seed, self.epoch, self.consumed * self.batch_size, self.shuffle)
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler,
                                             drop_last=True, **self.loader_kw)
        yield from loader  # the position moves in on_step: a batch fetched and then not trained is not consumed

    def on_step(self) -> None:
        """The session calls this after each step: one more batch of this epoch trained on.
        (Counting batches *yielded* instead is the classic off-by-one: a loop that checks
        whether to stop after fetching the next batch would save a position one batch
        ahead, and the resumed leg would skip it -- the straight-through run shows it.)"""
        self.consumed += 1

    @property
    def sample_index(self) -> int:
        """Samples consumed since the first epoch began: the loader's own position."""
        return (self.epoch * len(self) + self.consumed) * self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "batch_size": self.batch_size, "n": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, mine in (("seed", self.seed), ("batch_size", self.batch_size), ("n", len(self.dataset))):
            if state.get(key) != mine:
                raise ResumeRefused("cursor_mismatch", f"the loader was saved with {key}={state.get(key)!r}, "
                                    f"this run has {mine!r}")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    def resume_facts(self) -> dict[str, int]:
        return {"sample_index": self.sample_index, "epoch": self.epoch}

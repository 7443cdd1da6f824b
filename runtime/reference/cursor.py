"""Exact data position: the order is a pure function of (seed, epoch), so a
resume seeks in O(1) instead of replaying consumed batches.

Sample `g` (a global index that only grows) lives in epoch g // n and is the
window `permute(g % n)` of the token file, where `permute` is a seeded affine
bijection of range(n) chosen per epoch. The cursor saved with a checkpoint
records the next sample index and the sha256 of the batch there; a resume
recomputes that hash and refuses on mismatch instead of training on other data.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from runtime.session.rules import ResumeRefused

CURSOR_VERSION = 1


class CursorMismatch(RuntimeError):
    """The saved cursor does not describe this data/batch geometry."""


def _affine(n: int, seed: int, epoch: int) -> tuple[int, int]:
    rng = random.Random(seed * 1_000_003 + epoch)
    while True:
        a = rng.randrange(1, max(2, n))
        if math.gcd(a, n) == 1:
            return a, rng.randrange(0, n)


@dataclass(frozen=True)
class DataOrder:
    """Which token window each global sample index reads.

    A step consumes `batch * world_size` consecutive global sample indices;
    rank r reads the r-th slice of `batch` of them. The saved cursor records
    the world size it assumed, and a resume under another one is refused
    rather than silently re-slicing (and re-reading or skipping) data."""

    n_tokens: int
    block: int
    batch: int
    seed: int
    world_size: int = 1

    @property
    def n_samples(self) -> int:
        return (self.n_tokens - 1) // self.block

    def sample_window(self, g: int) -> int:
        n = self.n_samples
        a, b = _affine(n, self.seed, g // n)
        return (a * (g % n) + b) % n

    @property
    def global_batch(self) -> int:
        return self.batch * self.world_size

    def first_sample(self, step: int, rank: int = 0) -> int:
        return step * self.global_batch + rank * self.batch

    def batch_at(self, tokens: np.ndarray, step: int, rank: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
        """(x, y, first sample index) of rank `rank`'s slice of the batch at `step`: O(batch), any step."""
        first = self.first_sample(step, rank)
        rows = [self.sample_window(g) * self.block for g in range(first, first + self.batch)]
        x = np.stack([tokens[r : r + self.block] for r in rows]).astype(np.int64)
        y = np.stack([tokens[r + 1 : r + 1 + self.block] for r in rows]).astype(np.int64)
        return x, y, first

    def batch_hash(self, tokens: np.ndarray, step: int) -> str:
        """sha256 of the token ids of the whole global batch at `step` (every rank computes the same)."""
        digest = hashlib.sha256()
        for rank in range(self.world_size):
            x, _, _ = self.batch_at(tokens, step, rank)
            digest.update(x.astype("<i8").tobytes())
        return digest.hexdigest()

    def cursor(self, tokens: np.ndarray, next_step: int) -> dict[str, Any]:
        """The cursor a checkpoint taken after `next_step` steps records."""
        g = next_step * self.global_batch
        return {
            "version": CURSOR_VERSION,
            **asdict(self),
            "next_step": next_step,
            "sample_index": g,
            "epoch": g // self.n_samples,
            "tokens_consumed": g * self.block,
            "next_batch_sha256": self.batch_hash(tokens, next_step),
        }

    def check_cursor(self, tokens: np.ndarray, saved: dict[str, Any]) -> dict[str, Any]:
        """Refuse a cursor saved under other facts, or whose next batch hashes differently."""
        if saved.get("version") != CURSOR_VERSION:
            raise CursorMismatch(f"cursor version {saved.get('version')!r}, expected {CURSOR_VERSION}")
        for key, value in asdict(self).items():
            if saved.get(key) != value:
                raise CursorMismatch(f"cursor was saved with {key}={saved.get(key)!r}, this run has {value!r}")
        now = self.batch_hash(tokens, saved["next_step"])
        if now != saved["next_batch_sha256"]:
            raise CursorMismatch(
                f"batch at sample {saved['sample_index']} hashes {now[:12]}, "
                f"checkpoint recorded {saved['next_batch_sha256'][:12]}"
            )
        return saved


class Position:
    """The reference data's position as an object the session tracks: it saves the
    cursor of the next step and, on resume, re-hashes the batch there and refuses
    a cursor saved under other data or geometry (exit 3, never other data)."""

    def __init__(self, order: DataOrder, tokens: np.ndarray, rank: int = 0) -> None:
        self.order, self.tokens, self.rank, self.next_step = order, tokens, rank, 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(x, y, first sample index) of this rank's slice of the next step's batch."""
        x, y, first = self.order.batch_at(self.tokens, self.next_step, self.rank)
        self.next_step += 1
        return x, y, first

    def state_dict(self) -> dict[str, Any]:
        return self.order.cursor(self.tokens, self.next_step)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        try:
            self.saved = self.order.check_cursor(self.tokens, saved)
        except (CursorMismatch, KeyError, TypeError) as err:
            raise ResumeRefused("cursor_mismatch", str(err)) from None
        self.next_step = int(saved["next_step"])

    def resume_facts(self) -> dict[str, Any]:
        return {
            "sample_index": self.saved["sample_index"],
            "batch_hash": self.saved["next_batch_sha256"],
            "epoch": self.saved["epoch"],
            "tokens_consumed": self.saved["tokens_consumed"],
            "rank_sample_index": self.order.first_sample(self.next_step, self.rank),
        }

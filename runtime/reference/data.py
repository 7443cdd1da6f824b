"""Deterministic training data the project makes itself (no download at run time).

A synthetic "language": a seeded vocabulary of words (byte strings), drawn with
Zipf-like frequencies and a seeded word-to-word preference, so there is
structure to learn and loss falls visibly within a few dozen steps. Stored as a
flat uint16 token file and read through a memory map, so assembling a batch
never copies the corpus.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.hashing import sha256_file

VOCAB = 256  # byte-level tokens
DTYPE = np.uint16


def make_corpus(path: Path, n_tokens: int, seed: int = 0) -> str:
    """Write `n_tokens` tokens to `path` (deterministic in seed); return its sha256."""
    rng = np.random.default_rng(seed)
    n_words = 512
    letters = np.arange(ord("a"), ord("z") + 1)
    words = [rng.choice(letters, size=int(rng.integers(2, 8))).astype(DTYPE) for _ in range(n_words)]
    # Each word prefers a few successors: a first-order chain over words.
    successors = rng.integers(0, n_words, size=(n_words, 4))
    n_draw = n_tokens // 3 + 16
    pick = rng.integers(0, 4, size=n_draw)
    jump = rng.random(n_draw) < 0.1
    fresh = rng.zipf(1.3, size=n_draw) % n_words
    seq = np.empty(n_draw, dtype=np.int64)
    prev = 0
    for i in range(n_draw):  # 1-2 ms per 10k words; corpora here are small
        prev = int(fresh[i]) if jump[i] else int(successors[prev, pick[i]])
        seq[i] = prev
    space = np.array([ord(" ")], dtype=DTYPE)
    pieces = [np.concatenate((words[w], space)) for w in seq]
    tokens = np.concatenate(pieces)[:n_tokens]
    if tokens.size < n_tokens:
        raise ValueError("corpus generator produced too few tokens")
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens.astype(DTYPE).tofile(path)
    return sha256_file(path)


def open_tokens(path: Path) -> np.memmap:
    """The token file as a read-only memory map."""
    return np.memmap(path, dtype=DTYPE, mode="r")

"""Files above the Hub store's `max_file_bytes`, stored in parts (the Hub refuses a file
above 50 GB and advises under 20).

A file P of S > M bytes is stored as `P.part00000`, `P.part00001`, ... of M bytes each,
the last the rest. `hub-parts.json` ({"part_bytes": M, "files": {P: n}}) goes in the
same commit as the manifest (the last one), so the checkpoint still exists only once
whole. Files of at most M bytes are stored as they are, and a checkpoint with none
above it has no index. A push refuses a checkpoint that names a file `hub-parts.json`,
or one whose name is a split file's part name: readers take both as the store's own.

The index is untrusted input: bounded in size, every type checked, each count at
least 2 and at most MAX_PARTS, part names derived here by rule (never read from the
JSON), and `fetch` also requires n == ceil(manifest size / M). The parts' sizes must
add up (every part but the last exactly M) or the file reports a size no manifest
can match; a split file has no whole-file hash, so the verifier reads windows.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from runtime.store.base import MAX_FILE_BYTES, MAX_FILES, CheckpointDamaged, StoreError, parse_small_json, safe_relpath

PARTS_INDEX = "hub-parts.json"
MAX_PARTS = 10_000
"""Parts of one file at most (a 19 GB part size stores 190 TB so)."""
MAX_INDEX_BYTES = 1 << 20


def part_name(path: str, index: int) -> str:
    return f"{path}.part{index:05d}"


def count_parts(size: int, part_bytes: int) -> int:
    return -(-size // part_bytes)


@dataclass(frozen=True)
class PartsIndex:
    """Which files of a checkpoint are stored in parts, and how many of `part_bytes` each."""

    part_bytes: int
    files: dict[str, int]

    def parts(self, path: str) -> list[str]:
        return [part_name(path, i) for i in range(self.files[path])]

    def part_sizes(self, path: str, size: int) -> list[int]:
        """Each part's size for a file of `size` bytes."""
        n = self.files[path]
        return [self.part_bytes] * (n - 1) + [size - (n - 1) * self.part_bytes]

    def to_json(self) -> bytes:
        import json

        return json.dumps({"part_bytes": self.part_bytes, "files": self.files}, indent=1, sort_keys=True).encode()

    def spans(self, path: str, start: int, length: int) -> list[tuple[str, int, int]]:
        """Bytes [start, start+length) of `path` as (part, offset in it, length) pieces."""
        out, end = [], start + length
        while start < end:
            index, offset = divmod(start, self.part_bytes)
            if index >= self.files[path]:
                raise StoreError(f"{path}: bytes from {start} lie past its {self.files[path]} parts")
            take = min(end - start, self.part_bytes - offset)
            out.append((part_name(path, index), offset, take))
            start += take
        return out

    def check_against(self, sizes: dict[str, int], what: str) -> None:
        """Against the manifest (path -> size): each split file is in it with the right count,
        and no part name is one of its files."""
        for path, n in self.files.items():
            if path not in sizes:
                raise CheckpointDamaged(f"{what} names {path[:80]!r}, which the manifest does not list")
            if n != count_parts(sizes[path], self.part_bytes):
                raise CheckpointDamaged(
                    f"{what}: {path} in {n} parts of {self.part_bytes} bytes, but the manifest says {sizes[path]} bytes"
                )
            if any(p in sizes for p in self.parts(path)):
                raise CheckpointDamaged(f"{what}: a part name of {path} is a file of the checkpoint")


def plan(sizes: dict[str, int], part_bytes: int) -> PartsIndex | None:
    """How a checkpoint of these files (path -> size) is stored; None when no file is split."""
    if PARTS_INDEX in sizes:
        raise StoreError(f"{PARTS_INDEX} is a reserved name in a Hub store checkpoint (it indexes split files)")
    files = {p: count_parts(s, part_bytes) for p, s in sizes.items() if s > part_bytes}
    if not files:
        return None
    index = PartsIndex(part_bytes, files)
    for path, n in files.items():
        if n > MAX_PARTS:
            raise StoreError(
                f"{path}: {sizes[path]} bytes would take {n} parts of {part_bytes} bytes (at most "
                f"{MAX_PARTS}): raise hub.max_file_gb"
            )
    index.check_against(sizes, "the Hub store")
    return index


def parse_index(raw: bytes, what: str) -> PartsIndex:
    """An untrusted `hub-parts.json` -> PartsIndex, or CheckpointDamaged naming what is wrong."""
    data: Any = parse_small_json(raw, what)
    if not isinstance(data, dict) or set(data) != {"part_bytes", "files"}:
        raise CheckpointDamaged(f"{what} is not an object of part_bytes and files")
    size, files = data["part_bytes"], data["files"]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_FILE_BYTES:
        raise CheckpointDamaged(f"{what}: part_bytes {str(size)[:40]!r} is not a whole number in [1, {MAX_FILE_BYTES}]")
    if not isinstance(files, dict) or not 1 <= len(files) <= MAX_FILES:
        raise CheckpointDamaged(f"{what}: files must map 1..{MAX_FILES} paths to their number of parts")
    for path, n in files.items():
        safe_relpath(path)
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_PARTS:
            raise CheckpointDamaged(f"{what}: {path[:80]} in {str(n)[:40]!r} parts (a whole number 2..{MAX_PARTS})")
    return PartsIndex(size, dict(files))


def joined_size(sizes: list[int | None], part_bytes: int) -> int | None:
    """A split file's size from its parts' (None: a part missing); -1 when they cannot make one file."""
    if any(s is None for s in sizes):
        return None
    whole = all(s == part_bytes for s in sizes[:-1]) and 1 <= (sizes[-1] or 0) <= part_bytes
    return sum(s or 0 for s in sizes) if whole else -1


def upload_items(sizes: dict[str, int], index: PartsIndex | None) -> list[tuple[str, str, int, int]]:
    """What a push commits: (name in the folder, local file, start, length) -- a whole file or one part."""
    out = []
    for path, size in sizes.items():
        if index is None or path not in index.files:
            out.append((path, path, 0, size))
            continue
        for i, part_size in enumerate(index.part_sizes(path, size)):
            out.append((part_name(path, i), path, i * index.part_bytes, part_size))
    return out


def batches(items: list[Any], tail: list[Any], per: int) -> list[list[Any]]:
    """`items` then `tail` in commits of at most `per` (>= 2), the whole tail in the last."""
    chunks = [(items + tail)[i : i + per] for i in range(0, len(items) + len(tail), per)]
    if len(chunks) > 1 and len(chunks[-1]) < len(tail):  # the tail split over two: move it together
        moved = len(tail) - len(chunks[-1])
        chunks[-1] = chunks[-2][-moved:] + chunks[-1]
        chunks[-2] = chunks[-2][:-moved]
    return chunks


class FileWindow(io.BufferedIOBase):
    """Bytes [start, start+length) of a local file as a read-only, seekable file: one part's
    upload (no fileno, so an HTTP client takes its length from seek, not from the whole file)."""

    def __init__(self, path: Path, start: int, length: int) -> None:
        super().__init__()
        self._fh = open(path, "rb")  # noqa: SIM115 - closed with the window
        self._start, self._length, self._pos = start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._length - self._pos)
        want = left if size is None or size < 0 else min(size, left)
        self._fh.seek(self._start + self._pos)
        data = self._fh.read(want)
        self._pos += len(data)
        return data

    read1 = read

    def close(self) -> None:
        self._fh.close()
        super().close()


def close_windows(ops: Iterable[Any]) -> None:
    """Close the part windows of a commit's operations (after its attempt)."""
    for op in ops:
        window = getattr(op, "path_or_fileobj", None)
        if isinstance(window, FileWindow):
            window.close()

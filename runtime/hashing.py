"""The one file-hashing helper both sides use (torch-free, stdlib only).

Every hash the launcher records or checks (a reviewed file, a lock file, a
config, a report folder, a checkpoint's state file, a corpus) is the SHA-256
of the file's bytes, read in 1 MiB chunks so a multi-GB checkpoint is never
held in memory whole.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative POSIX path -> SHA-256), sorted."""
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def digest_lines(files: dict[str, str], sep: str = " ") -> str:
    """One SHA-256 over `path<sep>sha` lines sorted by path: a folder's digest."""
    return hashlib.sha256("".join(f"{path}{sep}{sha}\n" for path, sha in sorted(files.items())).encode()).hexdigest()

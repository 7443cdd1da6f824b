"""The checkpoint store seam: few methods, errors that say whether to retry.

A checkpoint is a folder `step-<N>` holding its files and `manifest.json`
(file list, sizes, sha256). It exists in the store only once its manifest is
there, written in the same atomic operation as its files; it is *verified*
only once `verified.json` is there, written after a ranged read-back matched.

Errors: `TransientStoreError` when a retry could help (and only those are
retried), `StoreAuthError` for credentials, `FileNotFoundError` when absent.
An empty or missing store lists as [] ("nothing here").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "manifest.json"
VERIFIED = "verified.json"
NAME_RE = re.compile(r"^step-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    """step-00000120: zero-padded so names sort like steps."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    match = NAME_RE.match(name)
    return int(match.group(1)) if match else None


class StoreError(Exception):
    """A store operation failed for a reason a retry will not fix."""


class TransientStoreError(StoreError):
    """A store operation failed for a reason a retry could fix (timeout, 5xx, 429)."""


class StoreAuthError(StoreError):
    """The store refused our credentials (401/403): fix the token, do not retry."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint, as the manifest records it."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds; its presence in the store is the completion marker."""

    name: str
    step: int
    files: tuple[FileEntry, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = 1

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "step": self.step, "meta": self.meta,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Manifest":
        if data.get("version") != 1:
            raise StoreError(f"manifest version {data.get('version')!r} is not supported (expected 1)")
        files = tuple(FileEntry(f["path"], int(f["size"]), f["sha256"]) for f in data["files"])
        return cls(data["name"], int(data["step"]), files, dict(data.get("meta", {})))


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint in the store."""

    name: str
    step: int
    manifest: Manifest
    verified: bool


@dataclass(frozen=True)
class RemoteFile:
    """What the store itself reports for a stored file: its size, and a hash
    where it keeps one (LFS sha256, or the git blob id of a regular file)."""

    size: int
    sha256: str | None = None
    git_oid: str | None = None


class Store(Protocol):
    """Where checkpoints live. Policy (what to verify, prune) lives elsewhere."""

    uri: str

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints (manifest present), oldest first. Empty store -> []."""

    def push(self, local_dir: Path, manifest: Manifest) -> None:
        """Upload the files of `local_dir` plus the manifest, atomically."""

    def remote_files(self, name: str, paths: list[str]) -> dict[str, RemoteFile]:
        """What the store reports for each of `paths` in checkpoint `name`; absent paths are left out."""

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        """Exactly bytes [start, start+length) of a stored file, or raise."""

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        """Record that `name` passed read-back verification."""

    def fetch(self, name: str, dest: Path) -> Path:
        """Download checkpoint `name` into `dest/name`; returns that folder."""

    def delete(self, name: str) -> None:
        """Delete checkpoint `name` (manifest first, so it stops counting at once)."""

"""The checkpoint store seam: few methods, errors that say whether to retry.

A checkpoint is a folder `step-<N>` holding its files and `manifest.json`
(file list, sizes, sha256). It exists in the store only once its manifest is
there, written in the same atomic operation as its files; it is *verified*
only once `verified.json` is there, written after a ranged read-back matched.

Errors: `TransientStoreError` when a retry could help (and only those are
retried), `StoreAuthError` for credentials, `FileNotFoundError` when absent,
`CheckpointDamaged` when what the store holds is not what a checkpoint may be.
An empty or missing store lists as [] ("nothing here").

Everything read from a store is untrusted input: a manifest is parsed into
`Manifest` only if every path is relative, normalised and inside its folder,
every size is a bounded whole number and every hash is a sha256; a listing
never dies on one bad checkpoint, it reports it as `Damaged` and goes on.
"""

from __future__ import annotations

import builtins  # builtins.list in signatures below Store.list(), which shadows the name there
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "manifest.json"
VERIFIED = "verified.json"
NAME_RE = re.compile(r"^step-(\d{8,18})$")
# A stored path: relative, '/'-separated, no '.'/'..' component, no odd characters.
PATH_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$|^\.[A-Za-z0-9_][A-Za-z0-9._-]{0,126}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 10_000
MAX_FILE_BYTES = 1 << 44  # 16 TiB: no real checkpoint file is larger
MAX_SMALL_JSON = 1 << 20  # manifest.json / verified.json are read up to this size


def checkpoint_name(step: int) -> str:
    """step-00000120: zero-padded so names sort like steps."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    match = NAME_RE.match(name) if isinstance(name, str) else None
    return int(match.group(1)) if match else None


class StoreError(Exception):
    """A store operation failed for a reason a retry will not fix."""


class TransientStoreError(StoreError):
    """A store operation failed for a reason a retry could fix (timeout, 5xx, 429)."""


class StoreAuthError(StoreError):
    """The store refused our credentials (401/403): fix the token, do not retry."""


class CheckpointDamaged(StoreError):
    """What the store holds for a checkpoint cannot be used: a manifest that does not
    parse or names paths outside its folder, a symlink or special file, bytes that do
    not match the manifest, a verified mark that does not bind. A resume skips it
    and falls back to the next older verified checkpoint."""


def safe_relpath(path: object) -> str:
    """`path` if it is a relative, normalised path inside a checkpoint folder; else raise."""
    if not isinstance(path, str) or not path or len(path) > 1024:
        raise CheckpointDamaged(f"manifest names a bad path {str(path)[:80]!r}")
    parts = path.split("/")
    if not all(PATH_PART.match(p) for p in parts):
        raise CheckpointDamaged(f"manifest path {path[:80]!r} is not a plain relative path inside the checkpoint")
    return path


def _whole(value: object, what: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
        raise CheckpointDamaged(f"manifest {what} {str(value)[:40]!r} is not a whole number in [0, {upper}]")
    return value


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
        return {
            "version": self.version,
            "name": self.name,
            "step": self.step,
            "meta": self.meta,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }

    def digest(self) -> str:
        """sha256 of the manifest's canonical JSON: what a verified mark binds."""
        return hashlib.sha256(canonical_json(self.to_json())).hexdigest()

    @classmethod
    def from_json(cls, data: Any) -> "Manifest":
        """Parse an untrusted manifest; raise CheckpointDamaged naming what is wrong."""
        if not isinstance(data, dict):
            raise CheckpointDamaged(f"manifest is a {type(data).__name__}, not an object")
        if data.get("version") != 1:
            raise CheckpointDamaged(f"manifest version {str(data.get('version'))[:20]!r} is not supported (expected 1)")
        name = data.get("name")
        step = step_of(name) if isinstance(name, str) else None
        if not isinstance(name, str) or step is None or _whole(data.get("step"), "step", 10**18) != step:
            raise CheckpointDamaged(f"manifest name/step {str(name)[:40]!r}/{str(data.get('step'))[:20]!r} disagree")
        raw_files = data.get("files")
        if not isinstance(raw_files, list) or not 1 <= len(raw_files) <= MAX_FILES:
            raise CheckpointDamaged(f"manifest files must be a list of 1..{MAX_FILES} entries")
        files = []
        for f in raw_files:
            if not isinstance(f, dict) or not isinstance(f.get("sha256"), str) or not SHA256_RE.match(f["sha256"]):
                raise CheckpointDamaged("manifest file entry without a sha256 hex digest")
            files.append(
                FileEntry(safe_relpath(f.get("path")), _whole(f.get("size"), "size", MAX_FILE_BYTES), f["sha256"])
            )
        paths = [f.path for f in files]
        folders = {p.rsplit("/", 1)[0] for p in paths if "/" in p}
        folders |= {f.rsplit("/", i)[0] for f in list(folders) for i in range(1, f.count("/") + 1)}
        if MANIFEST in paths or VERIFIED in paths:
            raise CheckpointDamaged("manifest lists its own manifest.json or verified.json as a file")
        if len(set(paths)) != len(paths) or folders & set(paths):
            raise CheckpointDamaged("manifest lists a path twice, or a path both as a file and a folder")
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise CheckpointDamaged("manifest meta is not an object")
        return cls(name, step, tuple(files), dict(meta))


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def parse_small_json(raw: bytes, what: str) -> Any:
    """JSON from a store, bounded in size and depth: damage, never a crash."""
    if len(raw) > MAX_SMALL_JSON:
        raise CheckpointDamaged(f"{what} is larger than {MAX_SMALL_JSON} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointDamaged(f"{what} is not JSON ({type(err).__name__})") from None


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint in the store: its manifest parsed, and whether a verified
    mark that binds this manifest is there (`seal` holds that mark)."""

    name: str
    step: int
    manifest: Manifest
    verified: bool
    seal: dict[str, Any] | None = None


@dataclass(frozen=True)
class Damaged:
    """A checkpoint folder whose contents cannot count: never resumed from, shown as such."""

    name: str
    step: int
    reason: str


@dataclass(frozen=True)
class StoreScan:
    """A listing: the checkpoints that parse (oldest first) and the ones that do not."""

    checkpoints: list[CheckpointInfo]
    damaged: list[Damaged]


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
    key: bytes | None
    """The project's sealing key: verified marks are checked (and written) with it."""

    def scan(self) -> StoreScan:
        """Every checkpoint folder: the ones that parse and the damaged ones."""

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints (manifest present and valid), oldest first. Empty store -> []."""

    def push(self, local_dir: Path, manifest: Manifest) -> None:
        """Upload the files of `local_dir` plus the manifest, atomically."""

    def remote_files(self, name: str, paths: builtins.list[str]) -> dict[str, RemoteFile]:
        """What the store reports for each of `paths` in checkpoint `name`; absent paths are left out."""

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        """Exactly bytes [start, start+length) of a stored file, or raise."""

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        """Record that `name` passed read-back verification."""

    def fetch(self, name: str, dest: Path) -> Path:
        """Download checkpoint `name` into `dest/name`: only the manifest's files, only
        regular files, never more bytes than the manifest declares, each checked
        against its sha256 (CheckpointDamaged otherwise). Returns that folder."""

    def delete(self, name: str) -> None:
        """Delete checkpoint `name` (manifest first, so it stops counting at once)."""

    # A sharded checkpoint written on several nodes (runtime.checkpoint.node_cycle): each node
    # pushes its part, then rank 0 writes the one manifest.

    def push_part(self, local_dir: Path, name: str, paths: builtins.list[str]) -> None:
        """One node's files of checkpoint `name`, staged where nothing lists them."""

    def commit(self, manifest: Manifest) -> None:
        """The staged parts plus the manifest become checkpoint `manifest.name`."""

    def drop_parts(self, name: str) -> None:
        """Whatever an earlier attempt staged for `name`."""


def newest_verified(store: Store) -> CheckpointInfo | None:
    """The checkpoint a resume may use: the newest verified one."""
    verified = [c for c in store.list() if c.verified]
    return verified[-1] if verified else None

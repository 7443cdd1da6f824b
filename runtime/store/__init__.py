"""Checkpoint stores behind one interface (see `base.Store`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from runtime.store.base import (
    CheckpointDamaged,
    CheckpointInfo,
    Damaged,
    FileEntry,
    Manifest,
    RemoteFile,
    Store,
    StoreAuthError,
    StoreError,
    StoreScan,
    TransientStoreError,
    checkpoint_name,
    step_of,
)

__all__ = [
    "CheckpointDamaged",
    "CheckpointInfo",
    "Damaged",
    "FileEntry",
    "Manifest",
    "RemoteFile",
    "Store",
    "StoreAuthError",
    "StoreError",
    "StoreScan",
    "TransientStoreError",
    "checkpoint_name",
    "open_store",
    "step_of",
]

_FROM_ENV = b"from-env"


def local_path(uri: str) -> Path:
    """The folder of a `file:///abs/dir` URI, each component percent-decoded on its own (the
    launcher's `Path.as_uri()` encodes a space as %20). Refused, as ambiguous: another form
    (`file:/x`, `file://host/x`), a query or fragment, and a component that decodes to one
    holding `/` or NUL or to `.` or `..` (`a%2F..%2Fb` is a traversal to the URI reader only)."""
    parsed = urlparse(uri)
    raw = parsed.path.split("/")
    parts = [unquote(part) for part in raw[1:]]
    if not uri.startswith("file:///") or parsed.query or parsed.fragment or parsed.params or "?" in uri:
        raise StoreError(f"unsupported store URI {uri!r} (expected file:///abs/dir)")
    if any("/" in part or "\0" in part or part in (".", "..") for part in parts):
        raise StoreError(f"store URI {uri!r} decodes to a path with '.', '..', '/' or NUL in a component")
    return Path("/", *parts)


def open_store(uri: str, namespace: str = "", key: bytes | None = _FROM_ENV) -> Store:
    """Open the store at `uri`; checkpoints of one run live under `namespace`.

    `key` seals and checks verified marks (runtime.store.seal); by default the
    one the launcher passed the leg in LAUNCHER_STORE_KEY, if any."""
    if key is _FROM_ENV:
        from runtime.store.seal import key_from_env

        key = key_from_env()
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        from runtime.store.local import LocalDirStore

        return LocalDirStore(local_path(uri), namespace, key=key)
    if parsed.scheme == "hf":
        from runtime.store.hub import HubStore
        from runtime.store.hub_limits import limits_from_env

        limits = limits_from_env()  # launcher.yaml `hub:`, passed in LAUNCHER_HUB_*
        return HubStore(
            uri,
            namespace,
            key=key,
            max_file_bytes=limits.max_file_bytes,
            files_per_commit=limits.files_per_commit,
            commits_per_hour=limits.commits_per_hour,
        )
    raise StoreError(f"unsupported store URI {uri!r} (expected file:///abs/dir or hf://owner/repo[@revision])")

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

        return LocalDirStore(Path(unquote(parsed.path)), namespace, key=key)
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

"""Checkpoint stores behind one interface (see `base.Store`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from runtime.store.base import (CheckpointInfo, FileEntry, Manifest, RemoteFile, Store, StoreAuthError,
                                StoreError, TransientStoreError, checkpoint_name, step_of)

__all__ = ["CheckpointInfo", "FileEntry", "Manifest", "RemoteFile", "Store", "StoreAuthError", "StoreError",
           "TransientStoreError", "checkpoint_name", "open_store", "step_of"]


def open_store(uri: str, namespace: str = "") -> Store:
    """Open the store at `uri`; checkpoints of one run live under `namespace`."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        from runtime.store.local import LocalDirStore

        return LocalDirStore(Path(unquote(parsed.path)), namespace)
    if parsed.scheme == "hf":
        from runtime.store.hub import HubStore

        return HubStore(uri, namespace)
    raise StoreError(f"unsupported store URI {uri!r} (expected file:///abs/dir or hf://owner/repo[@revision])")

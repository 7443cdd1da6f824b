"""A checkpoint on the leg's local disk: files + manifest, and loading it back.

The manifest's sha256 of each file is computed from the bytes written, so a
torn or swapped file is refused on load rather than half-restored.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from runtime.store.base import MANIFEST, FileEntry, Manifest, StoreError, checkpoint_name

STATE_FILE = "state.pt"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def save_local(state: dict[str, Any], root: Path, step: int, meta: dict[str, Any]) -> tuple[Path, Manifest]:
    """Write `state` as checkpoint step-<step> under `root`; return its folder and manifest."""
    import torch

    folder = root / checkpoint_name(step)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    torch.save(state, folder / STATE_FILE)
    files = tuple(FileEntry(p.name, p.stat().st_size, _sha256(p)) for p in sorted(folder.iterdir()))
    manifest = Manifest(checkpoint_name(step), step, files, meta)
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True))
    return folder, manifest


def load_local(folder: Path, map_location: str = "cpu") -> tuple[dict[str, Any], Manifest]:
    """Load a fetched checkpoint after checking every file against its manifest."""
    import torch

    manifest = Manifest.from_json(json.loads((folder / MANIFEST).read_text()))
    for entry in manifest.files:
        path = folder / entry.path
        if not path.is_file() or path.stat().st_size != entry.size or _sha256(path) != entry.sha256:
            raise StoreError(f"{manifest.name}/{entry.path} does not match its manifest")
    state = torch.load(folder / STATE_FILE, map_location=map_location, weights_only=False)
    return state, manifest

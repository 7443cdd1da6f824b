"""A checkpoint on the leg's local disk: files + manifest, and loading it back.

The manifest's sha256 of each file is computed from the bytes written, so a
torn or swapped file is refused on load rather than half-restored. Loading
never runs code from the checkpoint: `torch.load(weights_only=True)` accepts
tensors and plain containers only (the state keeps every RNG stream in that
form), so a forged pickle payload is refused as damage, not executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from runtime.store.base import MANIFEST, CheckpointDamaged, FileEntry, Manifest, checkpoint_name
from runtime.store.safeio import open_regular, read_exactly, read_small

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
    return folder, write_manifest(folder, step, meta)


def write_manifest(folder: Path, step: int, meta: dict[str, Any]) -> Manifest:
    """The manifest of every file under `folder` (size and sha256 of the bytes written), written beside them."""
    files = tuple(FileEntry(p.relative_to(folder).as_posix(), p.stat().st_size, _sha256(p))
                  for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST)
    manifest = Manifest(checkpoint_name(step), step, files, meta)
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True))
    return manifest


def load_local(folder: Path, map_location: str = "cpu", seal: dict[str, Any] | None = None,
               fetched: bool = False) -> tuple[dict[str, Any], Manifest]:
    """Load a checkpoint folder after checking every file against its manifest (and,
    given the verified mark, every window the verifier read). `fetched`: the folder
    is what `Store.fetch` just wrote, which already checked every file's size and
    sha256 as it copied, so they are not read and hashed a second time.
    CheckpointDamaged names what is wrong; nothing in the checkpoint can run code."""
    import pickle

    import torch

    from runtime.store.base import parse_small_json
    from runtime.store.seal import check_windows

    manifest = Manifest.from_json(parse_small_json(read_small(folder, MANIFEST), MANIFEST))
    if STATE_FILE not in {f.path for f in manifest.files}:
        raise CheckpointDamaged(f"{manifest.name} has no {STATE_FILE} in its manifest")
    unchecked = () if fetched else manifest.files
    for entry in unchecked:
        fd = open_regular(folder, entry.path)
        try:
            got = read_exactly(fd, entry.size, lambda _: None, f"{manifest.name}/{entry.path}")
        finally:
            os.close(fd)
        if got != entry.sha256:
            raise CheckpointDamaged(f"{manifest.name}/{entry.path} does not match its manifest")
    if seal is not None:
        check_windows(folder, seal)
    try:
        state = torch.load(folder / STATE_FILE, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as err:
        if isinstance(err, torch.OutOfMemoryError):
            raise  # the device is full: not the checkpoint's fault
        raise CheckpointDamaged(f"{manifest.name}/{STATE_FILE} is not a plain tensor state "
                                f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})") from None
    if not isinstance(state, dict):
        raise CheckpointDamaged(f"{manifest.name}/{STATE_FILE} holds a {type(state).__name__}, not a state dict")
    return state, manifest

"""Local-directory store (`file:///abs/dir`), the embedded default.

Atomicity by write-then-rename: a push copies into a hidden `.incoming-*`
folder on the same filesystem, writes the manifest last, fsyncs, then renames
the folder to `step-<N>`. A half-copied checkpoint is never listed. Delete
renames to `.trash-*` first, so the checkpoint stops counting at once.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from runtime.store.base import (MANIFEST, VERIFIED, CheckpointInfo, Manifest, RemoteFile, StoreError,
                                step_of)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class LocalDirStore:
    """Checkpoints as folders under `<root>/<namespace>/`."""

    def __init__(self, root: Path, namespace: str = "") -> None:
        self.root = root
        self.dir = root / namespace if namespace else root
        self.uri = self.dir.as_uri()

    def _ckpt(self, name: str) -> Path:
        if step_of(name) is None:
            raise StoreError(f"not a checkpoint name: {name!r}")
        return self.dir / name

    def list(self) -> list[CheckpointInfo]:
        if not self.dir.is_dir():
            return []
        out = []
        for child in self.dir.iterdir():
            step = step_of(child.name)
            manifest_path = child / MANIFEST
            if step is None or not manifest_path.is_file():
                continue
            manifest = Manifest.from_json(json.loads(manifest_path.read_text()))
            out.append(CheckpointInfo(child.name, step, manifest, (child / VERIFIED).is_file()))
        return sorted(out, key=lambda c: c.step)

    def push(self, local_dir: Path, manifest: Manifest) -> None:
        final = self._ckpt(manifest.name)
        if final.exists():
            raise StoreError(f"{manifest.name} already exists in {self.uri}")
        self.dir.mkdir(parents=True, exist_ok=True)
        incoming = self.dir / f".incoming-{manifest.name}-{uuid.uuid4().hex[:8]}"
        incoming.mkdir()
        try:
            for entry in manifest.files:
                dst = incoming / entry.path
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local_dir / entry.path, dst)
                with dst.open("rb+") as fh:
                    os.fsync(fh.fileno())
            _write_json_atomic(incoming / MANIFEST, manifest.to_json())
            _fsync_dir(incoming)
            os.rename(incoming, final)
            _fsync_dir(self.dir)
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            raise

    def remote_files(self, name: str, paths: list[str]) -> dict[str, RemoteFile]:
        folder = self._ckpt(name)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        return {p: RemoteFile((folder / p).stat().st_size) for p in paths if (folder / p).is_file()}

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        target = self._ckpt(name) / path
        if not target.is_file():
            raise FileNotFoundError(f"{name}/{path} is not in {self.uri}")
        with target.open("rb") as fh:
            fh.seek(start)
            return fh.read(length)

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        folder = self._ckpt(name)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        _write_json_atomic(folder / VERIFIED, record)

    def fetch(self, name: str, dest: Path) -> Path:
        folder = self._ckpt(name)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        target = dest / name
        shutil.copytree(folder, target)
        return target

    def delete(self, name: str) -> None:
        folder = self._ckpt(name)
        if not folder.exists():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        trash = self.dir / f".trash-{name}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, trash)
        shutil.rmtree(trash)

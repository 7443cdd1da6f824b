"""Local-directory store (`file:///abs/dir`), the embedded default.

Atomicity by write-then-rename: a push copies into a hidden `.incoming-*`
folder on the same filesystem, writes the manifest last, fsyncs, then renames
the folder to `step-<N>`. A half-copied checkpoint is never listed. Delete
renames to `.trash-*` first, so the checkpoint stops counting at once.

Reading treats the folder as untrusted (runtime.store.safeio): no symlink is
followed, only regular files are read, never past the manifest's sizes.
"""

from __future__ import annotations

import builtins  # builtins.list in signatures below the class's own list() method, which shadows the name there
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from runtime.store.base import (
    MANIFEST,
    VERIFIED,
    CheckpointDamaged,
    CheckpointInfo,
    Damaged,
    Manifest,
    RemoteFile,
    StoreError,
    StoreScan,
    canonical_json,
    step_of,
)
from runtime.store.safeio import create_inside, open_regular, read_exactly, read_small
from runtime.store.seal import classify_folder


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

    def __init__(self, root: Path, namespace: str = "", key: bytes | None = None) -> None:
        self.root = root
        self.dir = root / namespace if namespace else root
        self.uri = self.dir.as_uri()
        self.key = key

    def _ckpt(self, name: str) -> Path:
        if step_of(name) is None:
            raise StoreError(f"not a checkpoint name: {name!r}")
        return self.dir / name

    def scan(self) -> StoreScan:
        if not self.dir.is_dir():
            return StoreScan([], [])
        good, damaged = [], []
        for child in self.dir.iterdir():
            step = step_of(child.name)
            if step is None:
                continue
            if child.is_symlink() or not child.is_dir():
                damaged.append(Damaged(child.name, step, "the checkpoint folder is a symlink or a file"))
                continue
            try:
                manifest_raw = read_small(child, MANIFEST)
            except FileNotFoundError:
                continue  # no manifest: never a checkpoint (a push that died mid-copy)
            except (CheckpointDamaged, OSError) as err:
                damaged.append(Damaged(child.name, step, f"{MANIFEST}: {err}"))
                continue
            seal_raw, seal_problem = None, None
            try:
                seal_raw = read_small(child, VERIFIED)
            except FileNotFoundError:
                pass
            except (CheckpointDamaged, OSError) as err:  # a mark nobody can read: the checkpoint is unverified
                seal_problem = Damaged(child.name, step, f"not counted as verified: {VERIFIED}: {err}")
            info, bad = classify_folder(child.name, manifest_raw, seal_raw, self.key)
            good += [info] if info else []
            damaged += [d for d in (bad, seal_problem if info else None) if d]
        return StoreScan(sorted(good, key=lambda c: c.step), sorted(damaged, key=lambda d: d.step))

    def list(self) -> list[CheckpointInfo]:
        return self.scan().checkpoints

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

    def _parts(self, name: str) -> Path:
        return self.dir / f".parts-{self._ckpt(name).name}"

    def push_part(self, local_dir: Path, name: str, paths: builtins.list[str]) -> None:
        """One node's files of checkpoint `name` (sharded state, several nodes), staged where
        nothing lists them; `commit` makes the checkpoint exist once every node's are there."""
        staging = self._parts(name)
        staging.mkdir(parents=True, exist_ok=True)
        for path in paths:
            dst = staging / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local_dir / path, dst)
            with dst.open("rb+") as fh:
                os.fsync(fh.fileno())

    def commit(self, manifest: Manifest) -> None:
        """The staged files plus the manifest become checkpoint `manifest.name`, at once; every
        file the manifest lists must be staged at its size, and nothing else is kept."""
        staging, final = self._parts(manifest.name), self._ckpt(manifest.name)
        if final.exists():
            raise StoreError(f"{manifest.name} already exists in {self.uri}")
        listed = {f.path: f.size for f in manifest.files}
        for path, size in listed.items():
            got = (staging / path).stat().st_size if (staging / path).is_file() else None
            if got != size:
                raise StoreError(f"{manifest.name}/{path}: staged {got} bytes, the manifest says {size}")
        for extra in [q for q in staging.rglob("*") if q.is_file() and q.relative_to(staging).as_posix() not in listed]:
            extra.unlink()
        _write_json_atomic(staging / MANIFEST, manifest.to_json())
        _fsync_dir(staging)
        os.rename(staging, final)
        _fsync_dir(self.dir)

    def drop_parts(self, name: str) -> None:
        """Whatever an earlier attempt staged for `name`."""
        shutil.rmtree(self._parts(name), ignore_errors=True)

    def remote_files(self, name: str, paths: builtins.list[str]) -> dict[str, RemoteFile]:
        folder = self._ckpt(name)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        out = {}
        for p in paths:
            try:
                fd = open_regular(folder, p)
            except (FileNotFoundError, CheckpointDamaged):
                continue  # absent, or not a regular file: not a stored file
            try:
                out[p] = RemoteFile(os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return out

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        try:
            fd = open_regular(self._ckpt(name), path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{name}/{path} is not in {self.uri}") from None
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        folder = self._ckpt(name)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        _write_json_atomic(folder / VERIFIED, record)

    def fetch(self, name: str, dest: Path) -> Path:
        folder = self._ckpt(name)
        try:
            raw = read_small(folder, MANIFEST)
        except FileNotFoundError:
            raise FileNotFoundError(f"{name} is not in {self.uri}") from None
        info, bad = classify_folder(name, raw, None, None)
        if info is None:
            raise CheckpointDamaged(f"{name}: {bad.reason if bad else 'damaged'}")
        target = dest / name
        target.mkdir(parents=True)
        for entry in info.manifest.files:
            src = open_regular(folder, entry.path)
            try:
                with os.fdopen(create_inside(target, entry.path), "wb") as out:
                    got = read_exactly(src, entry.size, out.write, f"{name}/{entry.path}")
            finally:
                os.close(src)
            if got != entry.sha256:
                raise CheckpointDamaged(f"{name}/{entry.path} does not match its manifest's sha256")
        (target / MANIFEST).write_bytes(canonical_json(info.manifest.to_json()))
        return target

    def delete(self, name: str) -> None:
        folder = self._ckpt(name)
        if not folder.exists() and not folder.is_symlink():
            raise FileNotFoundError(f"{name} is not in {self.uri}")
        trash = self.dir / f".trash-{name}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, trash)
        if trash.is_symlink() or not trash.is_dir():
            trash.unlink()  # a forged entry: remove the link itself, never what it points at
        else:
            shutil.rmtree(trash)  # rmtree never follows the symlinks inside

"""Reading a checkpoint folder that someone else may have written.

Every file is opened component by component with O_NOFOLLOW, so a symlink
anywhere under the checkpoint folder (to /dev/zero, to ~/.ssh, to a folder
outside) is refused, not followed; only regular files are read; and a read
never goes past the size the manifest declares (a file that keeps giving is
stopped one byte later). Errors name what was wrong as CheckpointDamaged.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Callable

from runtime.store.base import MAX_SMALL_JSON, CheckpointDamaged, safe_relpath

CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular(folder: Path, rel: str) -> int:
    """An fd for the regular file `folder/rel`, or raise (FileNotFoundError when absent)."""
    parts = safe_relpath(rel).split("/")
    try:
        dfd = os.open(folder, _DIR_FLAGS)
    except OSError as err:
        _raise(err, folder.name)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=dfd)
            except OSError as err:
                _raise(err, "/".join(parts[: i + 1]))
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except OSError as err:
            _raise(err, rel)
    finally:
        os.close(dfd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointDamaged(f"{rel} is not a regular file (a device, fifo or socket is never read)")
    return fd


def _raise(err: OSError, what: str) -> None:
    if err.errno in (errno.ELOOP, errno.ENOTDIR) or (err.errno == errno.EMLINK):
        raise CheckpointDamaged(f"{what} is a symlink or not a folder: never followed") from None
    if err.errno == errno.ENOENT:
        raise FileNotFoundError(f"{what} is not there") from None
    raise err


def read_small(folder: Path, rel: str, limit: int = MAX_SMALL_JSON) -> bytes:
    """The bytes of a small file (manifest, verified mark), refusing more than `limit`."""
    fd = open_regular(folder, rel)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CheckpointDamaged(f"{rel} is larger than {limit} bytes")
    return data


def read_exactly(fd: int, size: int, sink: Callable[[bytes], object], what: str) -> str:
    """Feed exactly `size` bytes of `fd` to `sink`; return their sha256. Short or long -> damage."""
    digest = hashlib.sha256()
    left = size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            raise CheckpointDamaged(f"{what}: {size - left} bytes, the manifest says {size}")
        digest.update(chunk)
        sink(chunk)
        left -= len(chunk)
    if os.read(fd, 1):
        raise CheckpointDamaged(f"{what}: larger than the {size} bytes the manifest says")
    return digest.hexdigest()


def create_inside(root: Path, rel: str) -> int:
    """A new file `root/rel` for writing (its folders created), never through a symlink."""
    target = root / safe_relpath(rel)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.parent.resolve() != (root.resolve() / rel).parent:
        raise CheckpointDamaged(f"{rel} would be written outside {root}")
    return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)

"""The project's store key: seals the verified marks its legs write.

A random 32-byte key in `<state_dir>/store.key` (mode 0600), made on first use.
Every leg gets it as a secret (`LAUNCHER_STORE_KEY`: in its environment, never
in the ledger, a log, a YAML or a report), and the host reads the store with it
(drill, status, stop), so a verified mark that someone who can write the store
forged without the key never counts (runtime.store.seal).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from launcher.errors import Refused

KEY_FILE = "store.key"


def project_key(state_path: Path, create: bool = True) -> bytes | None:
    """The key (made now if `create` and there is none; None if not and there is none)."""
    path = state_path / KEY_FILE
    if not path.exists() and not path.is_symlink():
        if not create:
            return None
        state_path.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass  # another launcher made it first: read theirs
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            text = fh.read(200).strip()
        return bytes.fromhex(text) if len(text) == 64 else _damaged(path)
    except (OSError, ValueError):
        return _damaged(path)


def _damaged(path: Path) -> bytes:
    raise Refused(
        f"{path} is not a store key (64 hex digits in a regular file)",
        hint="restore it from a backup; deleting it makes every verified checkpoint of this "
        "project count as unverified",
    )

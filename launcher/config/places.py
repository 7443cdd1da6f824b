"""Where a project's files go: the state dir and the checkpoint store, each a folder checked by
one rule (`local_folder`), and the store URI as legs see it (`store_uri`).

Accepted store forms: `file:///abs/dir`, a path relative to the project, `hf://owner/repo[@rev]`.
Everything else that looks like one of them is refused rather than guessed at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

from launcher.errors import ConfigError


class Project(Protocol):
    """What `store_uri` reads of launcher.config.schema.Config (which imports this module)."""

    store: str | None
    root: Path

    @property
    def state_path(self) -> Path: ...


HF_URI = re.compile(r"hf://[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}(@(?P<revision>[\w./-]{1,200}))?")
SYSTEM_DIRS = tuple("/ /bin /boot /etc /home /lib /lib32 /lib64 /opt /root /sbin /srv /tmp /usr /var".split())
"""Never a store or a state dir themselves: each is a folder of its own."""
PSEUDO_DIRS = tuple(Path(d) for d in "/dev /proc /run /sys /bin /boot /etc /lib /lib32 /lib64 /sbin /usr".split())
"""Nor anything under these: devices, the kernel's views, the system's programs and settings.
The writability check alone would let root (every container, Kaggle) write into /etc."""
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
"""What starts a URI. `file:/tmp/x` (one slash) or `hf:a/b` is a URI written wrong, not a
folder named `file:` in the project: refused, naming the forms that are taken."""
FORMS = "file:///abs/dir, a path relative to the project, or hf://owner/repo[@revision]"


def store_uri(cfg: Project, on_disk: bool = True) -> str:
    """The store URI as legs see it (absolute, with a scheme). `on_disk`: also refuse a
    local store path that exists and is not a folder."""

    def _store_dir(path: Path) -> Path:
        return local_folder(path, "store") if on_disk else path.absolute()

    if cfg.store is None:
        return _store_dir(cfg.state_path / "store").as_uri()
    if not cfg.store.strip():
        raise ConfigError("store", "must not be empty (leave it out for the default store)")
    if cfg.store.startswith("file://"):
        path = Path(cfg.store[len("file://") :])
        if not path.is_absolute():
            raise ConfigError("store", f"file:// URIs must be absolute (file:///abs/dir), got {cfg.store!r}")
        # RFC 8089 decodes %2F to `/` and ends the path at ? or #; a folder name may hold all
        # three. Taken literally here but decoded by every URI reader: write the path plainly.
        if re.search(r"[%?#]", cfg.store):
            raise ConfigError("store", f"{cfg.store!r}: % ? # are ambiguous in a file:// URI; write file:///abs/dir")
        return _store_dir(path).as_uri()
    if cfg.store.startswith("hf://"):
        found = HF_URI.fullmatch(cfg.store)
        if not found:
            raise ConfigError("store", f"expected hf://owner/repo[@revision], got {cfg.store!r}")
        revision = found.group("revision")
        if revision is not None and not all(
            part and not part.startswith(".") and not part.endswith(".lock") for part in revision.split("/")
        ):
            raise ConfigError(
                "store",
                f"{revision!r} is not a branch, tag or commit name (no empty, '.'-led or '..' parts), in {cfg.store!r}",
            )
        return cfg.store
    if SCHEME.match(cfg.store):
        raise ConfigError("store", f"{cfg.store[:60]!r} is not a store URI; expected {FORMS}")
    if cfg.store.startswith("~"):
        raise ConfigError(
            "store",
            f"{cfg.store!r}: the launcher does not expand ~ (a leg's home is not yours); write the absolute path",
        )
    # A relative path may leave the project (`../ckpts`, shared by projects): it names the same
    # folder its file:/// URI would, and that may be anywhere; the folder checks still apply.
    return _store_dir(cfg.root / cfg.store).as_uri()


def local_folder(path: Path, key: str) -> Path:
    """A folder the launcher writes (`key`: store or state_dir): absolute, a folder (or not there
    yet), never a file, a device or a system folder, and writable by this user."""
    try:
        resolved = path.resolve()
        exists, is_dir = resolved.exists(), resolved.is_dir()
    except (OSError, RuntimeError) as err:
        raise ConfigError(key, f"cannot use {str(path)[:200]!r} ({err})") from None
    if exists and not is_dir:
        raise ConfigError(key, f"{resolved} exists and is not a folder")
    if len(str(resolved)) > 1024:
        raise ConfigError(key, "the path is longer than 1024 characters")
    if str(resolved) in SYSTEM_DIRS or any(resolved.is_relative_to(d) for d in PSEUDO_DIRS):
        raise ConfigError(key, f"{resolved} is a system folder: give it a folder of its own")
    ancestor = next(p for p in (resolved, *resolved.parents) if p.exists())
    if not os.access(ancestor, os.W_OK | os.X_OK):  # read-only file system or no permission: said now, not mid-leg
        raise ConfigError(key, f"{resolved} cannot be created or written by this user ({ancestor} is not writable)")
    return resolved

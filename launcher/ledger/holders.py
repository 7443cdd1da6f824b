"""Who holds the ledger: the ledgers this process opened, and the processes that
hold a lock on one (so an error about a locked ledger can name them).

Imports nothing from the launcher: `launcher.errors` and `launcher.ledger.db` both
use it.
"""

from __future__ import annotations

import os
from pathlib import Path

OPENED: list[Path] = []
"""Ledgers this process opened: an error about a locked one can then say who holds it."""


def lock_holders(path: Path) -> list[tuple[int, str]]:
    """(pid, command line) of processes holding a POSIX lock on the ledger or its WAL files
    (Linux /proc/locks; [] elsewhere)."""
    inodes = set()
    for p in (path, path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        try:
            st = p.stat()
        except OSError:
            continue
        inodes.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    holders: dict[int, str] = {}
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.replace("->", "").split()
        try:
            pid, dev = int(parts[4]), parts[5].split(":")
            key = (int(dev[0], 16), int(dev[1], 16), int(dev[2]))
        except (IndexError, ValueError):
            continue
        if key in inodes and pid != os.getpid():
            found.append((parts[3] == "WRITE", pid))
    writers = {pid for write, pid in found if write}  # in WAL mode only a writer blocks a writer
    for pid in sorted(writers or {pid for _, pid in found}):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        holders[pid] = cmd[:160]
    return sorted(holders.items())


def describe_holders(path: Path) -> str:
    """' by pid N (command); ...' for the processes holding the ledger, '' when none is known."""
    found = lock_holders(path)
    return (" by " + "; ".join(f"pid {pid} ({cmd})" for pid, cmd in found)) if found else ""

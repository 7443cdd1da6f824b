"""Exit codes, error types, and the one ordered table that turns any exception into
one line, a hint naming the next command, and an exit code (docs/design.md: 0 ok, 1 the
rung said no, 2 bad input, 3 refused by a guard; 70 a bug, 130 interrupted).

Every command ends through `guarded`: a LauncherError prints as itself; anything
else goes down `MAPPINGS` (the first rule that claims it wins: the ledger's and the
store's errors, the file system's, undecodable input); what no rule claims is a bug
(70). Tracebacks are shown only with LAUNCHER_DEBUG=1.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from launcher.checks.evidence import Check


class Exit(IntEnum):
    """Every exit code the launcher ends with."""

    OK = 0
    NO = 1
    """The rung ran and its answer is no (or a leg failed)."""
    BAD_INPUT = 2
    """Usage, config, an unknown name: nothing was launched or recorded."""
    REFUSED = 3
    """A guard refused: hashes, quota, the store's or the ledger's state."""
    INTERNAL = 70
    """A bug: no rule below claimed the exception."""
    INTERRUPTED = 130


EXIT_INTERNAL = int(Exit.INTERNAL)


class LauncherError(Exception):
    """Base: a failure the user can act on, rendered as one line."""

    exit_code = int(Exit.NO)

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadInput(LauncherError):
    """Usage, config, unknown rung, bad --gpus: nothing was launched or recorded."""

    exit_code = int(Exit.BAD_INPUT)


class ConfigError(BadInput):
    """launcher.yaml (or a flag standing in for one of its keys) is invalid."""

    def __init__(self, key: str, detail: str, source: str = "launcher.yaml") -> None:
        super().__init__(f"{source}: {key}: {detail}")
        self.key = key
        self.detail = detail
        self.source = source


class Refused(LauncherError):
    """A guard refused: hash mismatch, quota, dirty tree."""

    exit_code = int(Exit.REFUSED)


class DockerError(LauncherError):
    """The Docker engine or CLI failed (exit 1: the build ran and its answer is no)."""


class QuotaOut(Refused):
    """The quota ran out mid-run (exit 3); the checks so far travel with it into the ledger."""

    def __init__(self, message: str, checks: list[Check], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.checks = checks


class RunStopped(Exception):
    """`launcher stop` asked the run to stop: no further leg is launched. Not a LauncherError:
    the rung records the stop as its verdict and ends as its checks say."""


@dataclass(frozen=True)
class Mapping:
    """One rule of the table: what it claims, and the error it makes of it (None: not its)."""

    what: str
    make: Callable[[BaseException], "LauncherError | None"]


def _launcher(err: BaseException) -> LauncherError | None:
    return err if isinstance(err, LauncherError) else None


def _ledger(err: BaseException) -> LauncherError | None:
    import sqlite3

    if not isinstance(err, sqlite3.Error):
        return None
    text = str(err)
    if "locked" in text or "busy" in text:
        from launcher.ledger.holders import OPENED, describe_holders

        who = "".join(describe_holders(p) for p in dict.fromkeys(OPENED))
        return Refused(
            f"the ledger is locked{who}: {text}",
            hint="wait for the other launcher to finish (`launcher ledger` lists runs), then run it again",
        )
    if "full" in text:
        return Refused(f"the ledger cannot be written: {text}", hint="free some space, then run it again")
    if "readonly" in text or "read-only" in text:
        return Refused(f"the ledger cannot be written: {text}", hint="make state_dir writable")
    return Refused(
        f"the ledger is damaged: {text}",
        hint="move it aside (ledger.db*) and restore a backup; `sqlite3 ledger.db .recover` may save rows",
    )


PATH_ERRNOS = (
    errno.ENAMETOOLONG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.ENOENT,
    errno.EINVAL,
    errno.EEXIST,
)


def _os(err: BaseException) -> LauncherError | None:
    if not isinstance(err, OSError):
        return None
    where = f" {str(err.filename)[:200]}" if err.filename else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return Refused(
            f"no space left on the device of{where or ' a file this command writes'}",
            hint="free some space (old leg logs, reports, checkpoints), then run it again",
        )
    if err.errno == errno.EROFS:
        return Refused(f"cannot write{where}: read-only file system", hint="point state_dir at a writable folder")
    if err.filename or err.errno in PATH_ERRNOS:
        return BadInput(
            f"cannot use{where or ' a path'}: {err.strerror or err}", hint="check the path and its permissions"
        )
    return None


def _nul(err: BaseException) -> LauncherError | None:
    if isinstance(err, ValueError) and "null byte" in str(err):
        return BadInput("a path or value holds a NUL byte", hint="check the arguments and launcher.yaml")
    return None


def _nested(err: BaseException) -> LauncherError | None:
    if isinstance(err, RecursionError):
        return BadInput("input nested too deeply to be read", hint="check the file or value given")
    return None


def _text(err: BaseException) -> LauncherError | None:
    if isinstance(err, UnicodeError):
        return BadInput(f"input is not valid text ({type(err).__name__})", hint="give UTF-8 text")
    return None


def _store(err: BaseException) -> LauncherError | None:
    from runtime.store import StoreAuthError, StoreError

    if isinstance(err, StoreAuthError):
        return Refused(f"the checkpoint store refused the credentials: {err}", hint="check HF_TOKEN (`hf auth whoami`)")
    if isinstance(err, StoreError):
        return Refused(f"the checkpoint store: {err}", hint="`launcher status` shows what the store holds")
    return None


MAPPINGS: tuple[Mapping, ...] = (
    Mapping("a launcher error: itself", _launcher),
    Mapping("sqlite3.Error: the ledger locked, full, read-only or damaged (3)", _ledger),
    Mapping("OSError: no space or a read-only disk (3); a path that cannot be used (2)", _os),
    Mapping("ValueError on a NUL byte (2)", _nul),
    Mapping("RecursionError: input nested too deeply (2)", _nested),
    Mapping("UnicodeError: input that is not text (2)", _text),
    Mapping("StoreAuthError, StoreError: the checkpoint store refused or failed (3)", _store),
)
"""Ordered: the first rule that claims an exception makes its one line."""


def from_exception(err: BaseException) -> LauncherError | None:
    """The one-line error (and exit code) for a failure that is the input's or the
    machine's, not a bug; None for a bug (exit 70). The first rule of MAPPINGS wins."""
    for rule in MAPPINGS:
        made = rule.make(err)
        if made is not None:
            return made
    return None


def print_error(message: str, hint: str | None = None) -> None:
    """The one line (and the next command) every failure prints on stderr."""
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"  next: {hint}\n")


def exit_code_for(err: BaseException) -> int:
    """Print `err` as one line and return its exit code: 2 bad input, 3 refused,
    130 interrupted, 70 a bug (the traceback only with LAUNCHER_DEBUG=1)."""
    if isinstance(err, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return int(Exit.INTERRUPTED)
    if os.environ.get("LAUNCHER_DEBUG"):
        import traceback

        traceback.print_exception(err)
    mapped = from_exception(err)
    if mapped is None:
        print_error(f"internal error: {type(err).__name__}: {str(err)[:300]}", "set LAUNCHER_DEBUG=1 for the traceback")
        return EXIT_INTERNAL
    print_error(mapped.message, mapped.hint)
    return mapped.exit_code


def guarded(call: "Callable[[], int | None]") -> int:
    """Run one command; its exit code, or the mapped one of whatever it raised."""
    try:
        return call() or 0
    except Exception as err:  # noqa: BLE001 - one line and an exit code; 70 only for a bug
        return exit_code_for(err)
    except KeyboardInterrupt as err:
        return exit_code_for(err)


def interrupt_on_hangup() -> None:
    """SIGTERM and SIGHUP (a closed terminal, `kill`, a CI timeout) end the launcher as
    Ctrl-C does: every leg's teardown runs (a cluster is downed, a container removed)
    and the run is closed in the ledger. SIGKILL skips all of it: the next command reaps."""
    import signal
    import threading

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (an embedding caller keeps its own)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)

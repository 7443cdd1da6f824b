"""The one exit-code table (launcher.errors): each real failure a command can meet maps to
one line, a hint naming what to do next, and its exit code; only what no rule claims is a
bug (70). The exceptions are real ones, raised by the things that raise them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from launcher.errors import MAPPINGS, BadInput, Exit, Refused, exit_code_for, from_exception, guarded


def _raised(call) -> BaseException:  # noqa: ANN001
    try:
        call()
    except BaseException as err:  # noqa: BLE001 - the exception is the test's subject
        return err
    raise AssertionError("it did not raise")


def _locked_ledger(tmp_path: Path) -> BaseException:
    db = tmp_path / "ledger.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        return _raised(lambda: sqlite3.connect(db, timeout=0).execute("INSERT INTO t VALUES (1)"))
    finally:
        holder.close()


def _damaged_ledger(tmp_path: Path) -> BaseException:
    (tmp_path / "ledger.db").write_bytes(b"not a database" * 100)
    return _raised(lambda: sqlite3.connect(tmp_path / "ledger.db").execute("SELECT 1 FROM runs"))


def _nested(depth: int = 0) -> None:
    _nested(depth + 1)


def test_the_table_is_ordered_and_a_launcher_error_is_itself() -> None:
    assert MAPPINGS[0].what.startswith("a launcher error")
    err = Refused("quota", hint="`launcher spend`")
    assert from_exception(err) is err and [int(c) for c in Exit] == [0, 1, 2, 3, 70, 130]
    assert (BadInput.exit_code, Refused.exit_code) == (Exit.BAD_INPUT, Exit.REFUSED)


@pytest.mark.parametrize(
    "make, code, needle, hint",
    [
        (lambda tmp: _locked_ledger(tmp), 3, "the ledger is locked", "wait for the other launcher"),
        (lambda tmp: _damaged_ledger(tmp), 3, "the ledger is damaged", "restore a backup"),
        (lambda tmp: OSError(28, "No space left on device", str(tmp / "x")), 3, "no space left", "free some space"),
        (lambda tmp: _raised(lambda: open(tmp / ("a" * 5000))), 2, "cannot use", "check the path"),
        (lambda tmp: _raised(lambda: open(tmp / "missing" / "x")), 2, "cannot use", "check the path"),
        (lambda tmp: _raised(lambda: open("a\0b")), 2, "NUL byte", "launcher.yaml"),
        (lambda tmp: _raised(_nested), 2, "nested too deeply", "check the file"),
        (lambda tmp: _raised(lambda: b"\xff\xfe".decode()), 2, "not valid text", "UTF-8"),
        (
            lambda tmp: _raised(lambda: (_ for _ in ()).throw(ZeroDivisionError("a bug"))),
            70,
            "internal error",
            "LAUNCHER_DEBUG=1",
        ),
    ],
)
def test_each_rule_maps_a_real_failure_to_one_line_and_its_code(
    make,
    code,
    needle,
    hint,
    tmp_path: Path,  # noqa: ANN001
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = make(tmp_path)
    assert exit_code_for(err) == code
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: ") and needle in lines[0], lines
    assert len(lines) == 2 and lines[1].startswith("  next: ") and hint in lines[1], lines


def test_a_refused_token_during_stop_or_a_drill_is_exit_3_with_a_hint(
    hub_server,
    tmp_path: Path,  # noqa: ANN001
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The store calls `stop` and a drill make (the newest verified checkpoint) through the real
    huggingface_hub client: a token the Hub refuses is the user's to fix (3), never a bug (70)."""
    from runtime.store.base import newest_verified
    from tests.helpers import hub_store

    assert newest_verified(hub_store(hub_server)) is None  # the good token reads (an empty store)
    assert guarded(lambda: newest_verified(hub_store(hub_server, token="hf_wrong"))) == Exit.REFUSED
    out = capsys.readouterr().err.splitlines()
    assert out[0].startswith("error: the checkpoint store refused the credentials"), out
    assert out[1].startswith("  next: ") and "HF_TOKEN" in out[1]


def test_an_interrupt_is_130_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code_for(KeyboardInterrupt()) == Exit.INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"

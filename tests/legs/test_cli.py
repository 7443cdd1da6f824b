"""The CLI surface: help, JSON listings, and that the host never pays for torch or skypilot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Done, assert_one_line_error, run_cli

HEAVY = ("torch", "sky", "docker", "numpy")

PROBE = """
import json, sys
from launcher.cli.app import main
code = main({argv!r})
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print("@@" + json.dumps({{"code": code, "heavy": heavy}}))
"""


def imports_after(argv: list[str], cwd: Path) -> dict:
    code = PROBE.format(argv=argv, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@"))
    return json.loads(line[2:])


@pytest.mark.parametrize("argv", [["--help"], ["ledger"], ["ledger", "--json"], ["up", "--help"], ["status", "--json"]])
def test_host_commands_do_not_import_torch_or_skypilot(after_static: Done, argv: list[str]) -> None:
    got = imports_after(argv, after_static.root)  # a project whose ledger has a run to show
    assert got["code"] == 0
    assert got["heavy"] == [], f"`launcher {' '.join(argv)}` imported {got['heavy']}"


def test_help_lists_the_commands(tmp_path: Path) -> None:
    res = run_cli(["--help"], cwd=tmp_path)
    assert res.code == 0
    for command in ("init", "review", "up", "ledger"):
        assert command in res.out


def test_ledger_json_and_table(project: Path, after_static: Done) -> None:
    empty = run_cli(["ledger", "--json"], cwd=project)
    assert empty.code == 0 and empty.json() == []
    assert "no runs recorded yet" in run_cli(["ledger"], cwd=project).out
    project = after_static.root  # the same project after one `up static`
    runs = run_cli(["ledger", "--json"], cwd=project).json()
    assert len(runs) == 1 and runs[0]["rung"] == "static" and runs[0]["legs"][0]["backend"] == "host"
    assert "runtime.programs.static_check" in runs[0]["legs"][0]["command"]
    one = run_cli(["ledger", runs[0]["id"], "--json"], cwd=project).json()
    assert one == runs
    table = run_cli(["ledger"], cwd=project)
    assert runs[0]["id"] in table.out and runs[0]["files"]["train.py"] in table.out


def test_unknown_run_id_is_bad_input(project: Path) -> None:
    res = run_cli(["ledger", "nope"], cwd=project)
    assert res.code == 2 and res.err.startswith("error: no run 'nope'")


def test_review_json_lists_hashes(project: Path) -> None:
    res = run_cli(["review", "--json"], cwd=project)
    assert res.code == 0
    data = res.json()
    assert list(data["files"]) == ["train.py"] and len(data["digest"]) == 64


def test_a_damaged_ledger_is_one_line_and_exit_3_unless_debugging(project: Path) -> None:
    db = project / ".launcher" / "ledger.db"
    db.write_bytes(b"this is not a sqlite database" * 100)
    for args in (["ledger"], ["ledger", "--json"], ["status"], ["report"], ["spend"], ["up", "static"]):
        res = run_cli(args, cwd=project)
        assert_one_line_error(res, 3, "the ledger is damaged")
        assert "next: move it aside" in res.err
    debug = run_cli(["ledger"], cwd=project, env={"LAUNCHER_DEBUG": "1"})
    assert "Traceback" in debug.err and debug.code == 3


def test_only_a_bug_is_exit_70(capsys) -> None:  # noqa: ANN001
    from launcher.errors import exit_code_for

    assert exit_code_for(ZeroDivisionError("a bug")) == 70
    assert capsys.readouterr().err.startswith("error: internal error: ZeroDivisionError: a bug")
    assert exit_code_for(OSError(28, "No space left on device", "/x/ledger.db")) == 3
    assert exit_code_for(OSError(36, "File name too long", "a" * 5000)) == 2

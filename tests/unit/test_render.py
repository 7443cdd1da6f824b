"""The terminal's lines: a check's or a proof's text wrapped within the width, nothing cut."""

from __future__ import annotations

import io
import os

from rich.console import Console

from launcher.checks.evidence import Check, Kind, Pointer
from launcher.cli import render

LONG = (
    "the checkpoint's optimizer state was saved and never loaded: "
    + " ".join(f"word{i}" for i in range(60))
    + " /a/path/without/spaces/"
    + "x" * 150
)


def _console(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, highlight=False, color_system=None), buf


def _words(text: str) -> str:
    return "".join(text.split())


def test_a_fail_line_wraps_within_the_width_and_keeps_every_word():
    failing = Check("state restored", False, LONG, (Pointer(2, "leg-2.log", 41, "{}"),), kind=Kind.READBACK)
    for verbose in (False, True):
        out, buf = _console(72)
        render.print_checks(out, "rung rehearsal: run r1", [failing], verbose=verbose)
        lines = buf.getvalue().splitlines()
        assert max(len(line) for line in lines) <= 72, buf.getvalue()
        # nothing cut: every character of the detail is on the page (the table's borders aside)
        page = _words(buf.getvalue().replace("│", "").replace("┃", ""))
        assert _words(LONG) in page or all(w in page for w in LONG.split()), buf.getvalue()
    out, buf = _console(72)
    render.print_checks(out, "t", [failing], verbose=False)
    assert _words(f"FAIL state restored: {LONG} (leg 2 line 41)") == _words(buf.getvalue().split("\n", 1)[1])


def test_the_width_is_the_terminals(monkeypatch):
    monkeypatch.setenv("COLUMNS", "97")
    assert render.terminal_width() == 97 and render.terminal_width(2) == 97
    monkeypatch.delenv("COLUMNS")
    r, w = os.pipe()  # a pipe has no terminal: the wide page
    try:
        assert render.terminal_width(w) == render.PIPED_WIDTH == 160
    finally:
        os.close(r)
        os.close(w)


def test_a_proofs_summary_wraps_within_the_width():
    report = {
        "project": "p",
        "plan": {},
        "proofs": [{"number": 3, "title": "state", "status": "FAIL", "summary": LONG}],
    }
    out, buf = _console(60)
    render.print_report(out, "/tmp/report", report)
    assert max(len(line) for line in buf.getvalue().splitlines()) <= 60
    page = buf.getvalue()
    assert "FAIL" in page and all(w in page for w in LONG.split()[:60])

"""The command line: the typer app and how its answers look.

  app.py      the `launcher` commands: parse, call one function, render, map errors to exit codes
  render.py   check tables, the ledger table, JSON: one place decides how things look
  live.py     the live view of a rung's legs (a progress bar, or every event with -v)
  listing.py  `launcher ledger` (kept apart so launcher.entry can run it without typer)
  dryrun.py   `launcher up ... --dry-run`: the launch plan as text
  init.py     `launcher init`: a starter project

Kept empty of imports: `launcher ledger` starts without loading typer (launcher.entry).
"""

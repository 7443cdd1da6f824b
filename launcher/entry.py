"""The `launcher` console script.

`launcher ledger` is what people run in a loop (`watch launcher ledger`, scripts
polling for a verdict), and importing typer costs it about a third of its time.
So a plain `launcher ledger [RUN_ID] [--limit N] [--json] [--config PATH]` is
parsed here, without typer, and runs the very function the typer command runs
(launcher.cli.listing.show_ledger) with the same error mapping. Anything else
(--help, a typo, any other command) goes to the typer app in launcher.cli.app,
which owns the help text and the usage errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

LEDGER_MAX_LIMIT = 100_000  # the typer option's own bound (launcher.cli.app)


def fast_ledger(args: list[str]) -> Callable[[], None] | None:
    """The ledger call these arguments ask for, or None to let typer parse them."""
    run_id, limit, config, json_out = None, 20, Path("launcher.yaml"), False
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--json":
            json_out = True
        elif tok in ("--config", "-c", "--limit") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            i += 1
            if tok == "--limit":
                # The typer option's parser (str.isdigit() took '١' as 1): what it refuses, typer says.
                from launcher.config.parse import plain_int

                try:
                    limit = plain_int(args[i])
                except ValueError:
                    return None
                if not 1 <= limit <= LEDGER_MAX_LIMIT:
                    return None
            else:
                config = Path(args[i])
        elif tok.startswith("-") or run_id is not None or not tok.strip():  # blank: typer refuses it
            return None
        else:
            run_id = tok
        i += 1

    def call() -> None:
        from launcher.cli.listing import show_ledger

        show_ledger(config, run_id, limit, json_out)

    return call


def main(argv: list[str] | None = None) -> int:
    from launcher.errors import interrupt_on_hangup

    interrupt_on_hangup()  # SIGTERM / SIGHUP end the launcher as Ctrl-C does: teardown runs
    args = sys.argv[1:] if argv is None else argv
    call = fast_ledger(args[1:]) if args[:1] == ["ledger"] else None
    if call is None:
        from launcher.cli.app import main as typer_main

        code = typer_main(args)
    else:
        from launcher.errors import guarded

        code = guarded(call)
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()

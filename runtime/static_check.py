"""Rung 0, the part that runs in the trainer's Python: import it, parse its command line.

The host launcher never imports torch, so it runs this module in the trainer's
interpreter:

    python -m runtime.static_check --parser build_parser [--module M ...] -- <leg command...>

and reads one JSON line back: {"checks": [{"name", "ok", "detail"}, ...]}.
The leg command is understood in three shapes: `python [-u] script.py ARGS`,
`python -m module ARGS` and `torchrun [TORCHRUN ARGS] script.py|-m module ARGS`
(torchrun's own parser checks its flags, and a torchrun handed the interpreter
instead of the script fails here: the guide's E-037).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

PYTHON_FLAGS_NO_ARG = {"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-b", "-bb", "-q"}


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


def split_command(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind, target, args): kind is 'script' or 'module'. Raises ValueError."""
    if not argv:
        raise ValueError("empty command")
    exe = os.path.basename(argv[0])
    if exe == "torchrun":
        from torch.distributed.run import get_args_parser

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                ns = get_args_parser().parse_args(argv[1:])
            except SystemExit:
                raise ValueError(f"torchrun rejects its flags: {err.getvalue().strip().splitlines()[-1]}") from None
        script, rest = ns.training_script, list(ns.training_script_args)
        if ns.module:
            return "module", script, rest
        if ns.no_python:
            raise ValueError("torchrun --no-python runs a program, not a Python script: rung 0 cannot parse it")
        if os.path.basename(script).startswith("python"):
            raise ValueError(f"torchrun was handed the interpreter {script!r} instead of the script "
                             "(torchrun adds python itself)")
        return "script", script, rest
    if not exe.startswith("python"):
        raise ValueError(f"rung 0 understands `python ...` and `torchrun ...` commands, not {argv[0]!r}")
    i = 1
    while i < len(argv) and argv[i] in PYTHON_FLAGS_NO_ARG:
        i += 1
    if i >= len(argv):
        raise ValueError("the command names no script or module")
    if argv[i] == "-m":
        if i + 1 >= len(argv):
            raise ValueError("`-m` with no module name")
        return "module", argv[i + 1], argv[i + 2:]
    if argv[i].startswith("-"):
        raise ValueError(f"unsupported interpreter flag {argv[i]!r}")
    return "script", argv[i], argv[i + 1:]


def import_entry(kind: str, target: str) -> ModuleType:
    """Import the entry without running it (its `__main__` guard stays closed)."""
    if kind == "module":
        return importlib.import_module(target)
    path = Path(target).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"script {target} not found (cwd {Path.cwd()})")
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("_preflight_entry", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_with(module: ModuleType, parser_name: str, args: list[str]) -> dict[str, Any]:
    """Parse `args` with the entry's own parser; explain a failure in one line."""
    factory = getattr(module, parser_name, None)
    if not callable(factory):
        return _check("parse", False, f"entry has no function {parser_name}() returning its argparse parser")
    parser = factory()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            ns = parser.parse_args(args)
        except SystemExit:
            lines = err.getvalue().strip().splitlines()
            return _check("parse", False, lines[-1] if lines else "the parser exited")
    return _check("parse", True, f"{len(args)} args parsed: {json.dumps(vars(ns), default=str, sort_keys=True)}")


def run_checks(command: list[str], parser_name: str, modules: list[str]) -> list[dict[str, Any]]:
    checks = []
    try:
        kind, target, args = split_command(command)
        checks.append(_check("command shape", True, f"{kind} {target} with {len(args)} args"))
    except ValueError as err:
        return [_check("command shape", False, str(err))]
    try:
        entry = import_entry(kind, target)
        checks.append(_check("import entry", True, f"imported {target}"))
    except BaseException as err:  # noqa: BLE001 - any import failure is the answer "no"
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return checks + [_check("import entry", False, f"importing {target} failed: {last}")]
    for name in modules:
        try:
            importlib.import_module(name)
            checks.append(_check(f"import {name}", True, "imported"))
        except BaseException as err:  # noqa: BLE001
            last = traceback.format_exception_only(type(err), err)[-1].strip()
            checks.append(_check(f"import {name}", False, last))
    checks.append(parse_with(entry, parser_name, args))
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parser", default="build_parser")
    p.add_argument("--module", action="append", default=[])
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    # The entry may print while importing: keep our stdout for the one JSON line.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        checks = run_checks(command, ns.parser, ns.module)
    finally:
        sys.stdout = real_stdout
    print(json.dumps({"checks": checks}))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

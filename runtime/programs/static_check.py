"""Rung 0, the part that runs in the trainer's Python: import it, parse its command line.

The host launcher never imports torch, so it runs this module in the trainer's
interpreter:

    python -m runtime.programs.static_check --parser build_parser [--module M ...] -- <leg command...>

and reads one JSON line back: {"checks": [{"name", "ok", "detail"}, ...]}.
The leg command is understood in four shapes: `python [-u] script.py ARGS`,
`python -m module ARGS`, `torchrun [TORCHRUN ARGS] script.py|-m module ARGS` and
`accelerate launch [OPTS] script.py|-m module ARGS` (torchrun's and accelerate's own
parsers check their flags, and one handed the interpreter instead of the script fails
here: the guide's E-037).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NoReturn

from runtime import contract
from runtime.programs.static_command import Refusal, split_command
from runtime.programs.static_lightning import lightning_loader_checks
from runtime.programs.static_source import allowed_roots, configurator_of, unresolved_imports, uses_argparse


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


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


class _Parsed(BaseException):
    """Raised right after the entry's argparse parser accepted the command line: rung 0 stops there."""

    def __init__(self, namespace: Any) -> None:
        super().__init__("parsed")
        self.namespace = namespace


_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def last_error_line(text: str) -> str | None:
    """The last line of stderr that is not part of a warning (`file:line: FooWarning: ...` and
    the source line Python prints under it): a deprecation notice is not why a script stopped."""
    lines = text.strip().splitlines()
    keep = []
    skip_next = False
    for line in lines:
        if skip_next and line.startswith("  "):
            skip_next = False
            continue
        skip_next = False
        if _WARNING.search(line):
            skip_next = True
            continue
        keep.append(line)
    return keep[-1] if keep else None


def _stopping_exec(orig_exec: Callable[..., Any], wanted: str | None) -> Callable[..., Any]:
    """builtins.exec as the entry sees it: the configurator's source (`wanted`) runs in the
    caller's globals, then the run stops (_Parsed) with the globals it changed."""

    def exec_(source: Any, globals_: dict[str, Any] | None = None, locals_: Any = None, /, **kw: Any) -> Any:
        caller = sys._getframe(1)
        if globals_ is None:
            globals_, locals_ = caller.f_globals, caller.f_locals if locals_ is None else locals_
        if wanted is None or source != wanted:
            return orig_exec(source, globals_, locals_, **kw)
        before = {k: v for k, v in globals_.items() if isinstance(v, (int, float, bool, str))}
        orig_exec(source, globals_, locals_, **kw)
        changed = {k: globals_[k] for k in before if globals_.get(k) != before[k] and not k.startswith("__")}
        raise _Parsed(argparse.Namespace(**changed))

    return exec_


def _stopping_parsers(
    orig_args: Callable[..., Any], orig_known: Callable[..., Any]
) -> tuple[Callable[..., NoReturn], Callable[..., Any]]:
    """ArgumentParser.parse_args and parse_known_args as the entry sees them: the first parse that
    completes stops the run (_Parsed) with its namespace."""
    inside: list[bool] = []

    def parse_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> NoReturn:
        inside.append(True)
        try:
            ns = orig_args(self, args, namespace)
        finally:
            inside.pop()
        raise _Parsed(ns)

    def parse_known_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        result = orig_known(self, args, namespace)
        if inside:
            return result  # parse_args checks the leftovers itself, then stops
        raise _Parsed(result[0])

    return parse_args, parse_known_args


def _run_as_main(kind: str, target: str, args: list[str]) -> dict[str, Any] | None:
    """Run the entry as `__main__` with `args` as its argv (a check if the script is missing)."""
    import runpy

    if kind == "module":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return None
    path = Path(target).resolve()
    if not path.is_file():
        return _check("parse", False, f"script {target} not found (cwd {Path.cwd()})")
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    runpy.run_path(str(path), run_name="__main__")
    return None


def run_to_parse(kind: str, target: str, args: list[str], configurator: str | None = None) -> dict[str, Any]:
    """Run the entry as `__main__` with the leg's real argv, and stop it the moment its
    argparse parser (any subclass: HfArgumentParser too) has parsed it, or as its exec of
    `configurator` (nanoGPT's configurator.py) returns, its overrides shown: a script that
    parses at module level and trains at import time is checked without training. The
    parser's or configurator's own error is quoted; the modules loaded stay in sys.modules."""
    import builtins

    orig_known, orig_args = argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.parse_args
    orig_exec = builtins.exec
    wanted = Path(configurator).read_text(encoding="utf-8") if configurator and Path(configurator).is_file() else None
    if configurator is not None and wanted is None:
        return _check(
            "parse",
            False,
            f"{target} execs {configurator} to read its command line, and "
            f"{configurator} is not among the reviewed files (add it to `reviewed:`)",
        )

    exec_ = _stopping_exec(orig_exec, wanted)
    parse_args, parse_known_args = _stopping_parsers(orig_args, orig_known)

    err = io.StringIO()
    argv0 = sys.argv[:]
    # Patched on purpose, for this one run of the entry, and put back in `finally`.
    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = parse_args, parse_known_args  # type: ignore[method-assign]
    builtins.exec = exec_
    try:
        with contextlib.redirect_stderr(err):
            missing = _run_as_main(kind, target, args)
        if missing is not None:
            return missing
        return _check(
            "parse",
            False,
            f"{target} ran to its end without parsing a command line with argparse "
            "(set trainer.parser: none for a script configured otherwise)",
        )
    except _Parsed as parsed:
        ns = parsed.namespace
        shown = json.dumps(vars(ns), default=str, sort_keys=True) if hasattr(ns, "__dict__") else repr(ns)
        by = f"read by {configurator} (its overrides)" if configurator else "parsed by the entry's own parser"
        return _check("parse", True, f"{len(args)} args {by}, stopped before training: {shown[:2000]}")
    except SystemExit as stop:
        last = last_error_line(err.getvalue())
        return _check("parse", False, last or f"the entry exited ({stop.code}) before parsing")
    except BaseException as err_:  # noqa: BLE001 - any failure before the parse is the answer "no"
        last = traceback.format_exception_only(type(err_), err_)[-1].strip()
        return _check("parse", False, f"running {target} up to its argument parsing failed: {last}")
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = orig_args, orig_known  # type: ignore[method-assign]
        builtins.exec = orig_exec
        sys.argv = argv0


def foreign_modules(root: Path) -> list[str]:
    """Modules loaded from outside the interpreter's own library, its site-packages, the
    reviewed files (the staged folder `root`) and the leg runtime: an import by absolute
    path or a `sys.path` edit that would fail on a fresh instance."""
    allowed = allowed_roots(root)
    found = []
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or name.startswith("_preflight"):
            continue
        where = Path(path).resolve()
        if not any(where == a or a in where.parents for a in allowed):
            found.append(f"{name} ({where})")
    return found


def run_checks(command: list[str], parser_name: str, modules: list[str]) -> list[dict[str, Any]]:
    checks = []
    try:
        kind, target, args = split_command(command)
        checks.append(_check("command shape", True, f"{kind} {target} with {len(args)} args"))
    except ValueError as err:  # a Refusal: the launcher refuses the rung (exit 3)
        return [{**_check("command shape", False, str(err)), "refused": isinstance(err, Refusal)}]
    if parser_name == "none":
        return checks + compile_only(kind, target, modules)
    if parser_name == "argv":
        os.environ[contract.MAX_STEPS] = "0"  # a trainer that gets past the parse anyway trains nothing
        configurator = configurator_of(kind, target)
        if configurator is None and not uses_argparse(Path.cwd()):
            checks.append(
                _check(
                    "parse",
                    False,
                    f"no reviewed file parses a command line with argparse, and "
                    f"{target} execs no configurator file: rung 0 cannot stop it after its arguments "
                    "are read without training; set trainer.parser: none (rung 0 then compiles the "
                    "reviewed files and checks their imports)",
                )
            )
        else:
            checks.append(run_to_parse(kind, target, args, configurator))
        checks += import_modules(modules)
        required, conditional = unresolved_imports(Path.cwd())
        outside = foreign_modules(Path.cwd()) + required
        detail = (
            "every module loaded came from the interpreter, its site-packages, the reviewed files or the leg runtime"
            if not outside
            else f"loaded from outside the reviewed files (gone on a fresh instance): {'; '.join(outside[:5])}"
        )
        if conditional:
            detail += (
                f"; note: imported only under an `if`, and not found here: {'; '.join(conditional[:5])} "
                "(a run that takes that branch fails)"
            )
        checks.append(_check("imports from reviewed files only", not outside, detail))
        return checks
    try:
        entry = import_entry(kind, target)
        checks.append(_check("import entry", True, f"imported {target}"))
    except BaseException as err:  # noqa: BLE001 - any import failure is the answer "no"
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return checks + [_check("import entry", False, f"importing {target} failed: {last}")]
    checks += import_modules(modules)
    checks.append(parse_with(entry, parser_name, args))
    return checks


def import_modules(modules: list[str]) -> list[dict[str, Any]]:
    checks = []
    for name in modules:
        try:
            importlib.import_module(name)
            checks.append(_check(f"import {name}", True, "imported"))
        except BaseException as err:  # noqa: BLE001
            last = traceback.format_exception_only(type(err), err)[-1].strip()
            checks.append(_check(f"import {name}", False, last))
    return checks


def compile_only(kind: str, target: str, modules: list[str]) -> list[dict[str, Any]]:
    """trainer.parser: none -- the entry is configured otherwise (config files, globals): rung 0
    compiles it and every reviewed .py file, imports the listed modules, and runs nothing."""
    import py_compile

    checks = []
    import tempfile

    files = sorted(Path.cwd().rglob("*.py"))
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            try:
                py_compile.compile(str(f), doraise=True, cfile=str(Path(tmp) / "x.pyc"))
            except py_compile.PyCompileError as err:
                bad.append(str(err).strip().splitlines()[-1])
    checks.append(
        _check(
            "compile",
            not bad,
            f"{len(files)} reviewed .py files compile (the entry is not run: "
            "trainer.parser is none, so its command line is not checked)"
            if not bad
            else bad[0],
        )
    )
    if kind == "module":
        checks.append(_check("entry found", importlib.util.find_spec(target) is not None, f"module {target}"))
    return checks + import_modules(modules)


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
        checks = run_checks(command, ns.parser, ns.module) + lightning_loader_checks(Path.cwd())
    finally:
        sys.stdout = real_stdout
    print(json.dumps({"checks": checks}))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

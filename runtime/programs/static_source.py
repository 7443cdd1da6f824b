"""Rung 0's reading of the reviewed files' source (nothing run): the configurator a script
execs to read its command line, whether any file uses argparse, and the imports a fresh
instance would not find. Standard library only, like runtime.programs.static_check which uses it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Iterator


def allowed_roots(root: Path) -> set[Path]:
    """Where a module may come from on a fresh instance: the interpreter's own library, its
    site-packages, the reviewed files (the staged folder `root`) and the leg runtime."""
    import site
    import sysconfig

    allowed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    allowed |= {Path(p).resolve() for p in site.getsitepackages() + [site.getusersitepackages()]}
    return allowed | {root.resolve(), Path(__file__).resolve().parents[1]}  # runtime/


def reviewed_trees(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    """Each reviewed .py file under `root` that parses, with its syntax tree."""
    for f in sorted(root.rglob("*.py")):
        try:
            yield f, ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue


def configurator_of(kind: str, target: str) -> str | None:
    """The file a script execs at module level to read its command line, nanoGPT's
    `exec(open("configurator.py").read())` (None: no such statement)."""
    source = _entry_source(kind, target)
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "exec"
            and len(call.args) == 1
        ):
            continue
        read = call.args[0]  # open("x").read()
        if isinstance(read, ast.Call) and isinstance(read.func, ast.Attribute) and read.func.attr == "read":
            opened = read.func.value
            if (
                isinstance(opened, ast.Call)
                and isinstance(opened.func, ast.Name)
                and opened.func.id == "open"
                and opened.args
                and isinstance(opened.args[0], ast.Constant)
                and isinstance(opened.args[0].value, str)
            ):
                return opened.args[0].value
    return None


def _entry_source(kind: str, target: str) -> str | None:
    try:
        if kind == "module":
            spec = importlib.util.find_spec(target)
            origin = spec.origin if spec is not None else None
            return Path(origin).read_text(encoding="utf-8") if origin and origin.endswith(".py") else None
        return Path(target).read_text(encoding="utf-8")
    except (OSError, ImportError, ValueError, UnicodeDecodeError):
        return None


ARGPARSE_NAMES = {"ArgumentParser", "HfArgumentParser", "parse_args", "parse_known_args", "argparse"}
"""A reviewed file naming one of these may parse the command line with argparse."""


def uses_argparse(root: Path) -> bool:
    """Whether any reviewed .py file names argparse or an argparse-style parser (read, not run)."""
    for _, tree in reviewed_trees(root):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Name)
                and node.id in ARGPARSE_NAMES
                or isinstance(node, ast.Attribute)
                and node.attr in ARGPARSE_NAMES
                or isinstance(node, (ast.Import, ast.ImportFrom))
                and any(a.name.split(".")[0] == "argparse" for a in node.names)
                or isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] == "argparse"
            ):
                return True
    return False


def unresolved_imports(root: Path) -> tuple[list[str], list[str]]:
    """Every module the reviewed files import (read from their source, nothing run), that a
    fresh instance would not find: not in the interpreter, its site-packages or the reviewed
    files. Imports inside `try:` are optional by intent and left out. Returns (required,
    conditional): an import under an `if` (nanoGPT's `if wandb_log: import wandb`) runs only
    when its branch does, so it is said as a note, not failed."""
    allowed = allowed_roots(root)
    names: dict[str, str] = {}
    conditional: set[str] = set()
    required: set[str] = set()
    for f, tree in reviewed_trees(root):
        optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for b in t.body for n in ast.walk(b)}
        branch = {
            id(n)
            for t in ast.walk(tree)
            if isinstance(t, ast.If) and not _is_main_guard(t)
            for n in ast.walk(t)
            if n is not t
        }
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            found = (
                [a.name.split(".")[0] for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module.split(".")[0]]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for name in found:
                names.setdefault(name, f.name)
                (conditional if id(node) in branch else required).add(name)
    conditional -= required  # imported unconditionally somewhere as well
    return (
        _unfound([(n, names[n]) for n in sorted(required)], allowed),
        _unfound([(n, names[n]) for n in sorted(conditional)], allowed),
    )


def _is_main_guard(node: ast.If) -> bool:
    """`if __name__ == "__main__":` -- its body runs whenever the script does."""
    test = node.test
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


def _unfound(names: list[tuple[str, str]], allowed: set[Path]) -> list[str]:
    bad = []
    for name, where in names:
        if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            bad.append(f"{name} (imported by {where}): not found")
            continue
        locations = [Path(p) for p in (spec.submodule_search_locations or [])] or (
            [Path(spec.origin)] if spec.origin and spec.origin not in ("built-in", "frozen") else []
        )
        if locations and not any(
            a == loc.resolve() or a in loc.resolve().parents for loc in locations for a in allowed
        ):
            bad.append(f"{name} (imported by {where}): from {locations[0]}")
    return bad

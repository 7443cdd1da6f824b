"""The tree's rules, read from the source (ast, nothing imported): what may import what,
how long a file or a function may grow, and no import cycle (a module-level one, one
inside a function, or one under TYPE_CHECKING)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "runtime")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
FORBIDDEN = {
    "launcher": {"torch"},  # the host never needs torch (DESIGN.md): `launcher --help` starts in a blink
    "runtime": {"launcher", "typer", "sky", "skypilot", "click"},  # the instance side knows no host code
}


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of launcher/ and runtime/."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module `name` imports (absolute names, relative ones resolved), anywhere in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names
                    if f"{base}.{alias.name}" in modules()]  # `from launcher import ledger` imports a module
    return out


def test_each_side_imports_only_what_it_may() -> None:
    bad = []
    for name, path in modules().items():
        banned = FORBIDDEN[name.split(".")[0]]
        bad += [f"{path.relative_to(ROOT)}:{line} imports {target}" for target, line in imports(name, path)
                if target.split(".")[0] in banned]
    assert not bad, "\n".join(bad)


def test_no_file_over_400_lines_and_no_function_over_60() -> None:
    long_files, long_functions = [], []
    for path in modules().values():
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_even_inside_a_function() -> None:
    names = modules()
    graph = {name: {target for target, _ in imports(name, path) if target in names and target != name}
             for name, path in names.items()}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds one
    found = cycles(graph)
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_every_check_says_its_kind_and_every_kind_is_made() -> None:
    """A check is selected by its `Kind`, never by its words (launcher/evidence.py): every
    `Check(...)` made in launcher/ passes `kind=Kind.X` (or a `kind` handed in), and every
    member of `Kind` is made somewhere — a kind nobody makes is a reader waiting for nothing."""
    evidence = ast.parse((ROOT / "launcher" / "evidence.py").read_text())
    kind_class = next(n for n in evidence.body if isinstance(n, ast.ClassDef) and n.name == "Kind")
    members = {t.id for n in kind_class.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    unkinded, made = [], set()
    for name, path in modules().items():
        if not name.startswith("launcher."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Kind":
                made.add(node.attr)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Check" \
                    and not any(k.arg == "kind" for k in node.keywords):
                unkinded.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unkinded, f"checks made without kind=: {unkinded}"
    assert len(members) > 40 and not members - made, f"kinds no check is made with: {sorted(members - made)}"

"""The tree's rules, read from the source (ast, nothing imported): what may import what
(launcher/'s floors; the runtime modules the host may import), how long a file or a function
may grow, no import cycle (a module-level one, one inside a function, or one under
TYPE_CHECKING), and every package saying what it holds."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "runtime")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
FORBIDDEN = {
    "launcher": {"torch"},  # the host never needs torch (docs/design.md): `launcher --help` starts in a blink
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


def module_level(tree: ast.AST) -> list[ast.AST]:
    """The nodes that run when the module is imported: no function body, no TYPE_CHECKING block."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo += child.orelse
                continue
            todo.append(child)
    return found


def imports(name: str, path: Path, on_import_only: bool = False) -> list[tuple[str, int]]:
    """Every module `name` imports (absolute names, relative ones resolved), anywhere in the file
    (`on_import_only`: only what importing the module runs)."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    for node in module_level(tree) if on_import_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules()]
            if len(submodules) < len(node.names):  # a name from the package's own namespace
                out.append((base, node.lineno))
            out += [(sub, node.lineno) for sub in submodules]  # `from runtime import events` imports a module
    return out


def test_each_side_imports_only_what_it_may() -> None:
    bad = []
    for name, path in modules().items():
        banned = FORBIDDEN[name.split(".")[0]]
        bad += [
            f"{path.relative_to(ROOT)}:{line} imports {target}"
            for target, line in imports(name, path)
            if target.split(".")[0] in banned
        ]
    assert not bad, "\n".join(bad)


def test_the_host_reaches_no_torch_through_the_runtime_modules_it_imports() -> None:
    """launcher/ imports no torch itself (above), nor through the runtime modules it imports:
    what importing those runs, followed to the end (each package's __init__ too), reaches none.
    `pip install preflight-launcher` brings no torch (pyproject.toml's [torch] extra);
    tests/install/test_install.py runs the CLI in such a venv."""
    names = modules()
    reached = {n: "" for n in names if n.startswith("launcher")}
    todo = list(reached)
    bad = []
    while todo:
        name = todo.pop()
        on_import_only = name.startswith("runtime")  # a launcher module's every import may run
        for target, line in imports(name, names[name], on_import_only):
            if target.split(".")[0] == "torch":
                bad.append(f"{names[name].relative_to(ROOT)}:{line} imports {target} (reached {reached[name]})")
            parts = target.split(".")
            for parent in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):  # `import a.b` runs a too
                if parent in names and parent not in reached:
                    reached[parent] = f"{reached[name]} <- {name}" if reached[name] else f"from {name}"
                    todo.append(parent)
    assert "runtime.events" in reached and "runtime.store.hub" in reached  # the walk does follow the host's imports
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
    graph = {
        name: {target for target, _ in imports(name, path) if target in names and target != name}
        for name, path in names.items()
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds one
    found = cycles(graph)
    assert not found, "\n".join(" <-> ".join(c) for c in found)


FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the commands", ("launcher.entry", "launcher.cli")),
    ("the plan", ("launcher.up", "launcher.plan")),
    ("the rungs and the report", ("launcher.rungs", "launcher.report")),
    ("the operations", ("launcher.ops",)),
    ("the checks", ("launcher.checks", "launcher.efficiency")),
    ("the leg", ("launcher.legs", "launcher.checks.watchdog")),
    ("the backends", ("launcher.backends", "launcher.image")),
    ("what a leg is given", ("launcher.manifest", "launcher.leg_env", "launcher.storekey")),
    (
        "the record and the settings",
        ("launcher.ledger", "launcher.config", "launcher.ladder", "launcher.cadence", "launcher.errors"),
    ),
    ("the vocabulary", ("launcher", "launcher.checks.evidence")),
)
"""launcher/'s floors, top first: a module imports from its own floor or the floors below it,
never from one above (docs/design.md, "Structure: a picture in words"). A module is on the floor
of the longest name here that holds it: launcher.checks.evidence (Check, Kind, LegEvents, read by
the legs, the backends and the errors alike) sits at the bottom, launcher.checks.watchdog (the
policy a live leg is watched by) on the leg's floor, the rest of launcher.checks on the checks'
floor. The errors share the ledger's floor: their table names who holds a locked one."""


def holds(member: str, name: str) -> bool:
    """A FLOORS entry holds the module of its name and, for a package, every module in it; the
    package face (launcher/__init__.py) holds only itself, so a new package is placed on purpose."""
    return name == member or (member != "launcher" and name.startswith(member + "."))


def floor_of(name: str) -> int | None:
    """The index in FLOORS of the floor holding module `name` (None: no floor holds it)."""
    best = None
    for index, (_, members) in enumerate(FLOORS):
        for member in members:
            if holds(member, name) and (best is None or len(member) > len(best[1])):
                best = (index, member)
    return best[0] if best else None


def floor_name(index: int) -> str:
    what, members = FLOORS[index]
    return f"floor {index} ({what}: {', '.join(members)})"


def test_no_upward_import_between_launcher_packages() -> None:
    """Every launcher/ module is on a floor, and none imports from a floor above its own,
    counting imports inside functions and under TYPE_CHECKING: a lower floor that needs a
    higher one's code gets the code moved down, or is handed what it needs."""
    names = [name for name in modules() if name.split(".")[0] == "launcher"]
    homeless = [name for name in names if floor_of(name) is None]
    assert not homeless, f"modules on no floor of FLOORS (tests/unit/test_layout.py): {homeless}"
    for _, members in FLOORS:
        assert all(any(holds(m, n) for n in names) for m in members), f"no such module: {members}"
    up = []
    for name in names:
        path, mine = modules()[name], floor_of(name)
        for target, line in imports(name, path):
            theirs = floor_of(target) if target.split(".")[0] == "launcher" else None
            if theirs is not None and mine is not None and theirs < mine:
                up.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target}, from a floor above its own: "
                    f"{name} is on {floor_name(mine)}, {target} on {floor_name(theirs)}"
                )
    assert not up, "upward imports (move the code down a floor, or hand it in from above):\n" + "\n".join(up)


RUNTIME_WIRE = ("runtime.contract", "runtime.events", "runtime.hashing", "runtime.metrics", "runtime.peaks")
"""The wire: what both sides read (the leg environment's names, the event lines, the hashes, the
loss arithmetic, the GPUs' peak rates). Torch-free, stdlib only."""
RUNTIME_FOR_THE_HOST = ("runtime", *RUNTIME_WIRE, "runtime.store")
"""All launcher/ may import of runtime/: the wire, the package face (`launcher init` finds the
reference trainer by its path) and the store (torch-free: the launcher reads a store itself).
The rest (the session, the checkpoint cycle, the programs) runs in a leg, by `python -m` when the
launcher starts it."""


def test_the_host_imports_of_the_runtime_only_the_wire_the_face_and_the_store() -> None:
    bad = []
    for name, path in modules().items():
        if name.split(".")[0] != "launcher":
            continue
        for target, line in imports(name, path):
            if target.split(".")[0] != "runtime":
                continue
            if not any(
                target == ok or (ok == "runtime.store" and target.startswith("runtime.store."))
                for ok in RUNTIME_FOR_THE_HOST
            ):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, f"launcher/ imports of runtime/ beyond {', '.join(RUNTIME_FOR_THE_HOST)}:\n" + "\n".join(bad)


def test_runtime_has_only_the_wire_at_its_top_and_the_wire_imports_only_itself_and_the_stdlib() -> None:
    import sys

    top = sorted(f"runtime.{p.stem}" for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert top == sorted(RUNTIME_WIRE), (
        f"modules flat in runtime/ other than the wire: {sorted(set(top) - set(RUNTIME_WIRE))} "
        "(a module of the instance side lives in the package named for what it holds)"
    )
    bad = []
    for name in RUNTIME_WIRE:
        path = modules()[name]
        for target, line in imports(name, path):
            if target.split(".")[0] not in sys.stdlib_module_names and target not in RUNTIME_WIRE:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "the wire imports only the stdlib and the wire:\n" + "\n".join(bad)


def test_every_package_says_what_it_holds() -> None:
    """Every folder of modules in launcher/ and runtime/ is a package whose __init__.py has a
    docstring saying what it holds."""
    folders = sorted({p.parent for package in PACKAGES for p in (ROOT / package).rglob("*.py")})
    bare = [f"{f.relative_to(ROOT)}/" for f in folders if not (f / "__init__.py").exists()]
    mute = [
        f"{(f / '__init__.py').relative_to(ROOT)}"
        for f in folders
        if (f / "__init__.py").exists()
        and not (ast.get_docstring(ast.parse((f / "__init__.py").read_text())) or "").strip()
    ]
    assert not bare, f"folders of modules with no __init__.py: {bare}"
    assert not mute, f"packages whose __init__.py has no docstring saying what they hold: {mute}"


def test_every_check_says_its_kind_and_every_kind_is_made() -> None:
    """A check is selected by its `Kind`, never by its words (launcher/checks/evidence.py): every
    `Check(...)` made in launcher/ passes `kind=Kind.X` (or a `kind` handed in), and every
    member of `Kind` is made somewhere — a kind nobody makes is a reader waiting for nothing."""
    evidence = ast.parse((ROOT / "launcher" / "checks" / "evidence.py").read_text())
    kind_class = next(n for n in evidence.body if isinstance(n, ast.ClassDef) and n.name == "Kind")
    members = {t.id for n in kind_class.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    unkinded, made = [], set()
    for name, path in modules().items():
        if not name.startswith("launcher."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Kind":
                made.add(node.attr)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Check"
                and not any(k.arg == "kind" for k in node.keywords)
            ):
                unkinded.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unkinded, f"checks made without kind=: {unkinded}"
    assert len(members) > 40 and not members - made, f"kinds no check is made with: {sorted(members - made)}"


MAX_TOP_MODULES = 12
RUNG_MODULES = ("static", "rehearsal", "smoke", "probe", "run", "run_sky", "drill", "drill_preempt")


def test_launcher_is_in_rooms_and_each_rung_is_climbed_one_way() -> None:
    """At most 12 modules flat in launcher/ (the rest in packages named for what they hold), every
    rung module named for its rung with one entry, `climb`, and one function called `run_rung`
    (the dispatcher): three functions of that name once did three different things."""
    top = sorted(p.name for p in (ROOT / "launcher").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules flat in launcher/: {top}"
    named: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.col_offset == 0:
                named.setdefault(node.name, []).append(name)
    assert named["run_rung"] == ["launcher.rungs"], named["run_rung"]
    for rung in RUNG_MODULES:
        assert f"launcher.rungs.{rung}" in named["climb"], f"launcher/rungs/{rung}.py has no climb()"
    from launcher.ladder import DRILL, RUNGS

    for entry in (*RUNGS, DRILL):
        for runner in filter(None, (entry.runner, entry.runner_sky)):
            module, function = runner.split(":")
            assert function == "climb" and module in RUNG_MODULES, f"{entry.name}: runner {runner}"


def test_runtime_exports_session_without_loading_torch_for_the_wire_format() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runtime.events, runtime.store; assert 'torch' not in sys.modules, 'torch loaded'; "
        "from runtime import Session; from runtime.session import Session as S; assert Session is S"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_fakes_keep_to_the_source_cap() -> None:
    """The stand-ins are code the suite trusts as much as the product: the same 400-line cap."""
    fakes = sorted((ROOT / "tests" / "fakes").glob("*.py"))
    assert len(fakes) >= 10, fakes  # the stand-ins are here, not back in tests/
    long = [
        f"{p.relative_to(ROOT)}: {p.read_text().count(chr(10))} lines"
        for p in fakes
        if p.read_text().count("\n") > MAX_FILE_LINES
    ]
    assert not long, "\n".join(long)

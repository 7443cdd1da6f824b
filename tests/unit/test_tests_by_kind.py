"""Tests select a run's checks by their `Kind` (tests/helpers.py: `check`, `checks_of`, `failed`,
`details`), never by their display text, which is free to change: this scans every test file
(ast, nothing imported) for a lookup by name and holds their count at 0.

What counts as a lookup by name:
- a comprehension or `for` loop over something named `...checks...` (a run's `checks`,
  `outcome.checks`, `res.json()["checks"]`) that reads the name of what it iterates
  (`c["name"]`, `c.get("name")`, `c.name`): a mapping keyed by name, `next(c for c in checks
  if c["name"] == ...)`, a filter on the name's ending;
- a mapping of checks (a name ending in `checks`, or `bad`) subscripted,
  `.get()` or tested for membership (`in`) with a string or f-string: `checks["leg 0 finished"]`,
  `bad.get("...")`, `"leg 0 stopped on sigterm" in bad`.

tests/helpers.py is left out: its `check` names the checks it found in its failure message.
A test that asserts a check's wording on purpose selects the check by kind first, then reads
`["name"]` or `["detail"]` of what `check` returned (not a comprehension over checks)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
LEFT_OUT = {TESTS / "helpers.py"}
MAPPINGS = {"bad"}


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _is_checks(node: ast.AST) -> bool:
    """An expression that reads a run's checks (its source mentions `checks`)."""
    return "checks" in ast.unparse(node)


def _is_mapping(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and (node.id.endswith("checks") or node.id in MAPPINGS)


def _reads_name_of(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` reads `x["name"]`, `x.get("name")` or `x.name` of a variable in `names`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) and sub.value.id in names:
            if isinstance(sub.slice, ast.Constant) and sub.slice.value == "name":
                return True
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in names:
            if sub.attr == "name":
                return True
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "get"
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id in names
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
            and sub.args[0].value == "name"
        ):
            return True
    return False


def _targets(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def lookups_by_name(source: str) -> list[tuple[int, str]]:
    """(line, code) of every lookup of a check by its display text in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            names = set().union(*(_targets(g.target) for g in node.generators if _is_checks(g.iter)))
            hit = bool(names) and _reads_name_of(node, names)
        elif isinstance(node, ast.For) and _is_checks(node.iter):
            hit = any(_reads_name_of(stmt, _targets(node.target)) for stmt in node.body)
        elif isinstance(node, ast.Subscript) and _is_mapping(node.value):
            hit = _is_text(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            hit = _is_text(node.left) and any(_is_mapping(c) for c in node.comparators)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            hit = _is_mapping(node.func.value) and bool(node.args) and _is_text(node.args[0])
        if hit:
            found.append((node.lineno, ast.unparse(node)[:120]))
    return found


def test_no_test_looks_a_check_up_by_its_display_text() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: {code}"
        for path in sorted(TESTS.rglob("*.py"))
        if path not in LEFT_OUT
        for line, code in lookups_by_name(path.read_text())
    ]
    assert found == [], "select checks by kind (tests/helpers.py check/checks_of):\n" + "\n".join(found)


def test_the_scan_finds_each_form_of_lookup_and_passes_a_selection_by_kind() -> None:
    by_name = [
        'checks = {c["name"]: c for c in res.json()["checks"]}',
        'leg0 = next(c for c in res.json()["checks"] if c["name"] == "leg 0 finished")',
        '[loop] = [c for c in outcome.checks if c.name == "the run makes progress"]',
        'resumed = [c for c in out["checks"] if c.get("name", "").endswith("resumed")]',
        'x = checks[f"leg {leg} killed {moment}"]["detail"]',
        'assert "leg 0 stopped on sigterm" in bad',
        'detail = bad.get("resumed run = straight-through run", "")',
        'for c in run["checks"]:\n    if c["name"] == "x":\n        pass',
    ]
    for code in by_name:
        assert lookups_by_name(code), code
    by_kind = [
        "leg0 = check(res, Kind.LEG_FINISHED, leg=0)",
        'assert "epoch" in check(bad, Kind.FIELDS_STRAIGHT)["detail"]',
        "moments = {c['leg']: c['facts']['moment'] for c in checks_of(checks, Kind.KILLED)}",
        'assert s["checkpoints"]["newest_verified"]["name"] == st["checkpoint"]',
        "listed = {c.name: c.verified for c in store.list()}",
        "first = checks[0]",
    ]
    for code in by_kind:
        assert not lookups_by_name(code), code

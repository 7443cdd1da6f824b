"""Rung 0's look at a Lightning script's training loader, from its source alone (no import, no torch).

The Lightning adapter makes a plain `DataLoader` resumable at the leg's start
(runtime.adapters.lightning_data) and refuses, exit 3, the ones it cannot rebuild. The two
that show in the source are said here first, before any leg: the loader handed to
`trainer.fit(model, loader, ...)` (or `train_dataloaders=loader`) assigned once, in the same
file, from a `DataLoader(...)` call with a `batch_sampler=` of its own, or over a dataset
whose class the file defines as an `IterableDataset`. Anything less certain (a loader built
elsewhere, assigned twice, a sampler of unknown order) is left to the leg: no false alarm here.
A `Trainer(strategy=...)` the adapter has not run (spawned ranks, sharded state) is refused
outright (exit 3), the strategy to use named.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ADAPTER = "runtime.adapters.lightning"
FIX = "pass a torchdata StatefulDataLoader whose sampler's order is a function of (seed, epoch) with set_epoch"


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _uses_adapter(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == ADAPTER for n in ast.walk(tree)) or any(
        isinstance(n, ast.Import) and any(a.name == ADAPTER for a in n.names) for n in ast.walk(tree)
    )


def _fit_loaders(tree: ast.Module) -> list[str]:
    """Names handed to a `.fit(...)` call as its training loader."""
    names = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n.func) == "fit"):
        args = [k.value for k in call.keywords if k.arg == "train_dataloaders"] or call.args[1:2]
        names += [a.id for a in args if isinstance(a, ast.Name)]
    return names


def _problem(call: ast.Call, iterable: set[str]) -> str | None:
    if any(k.arg == "batch_sampler" for k in call.keywords):
        return "a custom batch_sampler, whose position after a resume cannot be told"
    dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
    if isinstance(dataset, ast.Call) and _name(dataset.func) in iterable:
        return f"an IterableDataset ({_name(dataset.func)}), whose position cannot be saved from outside"
    return None


def problems(path: Path) -> list[str]:
    """`file:line: ...` for each training loader in `path` the Lightning adapter will refuse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []  # the compile check says so
    if not _uses_adapter(tree):
        return []
    iterable = {
        c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and "IterableDataset" in map(_name, c.bases)
    }
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
    found = []
    for name in _fit_loaders(tree):
        values = assigned.get(name, [])
        call = values[0] if len(values) == 1 else None
        if isinstance(call, ast.Call) and _name(call.func) == "DataLoader":
            why = _problem(call, iterable)
            if why:
                found.append(f"{path.name}:{call.lineno}: the training DataLoader `{name}` has {why}: {FIX}")
    return found


_SPAWNS = "starts its ranks by spawning (or forking) this process, which the adapter's state does not cross"
_SHARDS = "shards the model and optimizer over the ranks, where the adapter writes one file from rank 0"
UNRUN = {"spawn": _SPAWNS, "fork": _SPAWNS, "notebook": _SPAWNS, "fsdp": _SHARDS, "deepspeed": _SHARDS}
"""Strategies the adapter has not run (what each would break): a leg of one is refused at rung 0,
before it trains. Run on several ranks: strategy="ddp" under Lightning's own launcher or torchrun."""


def strategy_problems(path: Path) -> list[str]:
    """`file:line: ...` for each `Trainer(strategy=...)` in `path` naming a strategy in UNRUN (a
    string, or FSDPStrategy/DeepSpeedStrategy); a strategy the source does not spell is left alone."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []
    if not _uses_adapter(tree):
        return []
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n.func) == "Trainer"):
        for value in (k.value for k in call.keywords if k.arg == "strategy"):
            said = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
            if isinstance(value, ast.Call) and _name(value.func) in ("FSDPStrategy", "DeepSpeedStrategy"):
                said = str(_name(value.func)).lower()
            why = next((w for key, w in UNRUN.items() if said is not None and key in said.lower()), None)
            if why:
                found.append(
                    f"{path.name}:{value.lineno}: Trainer(strategy={said!r}) {why}: not run by the Lightning adapter; "
                    'use strategy="ddp" (Lightning\'s own launcher or torchrun)'
                )
    return found


def lightning_loader_checks(root: Path) -> list[dict[str, Any]]:
    """One check where a reviewed file uses the Lightning adapter (none elsewhere)."""
    files = sorted(root.rglob("*.py"))
    users = [f for f in files if "runtime.adapters.lightning" in f.read_text(encoding="utf-8", errors="replace")]
    if not users:
        return []
    found = [line for f in users for line in problems(f)]
    detail = (
        found[0]
        if found
        else (
            "no training loader the Lightning adapter refuses seen in the source (it checks the loader again at the "
            "leg's start)"
        )
    )
    checks = [{"name": "Lightning training loader resumable", "ok": not found, "detail": detail}]
    unrun = [line for f in users for line in strategy_problems(f)]
    if unrun:  # refused outright (the launcher exits 3): a leg would fail or hang, not prove anything
        checks.append({"name": "Lightning strategy", "ok": False, "detail": unrun[0], "refused": True})
    return checks

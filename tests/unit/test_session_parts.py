"""The Session owns its parts: every attribute it sets is declared in `__init__`, no function
in runtime/ takes the session (or an adapter) as an untyped `Any`, what a resume starts from is a
frozen value, and the leg's end is an exception that still exits with the leg's code."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "runtime" / "session" / "core.py"


def _session_class() -> ast.ClassDef:
    tree = ast.parse(CORE.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")


def _self_targets(func: ast.FunctionDef) -> set[str]:
    """Names X of every `self.X = ...`, `self.X: T = ...`, `self.X += ...` in `func` (tuples and chains too)."""
    names: set[str] = set()

    def visit(target: ast.expr) -> None:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            names.add(target.attr)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                visit(elt)

    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                visit(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            visit(node.target)
    return names


def test_every_attribute_the_session_sets_is_declared_in_init() -> None:
    cls = _session_class()
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    init = next(m for m in methods if m.name == "__init__")
    properties = {
        m.name
        for m in methods
        if any(
            (isinstance(d, ast.Name) and d.id == "property") or (isinstance(d, ast.Attribute) and d.attr == "setter")
            for d in m.decorator_list
        )
    }
    declared = _self_targets(init) | properties
    late = {f"{m.name}: self.{name}" for m in methods if m is not init for name in _self_targets(m) - declared}
    assert not late, f"set outside Session.__init__ without a declaration there: {sorted(late)}"
    assert {"store", "pusher", "health", "resumed", "saver", "reason"} <= declared


def _any_session_params() -> list[str]:
    found = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg in ("sess", "session", "pf") and (
                    arg.annotation is None or ast.unparse(arg.annotation) == "Any"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_no_function_in_runtime_takes_the_session_as_any() -> None:
    assert not _any_session_params()


def test_what_a_resume_starts_from_is_frozen() -> None:
    from runtime.session.resume import Choice, Parts, Resumed
    from runtime.session.saver import AtStep

    resumed = Resumed(step=5, tokens=640, checkpoint="step-00000005", skipped=frozenset({"step-00000010"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        resumed.step = 6  # type: ignore[misc]
    for value in (Choice, Parts, AtStep):
        assert value.__dataclass_params__.frozen, value.__name__  # type: ignore[attr-defined]


def test_a_fresh_session_resumes_at_step_0_with_a_frozen_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import torch

    from runtime import contract
    from runtime.session import Session
    from runtime.session.resume import Resumed

    for name in (contract.FILES_SHA256, contract.STORE, contract.MAX_STEPS, contract.DEADLINE):
        monkeypatch.delenv(name, raising=False)
    model = torch.nn.Linear(2, 2)
    sess = Session(workdir=tmp_path, device="cpu", ckpt_every=1, async_save=False)
    assert (sess.store, sess.pusher, sess.health, sess.resumed) == (None, None, None, Resumed())
    sess.track(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    handler = signal.getsignal(signal.SIGTERM)  # resume() installs the leg's own
    try:
        assert sess.resume() == 0
        assert sess.resumed == Resumed() and sess.store is not None and sess.pusher is not None
        with pytest.raises(dataclasses.FrozenInstanceError):
            sess.resumed.step = 3  # type: ignore[misc]
    finally:
        if sess.pusher is not None:
            sess.pusher.drain()
        sess.world.close()
        signal.signal(signal.SIGTERM, handler)


def test_the_legs_end_is_a_system_exit_with_its_code_and_reason() -> None:
    from runtime.contract import EXIT_REFUSED
    from runtime.session.rules import LegEnd

    with pytest.raises(SystemExit) as raised:
        raise LegEnd(EXIT_REFUSED, "stale_code")
    assert raised.value.code == EXIT_REFUSED
    assert isinstance(raised.value, LegEnd) and raised.value.reason == "stale_code"


def test_the_adapters_share_the_sessions_saver_and_resume() -> None:
    """Each framework adapter resumes through LegAdapter.resume_from and saves through the
    Session's Saver: none makes its own pusher, restores by itself or calls sys.exit."""
    common = (ROOT / "runtime" / "adapters" / "common.py").read_text()
    assert (
        "from runtime.session.saver import Saver" in common and "from runtime.session.resume import Resumed" in common
    )
    for name in ("hf", "lightning", "accelerate"):
        src = (ROOT / "runtime" / "adapters" / f"{name}.py").read_text()
        assert "self.resume_from(" in src and "self.open_saver(" in src, name
        assert not [w for w in ("Pusher(", "restore_newest", "sys.exit(", "write_manifest") if w in src], name
    for path in [*(ROOT / "runtime" / "session").glob("*.py"), *(ROOT / "runtime" / "adapters").glob("*.py")]:
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        exits = [c.lineno for c in calls if ast.unparse(c.func) == "sys.exit"]
        assert not exits, f"{path.name}:{exits}"  # the leg's end is LegEnd, with its reason

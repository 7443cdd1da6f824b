"""Torch's process-wide hooks, shared by every watcher, so nothing of the session's is ever stored
in a user's module or optimizer.

A hook registered on a module (`module.register_forward_pre_hook`) lives in the module's own
`_forward_pre_hooks`, and whatever the module goes through, the hook goes through too: measured
on pytorch/examples' word_language_model, which saves its whole model (`torch.save(model, f)`):
before the first forward the save failed ("Can't pickle local object
'StepEvidence.trains_from.<locals>.emit'"); after it the hook was pickled into the file and the
script's own `torch.load(f, weights_only=True)` refused it ("Unsupported global: GLOBAL
getattr"). `copy.deepcopy(model)` copied the session's evidence with it.

Here one pair of torch's global module hooks (`register_module_forward_pre_hook`, which runs
before the forward and sees its positional arguments; `register_module_forward_hook(...,
with_kwargs=True)`, which sees positional and keyword arguments) dispatches to the watcher of
each watched module, found by identity through weak references. The pair is registered while
some module is watched and removed when none is (the module or its watcher collected, or
`unwatch`), and a module has one watcher: the newest (a new `Session` on the same model takes
it over). While registered, every module call in the process takes torch's hooked path instead
of its no-hook fast path, and runs one dictionary lookup of ours (bench/session_overhead.py
measures the cost). Inside a graph `torch.compile` traces, the hooks do nothing; a tracked
model compiled after `track()` is seen through its wrapper (`OptimizedModule`, whose hooks torch
runs outside the graph; measured on torch 2.13: the model's own hooks are traced into the graph
when any global hook exists).

`count_optimizer_steps` does the same for optimizers (`register_optimizer_step_post_hook`):
every optimizer's steps in the process, tracked or not.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from typing import Any, Callable, Protocol

import torch
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer


class Watcher(Protocol):
    def before(self, module: torch.nn.Module) -> None: ...

    def after(self, module: torch.nn.Module, named: dict[str, Any]) -> None: ...


_WATCHED: dict[int, tuple[weakref.ref[torch.nn.Module], weakref.ref[Any]]] = {}
"""id(module) -> (the module, its watcher), both weakly."""
_HANDLES: list[Any] = []
_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature | None] = weakref.WeakKeyDictionary()
"""A forward's function -> its signature (None: none could be read)."""


_WRAPPED: set[int] = set()
"""Watched modules inside a call of their `torch.compile` wrapper: the wrapper's hooks saw it."""


def _entry(module: torch.nn.Module) -> tuple[Any, torch.nn.Module | None]:
    """(the watcher, the watched module) this call is a forward of; (None, None) if none."""
    if torch.compiler.is_compiling():  # traced into a graph: nothing of ours in it
        return None, None
    entry = _WATCHED.get(id(module))
    if entry is not None:
        if id(module) in _WRAPPED:  # its compiled wrapper's hooks already saw this call
            return None, None
    else:  # `torch.compile(model)` after `track(model)`: the wrapper's call is the model's
        inner = module._modules.get("_orig_mod")
        entry = _WATCHED.get(id(inner)) if inner is not None else None
        if entry is None:
            return None, None
        module = inner
    if entry[0]() is not module:
        return None, None
    return entry[1](), module


def _pre(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    watcher, watched = _entry(module)
    if watcher is not None and watched is not None:
        if watched is not module:
            _WRAPPED.add(id(watched))
        watcher.before(watched)


def _post(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    if _WRAPPED and module._modules.get("_orig_mod") is not None:
        _WRAPPED.discard(id(module._modules["_orig_mod"]))
    watcher, watched = _entry(module)
    if watcher is not None and watched is not None:
        watcher.after(watched, forward_arguments(watched, args, kwargs))


def _register() -> None:
    if _HANDLES:
        return
    # torch warns at every compiled module's call while any global hook is registered (they
    # would fire once more for the wrapper); ours match watched modules only
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    _HANDLES.append(_module.register_module_forward_pre_hook(_pre))
    _HANDLES.append(_module.register_module_forward_hook(_post, with_kwargs=True))


def _unregister() -> None:
    while _HANDLES:
        handle = _HANDLES.pop()
        handle.remove()
        # torch's handle forgets the with_kwargs flag it set (torch 2.13): drop it, or torch
        # counts a global hook forever (`_has_any_global_hook`)
        getattr(_module, "_global_forward_hooks_with_kwargs", {}).pop(handle.id, None)


def _forget(dead: weakref.ref[Any]) -> None:
    """A watched module or a watcher was collected: drop its entries, the hooks with the last."""
    for key, (mod, watcher) in list(_WATCHED.items()):
        if mod is dead or watcher is dead:
            _WATCHED.pop(key, None)
    if not _WATCHED:
        _unregister()


def watch(module: torch.nn.Module, watcher: Watcher) -> None:
    """`watcher.before(module)` before each forward of `module`, `watcher.after(module, named)`
    after it, with its arguments by name (`forward_arguments`)."""
    _WATCHED[id(module)] = (weakref.ref(module, _forget), weakref.ref(watcher, _forget))
    _register()


def unwatch(watcher: Watcher) -> None:
    """Every module `watcher` watches, no longer watched."""
    for key, (_, ref) in list(_WATCHED.items()):
        if ref() is watcher:
            _WATCHED.pop(key, None)
    if not _WATCHED:
        _unregister()


def watched() -> int:
    """How many modules are watched (the hooks are registered while any is)."""
    return len(_WATCHED)


def _signature(module: torch.nn.Module) -> inspect.Signature | None:
    module = module._modules.get("_orig_mod") or module  # a compiled wrapper's forward takes *args
    forward = module.forward
    key = getattr(forward, "__func__", forward)
    try:
        return _SIGNATURES[key]
    except (KeyError, TypeError):
        pass
    try:
        sig: inspect.Signature | None = inspect.signature(forward)
    except (TypeError, ValueError):
        sig = None
    try:
        _SIGNATURES[key] = sig
    except TypeError:  # not weakly referable: read again next time
        pass
    return sig


def forward_arguments(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A forward's arguments by the names its signature gives them (`forward(input, hidden)`
    called as `model(x, h)`: {"input": x, "hidden": h}); `**kwargs` spread by their own names;
    positionals the signature does not name are `args.<i>`."""
    sig = _signature(module)
    if sig is not None:
        try:
            bound = sig.bind_partial(*args, **kwargs)
        except TypeError:
            pass
        else:
            out: dict[str, Any] = {}
            for name, value in bound.arguments.items():
                if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    out.update(value)
                else:
                    out[name] = value
            return out
    return {**{f"args.{i}": a for i, a in enumerate(args)}, **kwargs}


_STEP_COUNTERS: dict[int, Callable[[Any], None]] = {}
_OPT_HANDLES: list[Any] = []


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    for count in list(_STEP_COUNTERS.values()):
        count(optimizer)


def count_optimizer_steps(owner: object, count: Callable[[Any], None]) -> None:
    """`count(optimizer)` after every optimizer step in the process, while `owner` lives
    (`count` must not hold `owner`)."""
    key = id(owner)
    _STEP_COUNTERS[key] = count

    def drop(_: Any) -> None:
        _STEP_COUNTERS.pop(key, None)
        if not _STEP_COUNTERS and _OPT_HANDLES:
            _OPT_HANDLES.pop().remove()

    weakref.finalize(owner, drop, None)
    if not _OPT_HANDLES:
        _OPT_HANDLES.append(_optimizer.register_optimizer_step_post_hook(_optimizer_stepped))

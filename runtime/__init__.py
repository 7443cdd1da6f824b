"""preflight runtime: what runs inside a leg (the instance side).

Submodules that need torch import it themselves; `runtime.events` and
`runtime.store` are torch-free so the host can read the same wire format.
Never imports typer or skypilot.

`from runtime import Session` is the trainer's way in (runtime.session); the
framework adapters are `runtime.adapters.hf`, `.lightning` and `.accelerate`,
each exposing `Preflight`. Session is loaded on first use, so importing
`runtime.events` still costs no torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Session"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from runtime.session import Session

        return Session
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")

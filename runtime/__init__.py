"""preflight runtime: what runs inside a leg (the instance side).

Four audiences, four kinds of place:
- the wire, torch-free modules at the top that both sides import: `contract` (exit codes, events,
  the leg's environment), `events` (the event lines), `hashing`, `metrics` (throughput, ETA and
  loss-continuity arithmetic) and `peaks` (accelerators' peak FLOP/s); with `store/` (the
  checkpoint stores), these are all the launcher imports (tests/unit/test_layout.py holds it);
- the trainer's API: `session/` (`from runtime.session import Session`) and `adapters/` (HF
  `Trainer`, Lightning, Accelerate), built on `checkpoint/` (a checkpoint's disk, push, read-back
  and restore) and `measure/` (step time, FLOPs, health, the metrics window);
- `programs/`: what the launcher runs with `python -m` in the trainer's interpreter;
- `reference/`: the trainer `launcher init` copies, with its model and data.

`from runtime import Session` works too; Session is loaded on first use, so importing
`runtime.events` still costs no torch. Never imports typer or skypilot.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Session"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from runtime.session import Session

        return Session
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")

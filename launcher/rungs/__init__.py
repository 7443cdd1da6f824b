"""The rungs, one module each, run by the function the ladder names (launcher.ladder:
each Rung's `runner`, "module:function" inside this package).

  static.py     rung 0: on the host, no leg
  resume.py     rungs 1-2 (rehearsal, smoke): three legs ended by SIGTERM, deadline, end;
                on the CPU the straight-through run, the oracle
  probe.py      rung 3: a measured leg, then a cold resume
  chain.py      rung 4 on local or docker: leg after leg to the last step
  chain_sky.py  rung 4 on sky: the run as one managed job
  drill.py      `launcher drill cold-resume`: kill and relaunch, recorded like a rung

Every runner takes the run's context and the review's hash comparison and returns
its checks. The resume checks they share are launcher.resume_checks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from launcher.evidence import Check
    from launcher.legs import RunContext


def runner_of(runner: str) -> Callable[..., "list[Check]"]:
    """The function a ladder entry names ("module:function", the module under launcher.rungs)."""
    module, function = runner.split(":")
    return getattr(importlib.import_module(f"launcher.rungs.{module}"), function)


def run_rung(ctx: "RunContext", cmp: Any) -> "list[Check]":
    """Run the context's rung with the function the ladder names for it (the run rung on
    sky: its managed job)."""
    on_sky = ctx.backend.name == "sky" and ctx.rung.runner_sky
    return runner_of(ctx.rung.runner_sky if on_sky else ctx.rung.runner)(ctx, cmp)

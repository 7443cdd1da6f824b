"""The rungs, one module each, named for the rung; each exposes `climb`, the function the
ladder names for it (launcher.ladder: each Rung's `runner`, "module:function" inside this
package). `run_rung` below picks and calls it.

  static.py         rung 0: on the host, no leg
  rehearsal.py      rung 1: three legs ended by SIGTERM, deadline, end; then the oracle
  smoke.py          rung 2: the same legs on the accelerator
  resume_legs.py    the three legs rehearsal and smoke share
  probe.py          rung 3: a measured leg, then a cold resume
  run.py            rung 4 on local or docker: leg after leg to the last step
  run_sky.py        rung 4 on sky: the run as one managed job
  drill.py          `launcher drill cold-resume`: kill and relaunch, recorded like a rung
  drill_moments.py  when the drill kills
  drill_preempt.py  `launcher drill preempt`: a spot machine taken with notice

Every rung's `climb` takes the run's context and the review's hash comparison (the drills
also take their kills or notice) and returns its checks. The checks they share are in
launcher.checks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from launcher.checks.evidence import Check
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

"""Rung 1, rehearsal: the whole control flow with the real modules, on the CPU, in minutes.

Three legs, each on a fresh empty disk, ended by SIGTERM, by the deadline and by the last
step (launcher.rungs.resume_legs); then the same trainer straight through once, the oracle
the resumed legs are compared with, batch for batch and loss for loss where the run is
deterministic.
"""

from __future__ import annotations

from launcher.checks.evidence import Check
from launcher.legs import RunContext
from launcher.rungs.resume_legs import run_resume_legs


def climb(ctx: RunContext, cmp: object = None) -> list[Check]:
    """The rung's configured steps, on the CPU."""
    return run_resume_legs(ctx, ctx.cfg.rung(ctx.rung.name).steps, need_gpu=ctx.rung.needs_gpu)

"""Rung 2, smoke: the rehearsal's three legs on the accelerator, in about ten minutes.

The same legs as the rehearsal (launcher.rungs.resume_legs), each on a fresh instance; every
leg must also have run on the GPU it asked for (its `device` event), one real optimizer step,
one push, one verified resume at least.
"""

from __future__ import annotations

from launcher.checks.evidence import Check
from launcher.legs import RunContext
from launcher.rungs.resume_legs import run_resume_legs


def climb(ctx: RunContext, cmp: object = None) -> list[Check]:
    """The rung's configured steps, every leg on the accelerator (unless `--cpu`)."""
    return run_resume_legs(ctx, ctx.cfg.rung(ctx.rung.name).steps, need_gpu=ctx.rung.needs_gpu)

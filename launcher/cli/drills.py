"""The drill commands' requests (`launcher drill cold-resume | preempt | hang`): each checked as
bad input first (exit 2), nothing recorded, then handed to launcher.up.execute, which plans,
guards, records and runs it like a rung (the drills themselves: launcher.rungs.drill,
launcher.rungs.drill_preempt, launcher.rungs.drill_hang)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from launcher.backends import BACKENDS, backend_class
from launcher.config.parse import plain_float, plain_int
from launcher.config.schema import Config, parse_gpus
from launcher.errors import BadInput
from launcher.ladder import DRILL
from launcher.plan import Request
from launcher.up import Outcome, check_nodes, execute

MAX_KILLS = 100


def drill(
    cfg: Config,
    config_path: Path,
    backend_name: str,
    gpus_text: str | None,
    kills: int | None,
    moment: str,
    show: Callable[[int, str], None],
    seed: int = 0,
    allow_overdraft: bool = False,
    kills_at: str | None = None,
    nodes: int = 1,
) -> Outcome:
    """`launcher drill cold-resume`: recorded like a rung, run by launcher.rungs.drill (`moment`:
    `--at`, one moment or a comma list of one per kill; `kills` None: the default for it)."""
    from launcher.ladder import DRILL
    from launcher.rungs.drill import climb as run_drill
    from launcher.rungs.drill_moments import NODE_LOST, parse_at

    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    moments, kills = parse_at(moment, kills, gpus_text is not None, kills_at is not None)
    if not 1 <= kills <= MAX_KILLS:
        raise BadInput(
            f"--kills must be 1 to {MAX_KILLS}, got {kills}",
            hint=f"each kill is a relaunched leg; run several drills for more than {MAX_KILLS}",
        )
    check_nodes(nodes)
    if NODE_LOST in moments and (nodes < 2 or not backend_class(backend_name).can_lose_node):
        raise BadInput(
            f"--at {NODE_LOST} loses one node of several: it needs --nodes 2 or more on a backend "
            f"that can lose one (local, docker), not --nodes {nodes} on {backend_name}"
        )
    steps = cfg.rungs.drill.steps
    at_steps = parse_kill_steps(kills_at, steps) if kills_at is not None else None
    if at_steps is not None:
        kills = len(at_steps)
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    rung = dataclasses.replace(DRILL, legs=kills + 1, needs_gpu=gpus is not None)
    return execute(
        cfg,
        config_path,
        Request(rung, backend_name, gpus, nodes, allow_overdraft),
        show,
        lambda ctx, cmp: run_drill(ctx, steps, kills, moments, seed, at_steps),
    )


def preempt(
    cfg: Config,
    config_path: Path,
    backend_name: str,
    notice: str,
    at_step: int | None,
    show: Callable[[int, str], None],
    allow_overdraft: bool = False,
) -> Outcome:
    """`launcher drill preempt`: recorded like the drill, run by launcher.rungs.drill_preempt."""
    from launcher.cadence import NOTICE_S
    from launcher.ladder import DRILL
    from launcher.rungs.drill_preempt import climb as run_preempt

    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    if not backend_class(backend_name).can_terminate:
        raise BadInput(
            f"the {backend_name} backend cannot send a leg SIGTERM: `drill preempt` runs on local and docker"
        )
    try:
        notice_s = NOTICE_S[notice] if notice in NOTICE_S else plain_float(notice)
    except ValueError:
        raise BadInput(f"--notice takes seconds or one of {', '.join(NOTICE_S)}, got {notice!r}") from None
    if not 0 <= notice_s <= 600:
        raise BadInput(f"--notice must be 0 to 600 seconds, got {notice_s:g}")
    steps = cfg.rungs.drill.steps
    at = at_step if at_step is not None else steps // 2
    if not 1 <= at < steps:
        raise BadInput(f"--at-step must lie in 1..{steps - 1} (the drill runs {steps} steps), got {at}")
    rung = dataclasses.replace(DRILL, legs=2, oracle=False)  # its question is the notice, not the timeline
    return execute(
        cfg,
        config_path,
        Request(rung, backend_name, None, 1, allow_overdraft),
        show,
        lambda ctx, cmp: run_preempt(ctx, steps, notice_s, at),
    )


def parse_kill_steps(text: str, steps: int) -> list[int]:
    """`--kills-at 7,15`: steps in increasing order, each inside the drill's run (1 .. steps-1)."""
    try:
        found = [plain_int(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"--kills-at takes steps separated by commas, e.g. 7,15; got {text!r}") from None
    if not found or len(found) > MAX_KILLS:
        raise BadInput(f"--kills-at takes 1 to {MAX_KILLS} steps, got {len(found)}")
    if any(b <= a for a, b in zip(found, found[1:])) or found[0] < 1 or found[-1] >= steps:
        raise BadInput(
            f"--kills-at steps must increase and lie in 1..{steps - 1} (the drill runs {steps} steps), got {text!r}"
        )
    return found


def hang(
    cfg: Config,
    config_path: Path,
    backend_name: str,
    rank: int,
    at_step: int | None,
    nodes: int,
    show: Callable[[int, str], None],
    allow_overdraft: bool = False,
    how: str = "stop",
) -> Outcome:
    """`launcher drill hang`: checked as bad input first (exit 2), then recorded and run like
    every drill (launcher.up.execute)."""
    from launcher.rungs.drill_hang import HOWS, climb

    if how not in HOWS:
        raise BadInput(f"--how takes {' or '.join(HOWS)}, got {how!r}")

    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    if not backend_class(backend_name).can_look:
        raise BadInput(
            f"the {backend_name} backend cannot reach a leg's processes from here: `drill hang` runs on local and docker"
        )
    if not cfg.trainer.watchdog.act:
        raise BadInput(
            "`drill hang` needs trainer.watchdog.act: true (with act false the watchdog only shows a hung "
            "leg, and the drill's would run to its budget)"
        )
    check_nodes(nodes)
    steps = cfg.rungs.drill.steps
    at = at_step if at_step is not None else steps // 2
    if not 2 <= at < steps:
        raise BadInput(
            f"--at-step must lie in 2..{steps - 1} (the drill runs {steps} steps; a rank is held to its own "
            f"step rhythm from its second step on, before that to trainer.watchdog.first_step_s), got {at}"
        )
    rung = dataclasses.replace(DRILL, legs=2, oracle=False)  # its question is the watchdog, not the timeline
    return execute(
        cfg,
        config_path,
        Request(rung, backend_name, None, nodes, allow_overdraft),
        show,
        lambda ctx, cmp: climb(ctx, steps, rank, at, how),
    )

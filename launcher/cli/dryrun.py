"""`launcher up ... --dry-run`: the launch plan (launcher.plan) as text: what would be
launched, its price and every guard's decision; launches, records and creates nothing (no
ledger, no store folder), and prints the leg environment redacted exactly as the ledger
would record it."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from launcher.plan import PLACEHOLDER_RUN, Plan


def steps_line(plan: Plan) -> str:
    """Each leg's LAUNCHER_MAX_STEPS, as the rung's runner will give it (launcher.ladder.leg_steps)."""
    shown = [f"{leg.index}{' (straight)' if leg.role == 'straight' else ''}: {leg.max_steps}" for leg in plan.legs]
    more = ", and each later leg the same" if plan.request.rung.name == "run" else ""
    return "LAUNCHER_MAX_STEPS by leg: " + ", ".join(shown) + more


def legs_line(plan: Plan) -> str:
    """How many legs the plan launches, the straight-through oracle counted and named."""
    rung = plan.request.rung
    if rung.name == "run":
        return "leg after leg to its last step"
    straight = [leg for leg in plan.legs if leg.role == "straight"]
    if not straight:
        return f"{len(plan.legs)} legs"
    return (
        f"{len(plan.legs)} legs: {rung.legs} of the rung, then leg {straight[0].index} straight through "
        "on the CPU (the oracle its resumes are compared with)"
    )


def describe(plan: Plan) -> str:
    """The plan as text: the legs, leg 0's rendered launch, the price and the quota guard."""
    cfg, request = plan.cfg, plan.request
    rung, backend, gpus = request.rung, request.backend, request.gpus
    out = [f"dry run: rung {rung.name} on {backend}, {legs_line(plan)}, nothing launched or recorded"]
    assert plan.projection is not None and plan.quota is not None
    env = plan.env  # printed: redacted like the ledger
    if rung.legs:
        from launcher.ops.shape import planned_shape

        out.append(steps_line(plan))
        out.append(planned_shape(cfg, rung.name, backend, request.nodes, gpus).describe())
    if not rung.legs:
        out.append("rung static runs on the host in seconds: nothing to launch")
    elif backend == "sky":
        out += _sky_leg0(plan, env)
    elif backend == "docker":
        from launcher.backends.base import LegSpec
        from launcher.backends.docker import run_argv

        spec = LegSpec(PLACEHOLDER_RUN, 0, rung.name, tuple(cfg.trainer.command), env, gpus=gpus)
        program = shutil.which("docker") or "docker"  # shown even where the docker guard refused
        out.append("$ " + shlex.join(run_argv(spec, plan.image or "<image>", "host", program)))
    elif request.nodes > 1:
        out += _local_nodes(plan, env)
    else:
        from launcher.backends.local import resolve_command

        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        out.append(f"$ cd <fresh empty dir> && {assigns} {shlex.join(resolve_command(cfg.trainer.command))}")
    if plan.preflight is not None:
        gate = plan.preflight
        out.append(
            "preflight: skipped, reason recorded: " + str(gate["reason"])
            if gate["gate"] == "skipped"
            else f"preflight: report {Path(gate['report']).name} passes (proofs "
            f"{', '.join(map(str, gate['proofs']))} PASS)"
        )
    out += plan.warnings()
    if plan.memory is not None:
        out += plan.memory.lines()
    elif plan.request.gpus is not None and plan.request.rung.legs and plan.cfg.memory.guard == "off":
        out.append("memory: not predicted (memory.guard: off in launcher.yaml)")
    out.append("quota: " + plan.projection.describe())
    if plan.price is not None:
        source = "the provider's price" if plan.pick is not None else "launcher.yaml prices"
        out.append(f"price: ${plan.price:.4f} per GPU-hour ({source}): this rung ${plan.quota.usd:.2f} at most")
        if plan.pick is not None and plan.pick.candidates:
            tried = ", ".join(f"{label} ${usd:.2f}/h" for label, usd in plan.pick.candidates)
            out.append(
                f"price: SkyPilot tries {tried}, in that order (the next when one has no capacity): the "
                f"quota guard reserves the dearest, ${plan.pick.hourly_usd:.2f}/h"
            )
    out.append("guard: " + plan.quota.arithmetic)
    out += [f"{d.guard}: refused: {d.refusal.message}" for d in plan.decisions if d.refusal is not None]
    return "\n".join(out)


def _local_nodes(plan: Plan, env: dict[str, str]) -> list[str]:
    """A local leg of several nodes: each a fresh folder running the rung's `run:` script (the
    bytes the sky backend renders) under bash, with SkyPilot's node variables."""
    from launcher.backends.nodes import LOOPBACK, node_env
    from launcher.backends.sky.task import leg_script, task_envs

    cfg, request = plan.cfg, plan.request
    script = leg_script(cfg, request.rung.name)
    ips = [LOOPBACK] * request.nodes
    gpus = request.gpus.count if request.gpus else 0
    out = [
        f"# leg 0: {request.nodes} nodes, each a fresh empty dir on this host running this run: script under "
        f"bash (sha256 {plan.run_sha256}, the bytes `--backend sky` renders):",
        script.rstrip(),
    ]
    shared = task_envs(cfg, request.rung.name, env)
    out.append("# every node: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in shared.items()))
    for rank in range(request.nodes):
        mine = node_env(rank, ips, gpus, f"preflight-{PLACEHOLDER_RUN}-leg0")
        out.append(f"# node {rank}: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in mine.items()))
    return out


def _sky_leg0(plan: Plan, env: dict[str, str]) -> list[str]:
    """Leg 0's task YAML, and SkyPilot's own dry run of it: the instance its optimizer
    picks and what that costs per hour, host VM included (with the rung's total at that price)."""
    from launcher.backends.base import LegSpec
    from launcher.leg_env import exported_secrets

    cfg, rung, backend = plan.cfg, plan.request.rung, plan.backend
    spec = LegSpec(
        PLACEHOLDER_RUN, 0, rung.name, tuple(cfg.trainer.command), env, exported_secrets(cfg), gpus=plan.request.gpus
    )
    with tempfile.TemporaryDirectory() as tmp:
        if rung.name == "run":  # one managed job; its first attempt's deadline stands for the job's
            from launcher.backends.sky.job import dry_run

            run_cfg = cfg.rungs.run
            deadline = float(env["LAUNCHER_DEADLINE"])
            task, pick, why = dry_run(
                backend,
                spec,
                Path(tmp) / "job-0.sky.yaml",
                deadline,
                run_cfg.budget_minutes * 60.0,
                run_cfg.max_restarts_on_errors,
            )
        else:
            task, pick, why = backend.dry_launch(spec, Path(tmp) / "leg-0.sky.yaml")  # type: ignore[union-attr]
    what = "managed job" if rung.name == "run" else "leg 0"
    out = [
        f"# {what} task YAML (accepted by sky.Task.from_yaml; sha256 {task.sha256[:16]}; its run: script, "
        f"which every node executes, sha256 {task.run_sha256})",
        task.yaml_text,
    ]
    if pick is None:
        out.append(f"skypilot: no pick or price ({why}); the costs below use launcher.yaml prices")
    else:
        hours = rung.legs * cfg.rung(rung.name).budget_minutes / 60.0
        out.append(
            f"skypilot: picks {pick.describe()} (SkyPilot's optimizer, host VM included); "
            f"{rung.legs} legs x {hours / rung.legs:g} h budget = ${pick.hourly_usd * hours:.2f} at most"
        )
    if rung.name == "run":
        out.append(_controller_line(backend, pick))
    if not env["LAUNCHER_STORE"].startswith("hf://"):
        out.append(
            f"note: a real sky launch is refused: {env['LAUNCHER_STORE']} exists only on this machine "
            "(set store: hf://owner/repo)"
        )
    return out


def _controller_line(backend: Any, pick: Any) -> str:
    """The jobs controller: SkyPilot runs managed jobs from a VM of its own, billed to the user by
    the cloud, which the quota does not count (it serves every managed job of the user's)."""
    controller = backend.controller_quote(pick.cloud if pick is not None else None)
    what = controller.describe() if controller is not None else "its price unknown here"
    return (
        f"jobs controller: SkyPilot follows the managed job from a VM of its own (cpus 4+, memory 4x, disk 50 GB: "
        f"{what}), up while any managed job of yours runs and 10 idle minutes after; your cloud bills it, "
        "this quota does not count it (one controller serves all your managed jobs)"
    )

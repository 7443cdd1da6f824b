"""`launcher up ... --dry-run`: what would be launched and what it may cost; launches,
records and creates nothing (no ledger, no store folder), and prints the leg
environment redacted exactly as the ledger would record it."""

from __future__ import annotations

import shlex
import tempfile
import time
from pathlib import Path

from launcher.config import Config, GpuSpec, store_uri
from launcher.ladder import Rung, first_leg_steps
from launcher.ledger import Ledger
from launcher.spend import project
from runtime.hashing import digest_lines as files_digest

PLACEHOLDER_RUN = "dry-run"


def leg0_env(cfg: Config, ledger: Ledger | None, rung: Rung, backend: str, gpus: GpuSpec | None, nodes: int,
             reviewed: dict[str, str], now: float | None = None) -> dict[str, str]:
    """Leg 0's environment, built by the function real legs use (launcher.legs.leg_env) from the
    same facts: its step count (launcher.ladder.first_leg_steps), and its deadline capped by
    the session cap and by what the quota still allows (as the quota guard would reserve)."""
    from launcher.legs import leg_deadline, leg_env

    if not rung.legs:
        return leg_env(cfg, rung.name, PLACEHOLDER_RUN, 0, store_uri(cfg), 0, now or time.time(), reviewed, gpus)
    rung_cfg = cfg.rung(rung.name)
    steps = first_leg_steps(rung.name, rung_cfg.steps, can_terminate(backend))
    projection = project(cfg, ledger, rung, gpus, nodes)
    left = None if projection.remaining is None else max(0.0, projection.remaining)
    deadline = leg_deadline(cfg, rung_cfg.budget_minutes * 60.0, left, (gpus.count if gpus else 0) * nodes, now)
    return leg_env(cfg, rung.name, PLACEHOLDER_RUN, 0, store_uri(cfg), steps, deadline, reviewed, gpus)


def can_terminate(backend: str) -> bool:
    """Whether legs on this backend can be sent SIGTERM (it decides leg 0's step count)."""
    from launcher.backends import backend_class

    return backend_class(backend).can_terminate


def sky_image_ref(cfg: Config, ledger: Ledger | None, reviewed: dict[str, str], dry_run: bool) -> str:
    """The pushed repo@sha256 of the image baked from the reviewed files."""
    from launcher.errors import Refused

    rows = ledger.images(files_digest(reviewed)) if ledger is not None else []
    pushed = next((r["pushed_ref"] for r in rows if r["pushed_ref"]), None)
    if pushed:
        return pushed
    if dry_run:
        return f"preflight/{cfg.project}:{files_digest(reviewed)[:12]}"
    raise Refused("no pushed image was built from the reviewed files: a cloud instance could not pull it",
                  hint="run `launcher image build --gpu` and `launcher image push`")


def describe(cfg: Config, ledger: Ledger | None, rung: Rung, backend: str, gpus: GpuSpec | None, nodes: int,
             reviewed: dict[str, str], image: str | None) -> str:
    """The rendered leg-0 launch and the quota arithmetic, as text."""
    straight = " (+1 straight-through leg on the CPU, the oracle)" if rung.name in ("rehearsal", "probe", "drill") and not gpus else ""
    legs = "leg after leg to its last step" if rung.name == "run" else f"{rung.legs} legs{straight}"
    out = [f"dry run: rung {rung.name} on {backend}, {legs}, nothing launched or recorded"]
    from launcher.legs import redact

    env = redact(leg0_env(cfg, ledger, rung, backend, gpus, nodes, reviewed), cfg.secrets)  # printed: redacted like the ledger
    if not rung.legs:
        out.append("rung static runs on the host in seconds: nothing to launch")
    elif backend == "sky":
        out += _sky_leg0(cfg, ledger, rung, gpus, nodes, reviewed, env)
    elif backend == "docker":
        from launcher.backends.base import LegSpec
        from launcher.backends.docker import run_argv

        spec = LegSpec(PLACEHOLDER_RUN, 0, rung.name, tuple(cfg.trainer.command), env, gpus=gpus)
        out.append("$ " + shlex.join(run_argv(spec, image or "<image>", "host")))
    else:
        from launcher.backends.local import resolve_command

        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        out.append(f"$ cd <fresh empty dir> && {assigns} {shlex.join(resolve_command(cfg.trainer.command))}")
    out.append("quota: " + project(cfg, ledger, rung, gpus, nodes).describe())
    return "\n".join(out)


def _sky_leg0(cfg: Config, ledger: Ledger | None, rung: Rung, gpus: GpuSpec | None, nodes: int,
              reviewed: dict[str, str], env: dict[str, str]) -> list[str]:
    """Leg 0's task YAML, and SkyPilot's own dry run of it: the instance its optimizer
    picks and what that costs per hour, host VM included (with the rung's total at that price)."""
    from launcher.backends.base import LegSpec
    from launcher.backends.sky import SkyBackend
    from launcher.legs import exported_secrets
    from launcher.backends.skytask import sky_module

    ref = sky_image_ref(cfg, ledger, reviewed, dry_run=True)
    spec = LegSpec(PLACEHOLDER_RUN, 0, rung.name, tuple(cfg.trainer.command), env, exported_secrets(cfg),
                   gpus=gpus)
    backend = SkyBackend(cfg, ref, nodes, sky=sky_module())
    with tempfile.TemporaryDirectory() as tmp:
        if rung.name == "run":  # one managed job; its first attempt's deadline stands for the job's
            from launcher.backends.skyjob import dry_run

            run_cfg = cfg.rungs.run
            deadline = float(env["LAUNCHER_DEADLINE"])
            task, pick, why = dry_run(backend, spec, Path(tmp) / "job-0.sky.yaml", deadline,
                                      run_cfg.budget_minutes * 60.0, run_cfg.max_restarts_on_errors)
        else:
            task, pick, why = backend.dry_launch(spec, Path(tmp) / "leg-0.sky.yaml")
    what = "managed job" if rung.name == "run" else "leg 0"
    out = [f"# {what} task YAML (accepted by sky.Task.from_yaml; sha256 {task.sha256[:16]})", task.yaml_text]
    if pick is None:
        out.append(f"skypilot: no pick or price ({why}); the costs below use launcher.yaml prices")
    else:
        hours = rung.legs * cfg.rung(rung.name).budget_minutes / 60.0
        out.append(f"skypilot: picks {pick.describe()} (SkyPilot's optimizer, host VM included); "
                   f"{rung.legs} legs x {hours / rung.legs:g} h budget = ${pick.hourly_usd * hours:.2f} at most")
    if not env["LAUNCHER_STORE"].startswith("hf://"):
        out.append(f"note: a real sky launch is refused: {env['LAUNCHER_STORE']} exists only on this machine "
                   "(set store: hf://owner/repo)")
    return out

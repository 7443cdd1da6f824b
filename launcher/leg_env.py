"""A leg's environment: what the launcher tells the instance, identical on every backend and
in the dry run (runtime.contract.leg_env, filled in here from the config and the run), the
ways it ends a leg on purpose (`Ending`), and what may be written down of it (secrets
redacted). Secrets travel separately and are never recorded.
"""

from __future__ import annotations

import os
import re
import secrets as pysecrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from launcher.config.schema import Config, GpuSpec
from runtime import contract

SECRET_LIKE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY", re.IGNORECASE)


REDACTED = "<redacted>"


def new_run_id(project: str, rung: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{project}-{rung}-{stamp}-{pysecrets.token_hex(2)}"


def redact(env: dict[str, str], secret_names: list[str]) -> dict[str, str]:
    """The environment as it may be written down: secret values replaced."""
    return {k: (REDACTED if k in secret_names or SECRET_LIKE.search(k) else v) for k, v in env.items()}


def exported_secrets(cfg: Config) -> dict[str, str]:
    """The values of launcher.yaml's `secrets:` that this environment exports."""
    return {name: os.environ[name] for name in cfg.secrets if name in os.environ}


def leg_deadline(
    cfg: Config, budget_s: float, quota_left_hours: float | None, gpus_total: int, now: float | None = None
) -> float:
    """LAUNCHER_DEADLINE of a leg starting `now`: its budget, capped by the session cap and by
    what the quota still allows `gpus_total` GPUs (the run's, all nodes)."""
    limits = [budget_s]
    if cfg.quota.session_hours is not None:
        limits.append(cfg.quota.session_hours * 3600)
    if quota_left_hours is not None and gpus_total:
        limits.append(quota_left_hours / gpus_total * 3600)
    return (time.time() if now is None else now) + max(0.0, min(limits))


def leg_env(
    cfg: Config,
    rung: str,
    run_id: str,
    leg: int,
    store_uri: str,
    max_steps: int,
    deadline: float,
    files_sha256: dict[str, str],
    gpus: GpuSpec | None,
    deadline_after_resume: float | None = None,
) -> dict[str, str]:
    """A leg's environment from the config (its `leg_env`) and the run's facts: what real legs
    get and what `up --dry-run` prints. The runtime refuses to run bytes other than `files_sha256`;
    an hf:// store's legs also get launcher.yaml's `hub:` limits."""
    return contract.leg_env(
        run_id=run_id,
        leg=leg,
        rung=rung,
        store=store_uri,
        max_steps=max_steps,
        deadline=deadline,
        files_sha256=files_sha256,
        on_gpu=gpus is not None,
        extra=cfg.leg_env,
        deadline_after_resume=deadline_after_resume,
        hub=cfg.hub.env() if store_uri.startswith("hf://") else None,
    )


@dataclass(frozen=True)
class Ending:
    """How the launcher ends a leg on purpose: a rung exercises every way a leg stops,
    so a trainer that pushes no final checkpoint on one of them is caught."""

    sigterm_at: int | None = None
    """Send SIGTERM once rank 0 printed this step (a graceful stop: `launcher stop`, a spot notice)."""
    deadline_s: float | None = None
    """LAUNCHER_DEADLINE this many seconds after launch, instead of the rung's budget."""
    after_resume_s: float | None = None
    """LAUNCHER_DEADLINE_AFTER_RESUME: the deadline also this many seconds after the leg's resume."""
    hold_at: int | None = None
    """LAUNCHER_HOLD_AT_STEP: the leg waits at this step until its deadline is within its stop
    margin (runtime.session.rules.hold), or with `sigterm_at` until the SIGTERM comes (LAUNCHER_HOLD_UNTIL),
    so the stop lands mid-run, at a known step, on any machine speed and any backend. The trainer
    holds itself: the launcher freezing the leg when it read the step came too late under load (a
    docker leg ran on 6 steps to its limit)."""
    straight: bool = False
    """The uninterrupted reference run: its own store namespace (<run id>-straight-<leg>), never resumed from."""
    notice_s: float | None = None
    """With `sigterm_at`: a preemption. The instance is killed this many seconds after the SIGTERM
    unless the leg has ended; 0 kills it at that step with no SIGTERM at all."""
    stray_at: tuple[int, int] | None = None
    """(rank, step): that rank blocks in a collective no peer joins after that step
    (LAUNCHER_DRILL_HANG; `drill hang --how collective`)."""


HOLD_DEADLINE_S = 0.25
"""How long a leg held for its deadline waits at its step: the runtime places the deadline this
long (plus its stop margin) after reaching the step (LAUNCHER_HOLD_DEADLINE_S), where a deadline
counted from the resume had to leave seconds for the steps before it."""


def ending_env(ending: Ending) -> dict[str, str]:
    """What an ending adds to the leg's environment: a hold at a step, until its deadline or,
    with a SIGTERM planned there, until the SIGTERM comes (the dry run shows leg 0's too)."""
    if ending.stray_at is not None:
        return {contract.DRILL_HANG: f"{ending.stray_at[0]}:{ending.stray_at[1]}"}
    if ending.hold_at is None:
        return {}
    held = {contract.HOLD_AT: str(ending.hold_at)}
    if ending.sigterm_at is not None:
        return held | {contract.HOLD_UNTIL: "sigterm"}
    return held | {contract.HOLD_DEADLINE_S: f"{HOLD_DEADLINE_S:.2f}"}

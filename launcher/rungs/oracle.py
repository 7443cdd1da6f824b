"""A CPU drill's oracle, reused: the straight-through leg an earlier run of this project ran
(the rehearsal's, most often), where the ledger proves it is the leg the drill would run, so
the drill runs no straight leg of its own (one leg less per climb: a leg is mostly its
interpreter's start-up).

The key, each field read from the ledger (launcher.ledger.db.Ledger.straight_legs), is what
decides a straight leg's numbers, and no more: a field that cannot change them only keeps a
rehearsal's leg from serving the drill after it.
  - the same project, the local backend for both (a docker or sky leg ran elsewhere: never
    reused), no GPU, the same nodes (with the command and environment below: the same ranks
    per node, the plan's shape);
  - the same reviewed files: the run's files digest and every file's sha256;
  - the same command, resolved as the local backend runs it (`python` bound to an interpreter,
    a bare `torchrun` to the one found), so the same interpreter (trainer_python); the trainer's
    own settings, its checkpoint cadence among them, are its arguments;
  - the same leg environment (runtime.contract.leg_env: launcher.yaml's `leg_env`, the store,
    the files' hashes, LAUNCHER_MAX_STEPS, so the same steps, the CPU-only and deterministic
    settings) but for the leg's identity labels (run id, leg, rung) and its deadline, which
    name and time the leg and train nothing;
  - launcher.yaml byte for byte (config_sha256), or, where only other sections differ (a rung's
    steps or budget, a quota), the command and environment above, which hold all the config
    hands a leg; `trainer.deterministic` never reaches a leg (the drill judges with its own
    config's). A leg of several nodes records the `run:` script, not the command, so it is
    reused only with the config unchanged and a command that names its interpreter by path;
  - the leg exited 0, was not killed, and its log is on disk, parses (no damaged line) and ends
    in every rank's `done` at the drill's steps.
The host's own environment is not recorded and a trainer may read it: no key proves more than
the ledger holds. So a reused oracle never fails a drill on its own: where any check against
it fails, the drill runs a fresh straight leg then and is judged against that one, by the
rehearsal's own path (launcher.rungs.resume_legs.exact_checks: a trainer that does not
reproduce itself is still found there). `rungs.drill.fresh_oracle: true` runs the straight leg regardless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.backends.local import resolve_command, trainer_python
from launcher.checks.evidence import Check, Kind, LegEvents, silent
from launcher.ledger.rows import LegRow, RunRow
from launcher.leg_env import Ending, redact
from launcher.legs import LegOutcome, RunContext, run_leg
from runtime import contract

IDENTITY = frozenset({contract.RUN_ID, contract.LEG, contract.RUNG, contract.DEADLINE, contract.DEADLINE_AFTER_RESUME})
"""The leg environment's names that label or time a leg and train nothing: left out of the key."""


@dataclass(frozen=True)
class Key:
    """What the drill's own straight leg would be, as the ledger records a leg."""

    project: str
    backend: str
    gpu_count: int
    nodes: int
    files_digest: str
    files: dict[str, str]
    config_sha256: str
    command: list[str]
    python: str
    env: dict[str, str]
    steps: int
    named_python: bool
    """The command's interpreter is a path (a leg of several nodes records only its script)."""


@dataclass(frozen=True)
class Oracle:
    """A straight leg of an earlier run, read as the drill's leg `events.leg`."""

    run_id: str
    leg: int
    events: LegEvents


def drill_key(ctx: RunContext, as_leg: int, steps: int) -> Key | None:
    """The drill's side of the key, from its own run row (None: not a local CPU drill)."""
    run = ctx.ledger.runs(run_id=ctx.run_id)
    if not run or ctx.backend.name != "local" or ctx.gpu_count:
        return None
    command = list(ctx.cfg.trainer.command)
    if ctx.nodes > 1:
        from launcher.backends.sky.task import leg_script

        recorded = ["bash", "-c", leg_script(ctx.cfg, ctx.rung.name)]  # launcher.backends.nodes.local_launches
    else:
        recorded = resolve_command(command)
    return Key(
        ctx.cfg.project,
        "local",
        0,
        ctx.nodes,
        run[0]["files_digest"],
        dict(run[0]["files"]),
        run[0]["config_sha256"],
        recorded,
        trainer_python(command),
        comparable(redact(ctx.leg_env(as_leg, steps, 0.0), ctx.cfg.secrets)),
        steps,
        bool(command) and os.path.isabs(command[0]) and Path(command[0]).name.startswith("python"),
    )


def comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in IDENTITY}


def mismatch(want: Key, run: RunRow, leg: LegRow) -> str | None:
    """The first key field the candidate differs in, in words; None: the same run, by the ledger."""
    command = [str(a) for a in leg["command"]]
    differs = [
        (run["project"] != want.project, "project"),
        (run["backend"] != want.backend or leg["backend"] != want.backend, "backend"),
        ((run["gpu_count"] or 0) != want.gpu_count, "GPUs"),
        (run["nodes"] != want.nodes, "nodes"),
        (run["files_digest"] != want.files_digest or run["files"] != want.files, "reviewed files"),
        (command != want.command, "command"),
        (want.nodes == 1 and trainer_python(command) != want.python, "interpreter"),
        (comparable(leg["env"]) != want.env, "leg environment"),
        (want.nodes > 1 and not (want.named_python and run["config_sha256"] == want.config_sha256), "config"),
        (leg["exit_code"] != 0 or leg["killed"] or leg["ended_at"] is None, "exit"),
    ]
    return next((what for bad, what in differs if bad), None)


def read_oracle(leg: LegRow, as_leg: int, steps: int) -> LegEvents | None:
    """The leg's events, read as leg `as_leg`, where its log is on disk, parses, and every rank's
    `done` is at `steps`; else None."""
    events = LegEvents.read(as_leg, Path(leg["log_path"]))
    dones = events.all("done", rank=None)
    if silent(events) or events.damaged() or events.last("done") is None:
        return None
    return events if all(e.get("step") == steps for _, e in dones) else None


def find_oracle(ctx: RunContext, as_leg: int, steps: int) -> Oracle | None:
    """The newest straight leg of this project that is provably the drill's own (the key above);
    None where the drill runs none, or `rungs.drill.fresh_oracle` asks for its own."""
    if not ctx.rung.straight_leg or ctx.cfg.rungs.drill.fresh_oracle:
        return None
    want = drill_key(ctx, as_leg, steps)
    if want is None:
        return None
    for run, leg in ctx.ledger.straight_legs(ctx.cfg.project):
        if run["id"] == ctx.run_id or leg["leg"] is None or mismatch(want, run, leg) is not None:
            continue
        events = read_oracle(leg, as_leg, steps)
        if events is not None:
            return Oracle(run["id"], int(leg["leg"]), events)
    return None


def reused(oracle: Oracle, disagreed: str | None = None) -> Check:
    """The line that says which straight leg served as the oracle (evidence: its `done`), or,
    `disagreed` naming the first check that failed against it, that a fresh one was run instead."""
    done = oracle.events.last("done")
    facts: dict[str, Any] = {"reused_run": oracle.run_id, "reused_leg": oracle.leg, "log": str(oracle.events.log)}
    where = f"run {oracle.run_id} straight-through leg {oracle.leg}"
    if disagreed is None:
        name, detail = f"straight-through run reused: {where}", "the same run by the ledger; no straight leg ran"
    else:
        facts["disagreed"] = disagreed
        name = f"straight-through run reused from {where} disagreed: judged against a fresh one"
        detail = f"`{disagreed}` failed against it; the drill ran a fresh straight leg and is judged against that"
    leg = oracle.events.leg if disagreed is None else None  # the fresh straight leg is that leg then
    return Check(name, True, detail, oracle.events.pointer(done), kind=Kind.STRAIGHT_FINISHED, leg=leg, facts=facts)


def judge(ctx: RunContext, oracle: Oracle, legs: list[LegEvents], steps: int) -> tuple[list[Check], LegOutcome | None]:
    """(the checks, None) where every check against the reused oracle held; else ([the line that
    says so], the fresh straight leg run now, leg `oracle.events.leg`), for the caller to judge the
    drill against as it judges any straight leg: a reused oracle alone never fails a drill."""
    from launcher.checks.determinism import check_determinism
    from launcher.checks.state import timeline_checks

    mode = check_determinism(legs, bool(ctx.gpu_count))
    found = ([mode] if mode is not None else []) + timeline_checks(legs, oracle.events, ctx.cfg.trainer.deterministic)
    failed = [c for c in found if not c.ok]
    if not failed:
        return [reused(oracle)] + found, None
    fresh = run_leg(ctx, oracle.events.leg, steps, ending=Ending(straight=True))
    return [reused(oracle, failed[0].name)], fresh

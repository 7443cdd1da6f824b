"""`launcher up RUNG`: validate, guard, record, run the rung, answer.

Order matters: everything that can be bad input is checked before the ledger
is touched (no half-written row), then the hash guard (exit 3), then the run
row is written complete, then the rung runs, and the run row is closed even
when the launcher is interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from launcher.backends import BACKENDS
from launcher.backends.base import StagedFile
from launcher.checks.evidence import Check, Kind
from launcher.config.schema import MAX_NODES, MAX_STEPS, Config, GpuSpec, parse_gpus, store_uri
from launcher.errors import BadInput, Exit, LauncherError, Refused, RunStopped
from launcher.ladder import Rung, rung_named
from launcher.leg_env import new_run_id
from launcher.legs import RunContext, ledger_run_row
from launcher.manifest import reviewed_paths
from launcher.plan import Plan, Request, make_plan
from launcher.storekey import project_key
from runtime.hashing import sha256_file


@dataclass(frozen=True)
class Outcome:
    """What `up` answers: the run, its checks, and the exit code they imply."""

    run_id: str
    rung: str
    checks: list[Check]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def exit_code(self) -> int:
        return int(Exit.OK if self.ok else Exit.NO)


def validate_request(
    rung_name: str,
    backend_name: str,
    gpus_text: str | None,
    nodes: int = 1,
    cpu: bool = False,
    steps: int | None = None,
) -> tuple[Rung, GpuSpec | None]:
    """Bad input is refused here, before the ledger is opened. `cpu` runs a GPU
    rung's legs on the CPU (a dress rehearsal of the rung: its GPU checks are
    left out, and the report counts nothing it measures as the target's)."""
    rung = rung_named(rung_name)
    if steps is not None and (not 2 <= steps <= MAX_STEPS or not rung.legs):
        raise BadInput(
            f"--steps {steps}: give 2 to {MAX_STEPS:,}, and only to a rung that trains"
            if rung.legs
            else f"--steps: rung {rung.name!r} trains nothing"
        )
    if cpu:
        if not rung.needs_gpu:
            raise BadInput(f"--cpu: rung {rung.name!r} already runs on the CPU")
        if gpus_text is not None:
            raise BadInput(f"--cpu and --gpus {gpus_text}: pick one")
        rung = dataclasses.replace(rung, needs_gpu=False)
    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    check_nodes(nodes)
    if not rung.available:
        raise BadInput(
            f"rung {rung.name!r} is not available in this version (available: static, rehearsal, smoke, probe)"
        )
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    if rung.needs_gpu and gpus is None:
        raise BadInput(
            f"rung {rung.name!r} runs on a GPU: give --gpus, e.g. --gpus T4:1 "
            "(or --cpu for a dress rehearsal of the rung on this machine's CPU)"
        )
    if not rung.needs_gpu and gpus is not None:
        raise BadInput(f"rung {rung.name!r} runs without a GPU: drop --gpus {gpus}")
    return rung, gpus


def with_steps(cfg: Config, rung: Rung, steps: int | None) -> Config:
    """The config with `--steps` standing in for the rung's configured steps."""
    if steps is None:
        return cfg
    return dataclasses.replace(
        cfg, rungs=dataclasses.replace(cfg.rungs, **{rung.name: dataclasses.replace(cfg.rung(rung.name), steps=steps)})
    )


def check_nodes(nodes: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise BadInput(f"--nodes must be 1 to {MAX_NODES}, got {nodes}")


def dry_run(
    cfg: Config,
    rung_name: str,
    backend_name: str,
    gpus_text: str | None,
    nodes: int,
    cpu: bool = False,
    steps: int | None = None,
    allow_overdraft: bool = False,
    skip_preflight: str | None = None,
) -> Plan:
    """The launch plan `up` would execute (launcher.plan), made to be shown: launches, records
    and creates nothing; every guard decided as the real launch decides it, in its order
    (`plan.refusal(dry_run=True)`: the error the real launch would end in). The caller renders
    it (launcher.cli.dryrun) and closes it."""
    request, cfg = _request(cfg, rung_name, backend_name, gpus_text, nodes, cpu, steps, allow_overdraft, skip_preflight)
    return make_plan(cfg, request, dry_run=True)


def _request(
    cfg: Config,
    rung_name: str,
    backend_name: str,
    gpus_text: str | None,
    nodes: int,
    cpu: bool,
    steps: int | None,
    allow_overdraft: bool,
    skip_preflight: str | None,
    retry_until_up: bool = False,
) -> tuple[Request, Config]:
    """The request as one typed value, and the config with `--steps` applied: bad input refused here."""
    rung, gpus = validate_request(rung_name, backend_name, gpus_text, nodes, cpu=cpu, steps=steps)
    if skip_preflight is not None:
        check_skip_reason(rung, skip_preflight)
    return (
        Request(rung, backend_name, gpus, nodes, allow_overdraft, retry_until_up, skip_preflight),
        with_steps(cfg, rung, steps),
    )


def up(
    cfg: Config,
    config_path: Path,
    rung_name: str,
    backend_name: str,
    gpus_text: str | None,
    show: Callable[[int, str], None],
    nodes: int = 1,
    allow_overdraft: bool = False,
    cpu: bool = False,
    steps: int | None = None,
    retry_until_up: bool = False,
    skip_preflight: str | None = None,
) -> Outcome:
    """Run one rung of the ladder and record it (`steps` overrides the config's)."""
    request, cfg = _request(
        cfg, rung_name, backend_name, gpus_text, nodes, cpu, steps, allow_overdraft, skip_preflight, retry_until_up
    )
    return execute(cfg, config_path, request, show, _climb)


def check_skip_reason(rung: Rung, reason: str) -> None:
    if rung.name != "run":
        raise BadInput(f"--skip-preflight: only the run has a preflight gate (not rung {rung.name!r})")
    if not reason.strip() or len(reason) > 500 or any(ord(c) < 32 for c in reason):
        raise BadInput(
            "--skip-preflight needs a reason: one line of 1 to 500 characters, e.g. "
            '--skip-preflight "re-run of a run whose report passed; only the data changed"'
        )


def execute(
    cfg: Config,
    config_path: Path,
    request: Request,
    show: Callable[[int, str], None],
    runner: Callable[[RunContext, Any], list[Check]],
) -> Outcome:
    """Plan (every guard, refusing at the first: nothing recorded yet), reserve, record, run
    `runner`, close the record (also when interrupted)."""
    plan = make_plan(cfg, request, dry_run=False)
    try:
        ledger, cmp, rung = plan.ledger, plan.cmp, request.rung
        assert ledger is not None and cmp is not None and plan.backend is not None  # the guards passed
        files = {rel: StagedFile(path, cmp.current[rel]) for rel, path in reviewed_paths(cfg, strict=False).items()}
        ctx = RunContext(
            cfg,
            rung,
            plan.backend,
            ledger,
            new_run_id(cfg.project, rung.name),
            store_uri(cfg),
            files,
            request.gpus,
            show,
            request.nodes,
        )
        for warning in plan.warnings():
            show(-1, warning)  # the same lines the dry run shows
        reservation = _reserve(ctx, plan)  # the quota guard again, in the transaction that reserves (exit 3)
        ctx.store_key = project_key(cfg.state_path) if rung.legs else None  # made once a launch is certain
        config_sha = sha256_file(config_path)
        ledger.begin_run(
            dict(
                ledger_run_row(ctx, cmp.review.id, cmp.review.digest, config_sha),
                image=plan.image,
                preflight=json.dumps(plan.preflight) if plan.preflight else None,
            ),
            cmp.current,
        )
        memory = plan.memory.to_json() if plan.memory is not None else None
        return _run_recorded(ctx, runner, cmp, reservation, memory)
    finally:
        plan.close()


def _reserve(ctx: RunContext, plan: Plan) -> int:
    """Reserve the rung's GPU-hours under the quota at the plan's price (launcher.ops.spend.reserve
    decides as the plan's preview did, now in the transaction that reserves; exit 3 when over
    it); the reservation's id."""
    from launcher.ops.spend import reserve

    assert plan.projection is not None
    ctx.gpu_hour_price = plan.price
    ctx.allow_overdraft = plan.request.allow_overdraft
    held = reserve(
        ctx.cfg,
        ctx.ledger,
        ctx.run_id,
        ctx.rung.name,
        plan.projection,
        plan.price,
        plan.request.allow_overdraft,
        at_least=plan.at_least,
    )
    ctx.quota_left_hours = held.remaining_gpu_hours
    ctx.reservation_id = held.id
    return held.id


def _run_recorded(
    ctx: RunContext,
    runner: Callable[[RunContext, Any], list[Check]],
    cmp: Any,
    reservation: int,
    memory: dict[str, Any] | None = None,
) -> Outcome:
    """Run `runner` on the recorded run; its checks, end and verdict are written, and its
    quota reservation settled, however it ends (an interrupt included). `memory`: the memory
    guard's decision (a GPU rung), scored against the legs' measured peak when the run ends."""
    from launcher.ops.spend import settle

    ledger = ctx.ledger
    began = time.time()
    checks: list[Check] = []
    verdict, exit_code = "error", int(Exit.NO)
    try:
        try:
            checks = runner(ctx, cmp)
            if ledger.stop_requested(ctx.run_id):  # the stopped leg was the rung's last one
                raise RunStopped(f"`launcher stop {ctx.run_id}` stopped it")
        except RunStopped as stopped:
            checks.append(Check("ran to its end", False, str(stopped), kind=Kind.RAN_TO_END))
            verdict = "stopped"
        checks = _with_score(checks, memory, ctx)  # a statement (always ok): the exit code does not move
        outcome = Outcome(ctx.run_id, ctx.rung.name, checks, time.time() - began)
        exit_code = outcome.exit_code
        if verdict != "stopped":
            verdict = "pass" if outcome.ok else "fail"
        return outcome
    except LauncherError as err:
        verdict, exit_code = ("refused" if isinstance(err, Refused) else "error"), err.exit_code
        checks = list(getattr(err, "checks", checks))  # the run's checks up to a mid-run refusal
        raise
    except KeyboardInterrupt:
        verdict, exit_code = "interrupted", int(Exit.INTERRUPTED)
        raise
    finally:
        checks = _with_score(checks, memory, ctx)  # where the run did not get as far
        ledger.add_checks(ctx.run_id, [c.to_json() for c in checks])
        gpus = ctx.gpus
        source = "config prices" if gpus and gpus.name in ctx.cfg.prices else "none"
        ledger.end_run(ctx.run_id, ended_at=time.time(), exit_code=exit_code, verdict=verdict, cost_source=source)
        settle(ledger, reservation, ctx.run_id)


def _with_score(checks: list[Check], memory: dict[str, Any] | None, ctx: RunContext) -> list[Check]:
    """`checks` with the memory guard's decision scored against the run's legs
    (launcher.checks.memscore), unless they hold that score already or there was no decision."""
    from launcher.checks.memscore import score_run

    if any(c.kind == Kind.MEMORY_SCORED for c in checks):
        return checks
    score = score_run(memory, ctx.ledger.leg_records(ctx.run_id))
    return checks + [score] if score else checks


def _climb(ctx: RunContext, cmp) -> list[Check]:  # noqa: ANN001 - HashComparison
    from launcher.rungs import run_rung

    return run_rung(ctx, cmp)

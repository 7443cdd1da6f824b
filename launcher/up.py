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

from launcher.backends import BACKENDS, HOST, Backend, make_backend
from launcher.backends.base import StagedFile
from launcher.rungs.chain import first_leg_gpu_hours
from launcher.config import MAX_NODES, MAX_STEPS, Config, GpuSpec, parse_gpus, store_uri
from launcher.errors import BadInput, Exit, LauncherError, Refused
from launcher.evidence import Check
from launcher.ladder import Rung, rung_named
from launcher.ledger import Ledger
from launcher.legs import RunContext, RunStopped, ledger_run_row, new_run_id
from launcher.manifest import guard_hashes, reviewed_paths
from launcher.storekey import project_key
from runtime.hashing import sha256_file

MAX_KILLS = 100


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


def validate_request(rung_name: str, backend_name: str, gpus_text: str | None, nodes: int = 1,
                     dry_run: bool = False, cpu: bool = False, steps: int | None = None
                     ) -> tuple[Rung, GpuSpec | None]:
    """Bad input is refused here, before the ledger is opened. `cpu` runs a GPU
    rung's legs on the CPU (a dress rehearsal of the rung: its GPU checks are
    left out, and the report counts nothing it measures as the target's)."""
    rung = rung_named(rung_name)
    if steps is not None and (not 2 <= steps <= MAX_STEPS or not rung.legs):
        raise BadInput(f"--steps {steps}: give 2 to {MAX_STEPS:,}, and only to a rung that trains" if rung.legs
                       else f"--steps: rung {rung.name!r} trains nothing")
    if cpu:
        if not rung.needs_gpu:
            raise BadInput(f"--cpu: rung {rung.name!r} already runs on the CPU")
        if gpus_text is not None:
            raise BadInput(f"--cpu and --gpus {gpus_text}: pick one")
        rung = dataclasses.replace(rung, needs_gpu=False)
    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    check_nodes(nodes)
    if nodes > 1 and backend_name != "sky":
        raise BadInput(f"--nodes {nodes}: only the sky backend launches several nodes")
    if not rung.available and not dry_run:
        raise BadInput(f"rung {rung.name!r} is not available in this version "
                       "(available: static, rehearsal, smoke, probe)")
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    if rung.needs_gpu and gpus is None:
        raise BadInput(f"rung {rung.name!r} runs on a GPU: give --gpus, e.g. --gpus T4:1 "
                       "(or --cpu for a dress rehearsal of the rung on this machine's CPU)")
    if not rung.needs_gpu and gpus is not None:
        raise BadInput(f"rung {rung.name!r} runs without a GPU: drop --gpus {gpus}")
    return rung, gpus


def with_steps(cfg: Config, rung: Rung, steps: int | None) -> Config:
    """The config with `--steps` standing in for the rung's configured steps."""
    if steps is None:
        return cfg
    return dataclasses.replace(cfg, rungs=dataclasses.replace(
        cfg.rungs, **{rung.name: dataclasses.replace(cfg.rung(rung.name), steps=steps)}))


def check_nodes(nodes: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise BadInput(f"--nodes must be 1 to {MAX_NODES}, got {nodes}")


def dry_run(cfg: Config, rung_name: str, backend_name: str, gpus_text: str | None, nodes: int,
            cpu: bool = False, steps: int | None = None, allow_overdraft: bool = False,
            skip_preflight: str | None = None) -> tuple[str, LauncherError | None]:
    """What `up` would launch, and the quota arithmetic; launches, records and creates nothing
    (the ledger is only read, if there is one). Returns the text and the error the real
    launch would end in (None: it would launch): every check the real one makes, in its
    order, so the first one it would stop at decides the exit code."""
    from launcher.dryrun import describe
    from launcher.manifest import hash_reviewed
    from launcher.spend import project

    rung, gpus = validate_request(rung_name, backend_name, gpus_text, nodes, dry_run=True, cpu=cpu, steps=steps)
    if skip_preflight is not None:
        check_skip_reason(rung, skip_preflight)
    cfg = with_steps(cfg, rung, steps)
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    stops: list[LauncherError] = []
    if not rung.available:
        stops.append(BadInput(f"rung {rung.name!r} is not available in this version"))
    try:
        cmp = None
        try:
            if ledger is None:
                raise Refused("no review recorded (run `launcher review`)")
            cmp = guard_hashes(cfg, ledger)
        except Refused as err:
            stops.append(err)
        current = cmp.current if cmp else hash_reviewed(cfg, strict=False)
        image = None
        if rung.legs and ledger is not None:
            try:
                image = _image_for(backend_name, cfg, ledger, current)
            except LauncherError as err:
                stops.append(err)
        text = describe(cfg, ledger, rung, backend_name, gpus, nodes, current, image)
        if rung.name == "run" and ledger is not None and cmp is not None:
            try:
                gate = _gate(cfg, ledger, rung, current, image, gpus, skip_preflight)
                text += ("\npreflight: skipped, reason recorded: " + str(gate["reason"]) if gate["gate"] == "skipped"
                         else f"\npreflight: report {Path(gate['report']).name} passes (proofs "
                         f"{', '.join(map(str, gate['proofs']))} PASS)")
            except Refused as err:
                stops.append(err)
                text += f"\npreflight: {err.message}"
        proj = project(cfg, ledger, rung, gpus, nodes)
        if rung.name == "run" and gpus is not None:  # not refused for not fitting whole: its legs stop at the quota
            if not allow_overdraft and proj.remaining is not None and \
                    proj.remaining < first_leg_gpu_hours(gpus.count * nodes):
                stops.append(Refused(f"the quota leaves {proj.remaining:.3f} GPU-h: not one leg of the run fits"))
        elif not allow_overdraft and not proj.fits:
            stops.append(Refused("the quota does not fit this rung (the arithmetic is above)"))
    finally:
        if ledger is not None:
            ledger.close()
    if not stops:
        return text, None
    first = stops[0]
    return text, type(first)("a real launch would be refused: " + "; ".join(e.message for e in stops),
                             hint=first.hint)


def _image_for(name: str, cfg: Config, ledger: Ledger, reviewed: dict[str, str]) -> str | None:
    """The image legs on this backend run: docker, one built from exactly the reviewed files
    (exit 3 otherwise); sky, one pushed (exit 3), with a store a cloud can reach (exit 2)."""
    if name == "docker":
        from launcher.image import image_for_launch

        return image_for_launch(cfg, ledger, reviewed)
    if name == "sky":
        from launcher.dryrun import sky_image_ref

        _sky_store(cfg)
        return sky_image_ref(cfg, ledger, reviewed, dry_run=False)
    return None


def _sky_store(cfg: Config) -> None:
    if not store_uri(cfg).startswith("hf://"):
        raise BadInput("the sky backend needs a store a cloud instance can reach: set store: hf://owner/repo "
                       f"(not {store_uri(cfg)}, which exists only on this machine)")


def up(cfg: Config, config_path: Path, rung_name: str, backend_name: str, gpus_text: str | None,
       show: Callable[[int, str], None], nodes: int = 1, allow_overdraft: bool = False, cpu: bool = False,
       steps: int | None = None, retry_until_up: bool = False, skip_preflight: str | None = None) -> Outcome:
    """Run one rung of the ladder and record it (`steps` overrides the config's)."""
    rung, gpus = validate_request(rung_name, backend_name, gpus_text, nodes, cpu=cpu, steps=steps)
    if skip_preflight is not None:
        check_skip_reason(rung, skip_preflight)
    cfg = with_steps(cfg, rung, steps)
    return execute(cfg, config_path, rung, backend_name, gpus, show, nodes, _run_rung, allow_overdraft,
                   retry_until_up=retry_until_up, skip_preflight=skip_preflight)


def check_skip_reason(rung: Rung, reason: str) -> None:
    if rung.name != "run":
        raise BadInput(f"--skip-preflight: only the run has a preflight gate (not rung {rung.name!r})")
    if not reason.strip() or len(reason) > 500 or any(ord(c) < 32 for c in reason):
        raise BadInput("--skip-preflight needs a reason: one line of 1 to 500 characters, e.g. "
                       "--skip-preflight \"re-run of a run whose report passed; only the data changed\"")


def drill(cfg: Config, config_path: Path, backend_name: str, gpus_text: str | None, kills: int, moment: str,
          show: Callable[[int, str], None], seed: int = 0, allow_overdraft: bool = False,
          kills_at: str | None = None) -> Outcome:
    """`launcher drill cold-resume`: recorded like a rung, run by launcher.rungs.drill."""
    from launcher.ladder import DRILL
    from launcher.rungs.drill import AUTO, MOMENTS, run_drill

    if backend_name not in BACKENDS:
        raise BadInput(f"unknown backend {backend_name!r} (backends: {', '.join(BACKENDS)})")
    if not 1 <= kills <= MAX_KILLS:
        raise BadInput(f"--kills must be 1 to {MAX_KILLS}, got {kills}",
                       hint=f"each kill is a relaunched leg; run several drills for more than {MAX_KILLS}")
    if moment not in (AUTO, *MOMENTS, "random"):
        raise BadInput(f"--at must be one of {', '.join((AUTO, *MOMENTS, 'random'))}, got {moment!r}")
    steps = cfg.rungs.drill.steps
    at_steps = parse_kill_steps(kills_at, steps) if kills_at is not None else None
    if at_steps is not None:
        kills = len(at_steps)
    gpus = parse_gpus(gpus_text) if gpus_text is not None else None
    rung = dataclasses.replace(DRILL, legs=kills + 1, needs_gpu=gpus is not None)
    return execute(cfg, config_path, rung, backend_name, gpus, show, 1,
                   lambda ctx, cmp: run_drill(ctx, steps, kills, moment, seed, at_steps), allow_overdraft)


def parse_kill_steps(text: str, steps: int) -> list[int]:
    """`--kills-at 7,15`: steps in increasing order, each inside the drill's run (1 .. steps-1)."""
    try:
        found = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"--kills-at takes steps separated by commas, e.g. 7,15; got {text!r}") from None
    if not found or len(found) > MAX_KILLS:
        raise BadInput(f"--kills-at takes 1 to {MAX_KILLS} steps, got {len(found)}")
    if any(b <= a for a, b in zip(found, found[1:])) or found[0] < 1 or found[-1] >= steps:
        raise BadInput(f"--kills-at steps must increase and lie in 1..{steps - 1} (the drill runs {steps} steps), "
                       f"got {text!r}")
    return found


def execute(cfg: Config, config_path: Path, rung: Rung, backend_name: str, gpus: GpuSpec | None,
            show: Callable[[int, str], None], nodes: int,
            runner: Callable[[RunContext, Any], list[Check]], allow_overdraft: bool = False,
            retry_until_up: bool = False, skip_preflight: str | None = None) -> Outcome:
    """Guard, record, run `runner`, close the record (also when interrupted)."""
    if rung.legs and backend_name == "docker":
        from launcher.image import docker_cli

        docker_cli()  # bad input (exit 2) before anything is recorded
    uri = store_uri(cfg)
    paths = reviewed_paths(cfg, strict=False)

    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")  # no ledger: no review, and nothing is made
    if ledger is None:
        raise Refused("no review recorded: nothing to compare the files against",
                      hint="run `launcher review` after reading the files to be run")
    try:
        cmp = guard_hashes(cfg, ledger)  # exit 3 on mismatch, before any row
        backend, image = _backend_for(rung, backend_name, cfg, ledger, cmp.current, nodes, retry_until_up)
        preflight = _gate(cfg, ledger, rung, cmp.current, image, gpus, skip_preflight)  # exit 3: no passing report
        files = {rel: StagedFile(path, cmp.current[rel]) for rel, path in paths.items()}
        ctx = RunContext(cfg, rung, backend, ledger, new_run_id(cfg.project, rung.name), uri, files, gpus, show,
                         nodes)
        reservation = _reserve(ctx, allow_overdraft)  # exit 3 when over quota
        ctx.store_key = project_key(cfg.state_path) if rung.legs else None  # made once a launch is certain
        config_sha = sha256_file(config_path)
        ledger.begin_run(dict(ledger_run_row(ctx, cmp.review.id, cmp.review.digest, config_sha), image=image,
                              preflight=json.dumps(preflight) if preflight else None), cmp.current)
        return _run_recorded(ctx, runner, cmp, reservation)
    finally:
        ledger.close()


def _reserve(ctx: RunContext, allow_overdraft: bool) -> int:
    """Price the rung and reserve its GPU-hours under the quota (exit 3 when over it);
    the reservation's id."""
    from launcher.spend import project, reserve

    cfg, rung, gpus, nodes = ctx.cfg, ctx.rung, ctx.gpus, ctx.nodes
    ctx.gpu_hour_price = _gpu_hour_price(cfg, ctx.backend, rung, gpus, nodes)
    ctx.allow_overdraft = allow_overdraft
    at_least = first_leg_gpu_hours(gpus.count * nodes) if rung.name == "run" and gpus else None
    held = reserve(cfg, ctx.ledger, ctx.run_id, rung.name, project(cfg, None, rung, gpus, nodes),
                   ctx.gpu_hour_price, allow_overdraft, at_least=at_least)
    ctx.quota_left_hours = held.remaining_gpu_hours
    ctx.reservation_id = held.id
    return held.id


def _run_recorded(ctx: RunContext, runner: Callable[[RunContext, Any], list[Check]], cmp: Any,
                  reservation: int) -> Outcome:
    """Run `runner` on the recorded run; its checks, end and verdict are written, and its
    quota reservation settled, however it ends (an interrupt included)."""
    from launcher.spend import settle

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
            checks.append(Check("ran to its end", False, str(stopped)))
            verdict = "stopped"
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
        ledger.add_checks(ctx.run_id, [c.to_json() for c in checks])
        gpus = ctx.gpus
        source = "config prices" if gpus and gpus.name in ctx.cfg.prices else "none"
        ledger.end_run(ctx.run_id, ended_at=time.time(), exit_code=exit_code, verdict=verdict,
                       cost_source=source)
        settle(ledger, reservation, ctx.run_id)


def _gate(cfg: Config, ledger: Ledger, rung: Rung, files: dict[str, str], image: str | None,
          gpus: GpuSpec | None, skip_preflight: str | None) -> dict[str, Any] | None:
    """The run launches only past a passing report (launcher.gate), or with a recorded reason."""
    if rung.name != "run":
        return None
    from launcher import gate

    if skip_preflight is not None:
        return gate.skipped(skip_preflight)
    return gate.check(cfg, ledger, files, image, gpus).to_json()


def _gpu_hour_price(cfg: Config, backend: Backend, rung: Rung, gpus: GpuSpec | None, nodes: int) -> float | None:
    """What the quota guard reserves USD at, per GPU-hour: SkyPilot's optimizer price of the
    whole instance (host VM included) spread over its GPUs where it can say, else the config's."""
    if gpus is None:
        return None
    pick = backend.quote(rung.name, gpus) if rung.legs else None
    if pick is not None:
        return pick.hourly_usd / (gpus.count * nodes)
    return cfg.prices.get(gpus.name)


def _backend_for(rung: Rung, name: str, cfg: Config, ledger: Ledger,
                 reviewed: dict[str, str], nodes: int, retry_until_up: bool = False) -> tuple[Backend, str | None]:
    """The backend the rung's legs run on, and the image they run (see _image_for); the host
    for a rung without legs (rung 0: it launches nothing)."""
    if not rung.legs:
        return make_backend(HOST), None
    image = _image_for(name, cfg, ledger, reviewed)
    return make_backend(name, cfg, image, nodes, retry_until_up), image


def _run_rung(ctx: RunContext, cmp) -> list[Check]:  # noqa: ANN001 - HashComparison
    from launcher.rungs import run_rung

    return run_rung(ctx, cmp)

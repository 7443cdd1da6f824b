"""One launch plan per `launcher up`: built once (`make_plan`), then executed
(`launcher.up.execute`) or shown (`--dry-run`, `launcher.cli.dryrun.describe`), never two
code paths that can disagree.

The plan holds the request as one typed value (`Request`: the rung, the backend, GPUs
per node and nodes, and the product of the two, computed here and nowhere else), every
leg the rung launches (the straight-through oracle included: `planned_legs`), the image
its legs run, the price the quota guard reserves at, and each guard's decision in the
order a launch meets them (`GUARDS`). A real launch stops at the first refusal; the dry
run evaluates every guard and exits with the first refusal's code, naming every reason.
The quota guard is `launcher.ops.spend.decide` both times: the dry run previews it in a
ledger transaction that is rolled back, the launch applies it in one that commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from launcher.backends import HOST, Backend, backend_class, make_backend
from launcher.cadence import notice_warning
from launcher.config.hub import store_answers
from launcher.config.schema import Config, GpuSpec, store_uri
from launcher.errors import BadInput, LauncherError, Refused
from launcher.ladder import Rung, leg_steps
from launcher.ledger.db import Ledger
from launcher.manifest import HashComparison, guard_hashes, hash_reviewed
from launcher.ops.shape import refuse_unrunnable, shape_warnings
from launcher.ops.spend import Projection, QuotaDecision, preview, project
from runtime.hashing import digest_lines as files_digest

GUARDS: dict[str, str] = {
    "docker": "the docker CLI is installed (a rung with legs on the docker backend; exit 2)",
    "gpus": "the GPUs asked for are on this host, as a leg would see them (a GPU rung on the local or docker "
    "backend; exit 3)",
    "review": "a review is recorded in the ledger (exit 3)",
    "hashes": "the files to be run are the reviewed ones (exit 3)",
    "store": "a Hub store answers a listing with this token, before any leg (exit 2; a file:// store was "
    "checked writable when the config loaded)",
    "image": "the image the legs run: docker, built from the reviewed files (exit 3); sky, pushed (exit 3), "
    "with a store a cloud can reach (exit 2)",
    "preflight": "the run launches only past a passing report, or with a recorded reason (exit 3)",
    "memory": "every rank's predicted peak plus its allowance fits the GPU asked for (a GPU rung; exit 3)",
    "quota": "used + reserved + this rung within the GPU-hour quota and the USD budget (exit 3)",
}
"""Every guard a launch passes, in the order it meets them: the one list the launch, the dry
run and the parity test (tests/legs/test_plan.py) read."""


@dataclass(frozen=True)
class Request:
    """What `launcher up` was asked, validated (launcher.up.validate_request)."""

    rung: Rung
    backend: str
    gpus: GpuSpec | None
    nodes: int = 1
    allow_overdraft: bool = False
    retry_until_up: bool = False
    skip_preflight: str | None = None

    @property
    def gpus_total(self) -> int:
        """GPUs of one leg, every node counted: what the quota, the price and a deadline count."""
        return (self.gpus.count if self.gpus else 0) * self.nodes


@dataclass(frozen=True)
class PlannedLeg:
    """One leg the rung launches: `leg` legs resume from the store, the `straight` one runs the
    same trainer straight through on an empty store of its own (the oracle, on a CPU)."""

    index: int
    role: str
    max_steps: int
    """Its LAUNCHER_MAX_STEPS (launcher.ladder.leg_steps, which the rung's runner launches by)."""


def planned_legs(rung: Rung, steps: int, can_terminate: bool) -> list[PlannedLeg]:
    """Every leg the rung launches, in order, with its step count (the run's are open-ended:
    its first is shown). `steps`: the rung's; `can_terminate`: whether the backend can SIGTERM
    a leg (a resume rung's leg 0 is stopped so where it can)."""
    legs = [PlannedLeg(i, "leg", n) for i, n in enumerate(leg_steps(rung.name, steps, can_terminate, rung.legs))]
    if rung.straight_leg:
        legs.append(PlannedLeg(rung.legs, "straight", steps))
    return legs


@dataclass(frozen=True)
class Decision:
    """One guard's answer: None passes; else the error the launch stops with."""

    guard: str
    refusal: LauncherError | None


@dataclass
class Plan:
    """Everything `launcher up` decides before it records a run (module docstring)."""

    cfg: Config
    request: Request
    ledger: Ledger | None
    reviewed: dict[str, str]
    """sha256 of every file to be run, by path."""
    legs: list[PlannedLeg]
    decisions: list[Decision] = field(default_factory=list)
    cmp: HashComparison | None = None
    image: str | None = None
    backend: Backend | None = None
    preflight: dict[str, Any] | None = None
    pick: Any = None
    """The provider's pick and price of one leg (sky: SkyPilot's optimizer), if it can say."""
    price: float | None = None
    """USD per GPU-hour the quota guard reserves at: the pick's, spread over its GPUs, else the config's."""
    projection: Projection | None = None
    quota: QuotaDecision | None = None
    memory: Any = None
    """The memory guard's decision (launcher.ops.memory.MemoryDecision): each rank's predicted peak on the GPU."""
    run_sha256: str | None = None
    """The `run:` script each node executes, where the legs run one (sky; local with --nodes N)."""
    store: str | None = None
    """The store the legs push to, as it answered the store guard (a Hub store's listing)."""
    env: dict[str, str] = field(default_factory=dict)
    """Leg 0's environment, redacted as the ledger records it (its run id a placeholder, its
    deadline counted from now): built by the function real legs use (launcher.legs.leg_env)."""

    @property
    def at_least(self) -> float | None:
        """The least the quota must leave the run for it to launch at all (GPU-hours); other rungs fit whole."""
        from launcher.rungs.run import first_leg_gpu_hours

        r = self.request
        return first_leg_gpu_hours(r.gpus_total) if r.rung.name == "run" and r.gpus else None

    def warnings(self) -> list[str]:
        """What the launch goes ahead despite, shown by the dry run and at the launch alike."""
        memory = self.memory.warnings() if self.memory is not None else []
        return notice_warning(self.request, self.preflight, self.pick) + shape_warnings(self.cfg, self.request) + memory

    def refusal(self, dry_run: bool = False) -> LauncherError | None:
        """The first refusal (None: it launches); the dry run's names every reason."""
        stops = [d.refusal for d in self.decisions if d.refusal is not None]
        if not stops:
            return None
        if not dry_run:
            return stops[0]
        return type(stops[0])(
            "a real launch would be refused: " + "; ".join(e.message for e in stops), hint=stops[0].hint
        )

    def to_json(self) -> dict[str, Any]:
        """The plan's facts for `up --dry-run --json`."""
        r = self.request
        return {
            "rung": r.rung.name,
            "backend": r.backend,
            "gpus": str(r.gpus) if r.gpus else None,
            "nodes": r.nodes,
            "gpus_total": r.gpus_total,
            "legs": [{"leg": leg.index, "role": leg.role, "max_steps": leg.max_steps} for leg in self.legs],
            "env": self.env,
            "run_sha256": self.run_sha256,
            "price_candidates": [{"resources": label, "hourly_usd": usd} for label, usd in self.pick.candidates]
            if self.pick is not None
            else [],
            "store": self.store,
            "image": self.image,
            "usd_per_gpu_hour": self.price,
            "quota": self.quota.arithmetic if self.quota else None,
            "memory": self.memory.to_json() if self.memory is not None else None,
            "guards": [
                {"guard": d.guard, "ok": d.refusal is None, "refusal": d.refusal.message if d.refusal else None}
                for d in self.decisions
            ],
        }

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def make_plan(cfg: Config, request: Request, dry_run: bool) -> Plan:
    """Decide every guard in GUARDS' order. A real launch raises at the first refusal (nothing
    recorded yet); the dry run records each and goes on. The caller closes the plan's ledger."""
    refuse_unrunnable(cfg, request)  # a leg shape that cannot run: refused before any guard (exit 3)
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")  # reading never creates one
    rung, steps = request.rung, (cfg.rung(request.rung.name).steps if request.rung.legs else 0)
    plan = Plan(cfg, request, ledger, {}, planned_legs(rung, steps, backend_class(request.backend).can_terminate))
    try:
        _decide_all(plan, dry_run)
    except BaseException:
        plan.close()
        raise
    return plan


def _decide_all(plan: Plan, dry_run: bool) -> None:
    cfg, request, rung = plan.cfg, plan.request, plan.request.rung

    def decide(guard: str, check: Callable[[], Any]) -> Any:
        assert guard in GUARDS, guard
        try:
            value = check()
        except LauncherError as err:
            if not dry_run:
                raise
            plan.decisions.append(Decision(guard, err))
            return None
        plan.decisions.append(Decision(guard, None))
        return value

    if rung.legs and request.backend == "docker":
        from launcher.image import docker_cli

        decide("docker", docker_cli)
    if rung.legs and request.gpus is not None and request.backend in ("local", "docker"):
        from launcher.backends.hostgpus import guard_host

        decide("gpus", lambda: guard_host(request.gpus, request.nodes, request.backend))
    decide("review", lambda: _reviewed(plan.ledger))
    plan.cmp = decide("hashes", lambda: guard_hashes(cfg, plan.ledger) if plan.ledger is not None else None)
    plan.reviewed = plan.cmp.current if plan.cmp is not None else hash_reviewed(cfg, strict=False)
    if rung.legs:
        plan.store = decide("store", lambda: store_answers(store_uri(cfg)))
    if (
        rung.legs
        and (request.backend == "sky" or request.nodes > 1)
        and not (request.backend == "sky" and rung.name == "run")
    ):
        from launcher.backends.sky.task import leg_script, script_sha256

        plan.run_sha256 = script_sha256(leg_script(cfg, rung.name))  # the managed job's differs: skyjob
    if rung.legs and plan.ledger is not None:
        plan.image = decide("image", lambda: _image_for(request.backend, cfg, plan.ledger, plan.reviewed))
    plan.backend = _backend(plan, dry_run)
    if rung.name == "run" and plan.ledger is not None and plan.cmp is not None:
        plan.preflight = decide("preflight", lambda: _gate(plan))
    if rung.legs and request.gpus is not None and plan.cmp is not None:
        from launcher.ops.memory import guard as memory_guard

        plan.memory = decide("memory", lambda: memory_guard(cfg, request, plan.reviewed, plan.ledger))
    plan.pick = plan.backend.quote(rung.name, request.gpus) if rung.legs and request.gpus else None
    plan.price = _gpu_hour_price(plan)
    plan.projection = project(cfg, plan.ledger, rung, request.gpus, request.nodes)
    plan.quota = preview(cfg, plan.ledger, plan.projection, plan.price, request.allow_overdraft, plan.at_least)
    decide("quota", lambda: _raise(plan.quota.refusal) if plan.quota is not None else None)
    if dry_run:
        plan.env = _dry_run_env(plan)


def _dry_run_env(plan: Plan) -> dict[str, str]:
    """Leg 0's environment as the launch would set it (secrets redacted), for the dry run to show."""
    cfg, request, rung = plan.cfg, plan.request, plan.request.rung
    from launcher.ladder import resume_leg0_hold
    from launcher.leg_env import redact

    steps = plan.legs[0].max_steps if plan.legs else 0
    hold0 = resume_leg0_hold(rung.name, cfg.rung(rung.name).steps, plan.backend.can_terminate) if rung.legs else None
    return redact(
        leg0_env(
            cfg,
            rung,
            request.gpus,
            request.gpus_total,
            steps,
            plan.quota.remaining_gpu_hours if plan.quota else None,
            plan.reviewed,
            hold0=hold0,
        ),
        cfg.secrets,
    )


def _raise(err: LauncherError | None) -> None:
    if err is not None:
        raise err


PLACEHOLDER_RUN = "dry-run"


def leg0_env(
    cfg: Config,
    rung: Rung,
    gpus: GpuSpec | None,
    gpus_total: int,
    steps: int,
    quota_left: float | None,
    reviewed: dict[str, str],
    now: float | None = None,
    hold0: int | None = None,
) -> dict[str, str]:
    """Leg 0's environment, built by the function real legs use (launcher.legs.leg_env) from the
    same facts: its step count (the plan's, launcher.ladder.leg_steps), and its deadline capped by
    the session cap and by what the quota still allows (`quota_left` GPU-hours, as the quota
    guard would leave it) over `gpus_total` GPUs (the plan's: every node counted), and where it
    holds for its SIGTERM (`hold0`, launcher.ladder.resume_leg0_hold: a resume rung's)."""
    from launcher.leg_env import Ending, ending_env, leg_deadline, leg_env

    if not rung.legs:
        return leg_env(cfg, rung.name, PLACEHOLDER_RUN, 0, store_uri(cfg), 0, now or time.time(), reviewed, gpus)
    left = None if quota_left is None else max(0.0, quota_left)
    deadline = leg_deadline(cfg, cfg.rung(rung.name).budget_minutes * 60.0, left, gpus_total, now)
    env = leg_env(cfg, rung.name, PLACEHOLDER_RUN, 0, store_uri(cfg), steps, deadline, reviewed, gpus)
    return env | ending_env(Ending(sigterm_at=hold0, hold_at=hold0))


def _reviewed(ledger: Ledger | None) -> None:
    if ledger is None:  # no ledger: no review, and the launch makes none
        raise Refused(
            "no review recorded: nothing to compare the files against",
            hint="run `launcher review` after reading the files to be run",
        )


def _image_for(name: str, cfg: Config, ledger: Ledger, reviewed: dict[str, str]) -> str | None:
    """The image legs on this backend run: docker, one built from exactly the reviewed files
    (exit 3 otherwise); sky, one pushed (exit 3), with a store a cloud can reach (exit 2)."""
    if name == "docker":
        from launcher.image import image_for_launch

        return image_for_launch(cfg, ledger, reviewed)
    if name == "sky":
        if not store_uri(cfg).startswith("hf://"):
            raise BadInput(
                "the sky backend needs a store a cloud instance can reach: set store: hf://owner/repo "
                f"(not {store_uri(cfg)}, which exists only on this machine)"
            )
        return sky_image_ref(cfg, ledger, reviewed, dry_run=False)
    return None


def sky_image_ref(cfg: Config, ledger: Ledger | None, reviewed: dict[str, str], dry_run: bool) -> str:
    """The pushed repo@sha256 of the image baked from the reviewed files."""
    rows = ledger.images(files_digest(reviewed)) if ledger is not None else []
    pushed = next((r["pushed_ref"] for r in rows if r["pushed_ref"]), None)
    if pushed:
        return pushed
    if dry_run:
        return f"preflight/{cfg.project}:{files_digest(reviewed)[:12]}"
    raise Refused(
        "no pushed image was built from the reviewed files: a cloud instance could not pull it",
        hint="run `launcher image build --gpu` and `launcher image push`",
    )


def _backend(plan: Plan, dry_run: bool) -> Backend:
    """The backend the rung's legs run on (the host for a rung without legs). A dry run whose
    image guard refused renders with the image a push would name (sky_image_ref)."""
    request = plan.request
    if not request.rung.legs:
        return make_backend(HOST)
    image = plan.image
    if image is None and dry_run and request.backend == "sky":
        image = sky_image_ref(plan.cfg, plan.ledger, plan.reviewed, dry_run=True)
    return make_backend(request.backend, plan.cfg, image, request.nodes, request.retry_until_up)


def _gate(plan: Plan) -> dict[str, Any]:
    """The run launches only past a passing report (launcher.report.gate), or with a recorded reason."""
    from launcher.report import gate

    if plan.request.skip_preflight is not None:
        return gate.skipped(plan.request.skip_preflight)
    assert plan.ledger is not None
    return gate.check(plan.cfg, plan.ledger, plan.reviewed, plan.image, plan.request.gpus).to_json()


def _gpu_hour_price(plan: Plan) -> float | None:
    """What the quota guard reserves USD at, per GPU-hour: the provider's price of the whole
    instance (host VM included) spread over its GPUs where it can say, else the config's."""
    gpus = plan.request.gpus
    if gpus is None:
        return None
    if plan.pick is not None:
        return float(plan.pick.hourly_usd) / plan.request.gpus_total
    return plan.cfg.prices.get(gpus.name)

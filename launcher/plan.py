"""One launch plan per `launcher up`: built once (`make_plan`), then executed
(`launcher.up.execute`) or shown (`--dry-run`, `launcher.dryrun.describe`), never two
code paths that can disagree.

The plan holds the request as one typed value (`Request`: the rung, the backend, GPUs
per node and nodes, and the product of the two, computed here and nowhere else), every
leg the rung launches (the straight-through oracle included: `planned_legs`), the image
its legs run, the price the quota guard reserves at, and each guard's decision in the
order a launch meets them (`GUARDS`). A real launch stops at the first refusal; the dry
run evaluates every guard and exits with the first refusal's code, naming every reason.
The quota guard is `launcher.spend.decide` both times: the dry run previews it in a
ledger transaction that is rolled back, the launch applies it in one that commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from launcher.backends import HOST, Backend, make_backend
from launcher.config import Config, GpuSpec, store_uri
from launcher.errors import BadInput, LauncherError, Refused
from launcher.ladder import Rung
from launcher.ledger import Ledger
from launcher.manifest import HashComparison, guard_hashes, hash_reviewed
from launcher.spend import Projection, QuotaDecision, preview, project
from runtime.hashing import digest_lines as files_digest

GUARDS: dict[str, str] = {
    "docker": "the docker CLI is installed (a rung with legs on the docker backend; exit 2)",
    "review": "a review is recorded in the ledger (exit 3)",
    "hashes": "the files to be run are the reviewed ones (exit 3)",
    "image": "the image the legs run: docker, built from the reviewed files (exit 3); sky, pushed (exit 3), "
             "with a store a cloud can reach (exit 2)",
    "preflight": "the run launches only past a passing report, or with a recorded reason (exit 3)",
    "quota": "used + reserved + this rung within the GPU-hour quota and the USD budget (exit 3)",
}
"""Every guard a launch passes, in the order it meets them: the one list the launch, the dry
run and the parity test (tests/test_plan.py) read."""


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


def planned_legs(rung: Rung) -> list[PlannedLeg]:
    """Every leg the rung launches, in order (the run's are open-ended: its first is shown)."""
    legs = [PlannedLeg(i, "leg") for i in range(rung.legs)]
    if rung.straight_leg:
        legs.append(PlannedLeg(rung.legs, "straight"))
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

    @property
    def at_least(self) -> float | None:
        """The least the quota must leave the run for it to launch at all (GPU-hours); other rungs fit whole."""
        from launcher.rungs.chain import first_leg_gpu_hours

        r = self.request
        return first_leg_gpu_hours(r.gpus_total) if r.rung.name == "run" and r.gpus else None

    def refusal(self, dry_run: bool = False) -> LauncherError | None:
        """The first refusal (None: it launches); the dry run's names every reason."""
        stops = [d.refusal for d in self.decisions if d.refusal is not None]
        if not stops:
            return None
        if not dry_run:
            return stops[0]
        return type(stops[0])("a real launch would be refused: " + "; ".join(e.message for e in stops),
                              hint=stops[0].hint)

    def to_json(self) -> dict[str, Any]:
        """The plan's facts for `up --dry-run --json`."""
        r = self.request
        return {"rung": r.rung.name, "backend": r.backend, "gpus": str(r.gpus) if r.gpus else None, "nodes": r.nodes,
                "gpus_total": r.gpus_total, "legs": [{"leg": leg.index, "role": leg.role} for leg in self.legs],
                "image": self.image, "usd_per_gpu_hour": self.price,
                "quota": self.quota.arithmetic if self.quota else None,
                "guards": [{"guard": d.guard, "ok": d.refusal is None,
                            "refusal": d.refusal.message if d.refusal else None} for d in self.decisions]}

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def make_plan(cfg: Config, request: Request, dry_run: bool) -> Plan:
    """Decide every guard in GUARDS' order. A real launch raises at the first refusal (nothing
    recorded yet); the dry run records each and goes on. The caller closes the plan's ledger."""
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")  # reading never creates one
    rung = request.rung
    plan = Plan(cfg, request, ledger, {}, planned_legs(rung))
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
    decide("review", lambda: _reviewed(plan.ledger))
    plan.cmp = decide("hashes", lambda: guard_hashes(cfg, plan.ledger) if plan.ledger is not None else None)
    plan.reviewed = plan.cmp.current if plan.cmp is not None else hash_reviewed(cfg, strict=False)
    if rung.legs and plan.ledger is not None:
        plan.image = decide("image", lambda: _image_for(request.backend, cfg, plan.ledger, plan.reviewed))
    plan.backend = _backend(plan, dry_run)
    if rung.name == "run" and plan.ledger is not None and plan.cmp is not None:
        plan.preflight = decide("preflight", lambda: _gate(plan))
    plan.pick = plan.backend.quote(rung.name, request.gpus) if rung.legs and request.gpus else None
    plan.price = _gpu_hour_price(plan)
    plan.projection = project(cfg, plan.ledger, rung, request.gpus, request.nodes)
    plan.quota = preview(cfg, plan.ledger, plan.projection, plan.price, request.allow_overdraft, plan.at_least)
    decide("quota", lambda: _raise(plan.quota.refusal) if plan.quota is not None else None)


def _raise(err: LauncherError | None) -> None:
    if err is not None:
        raise err


def _reviewed(ledger: Ledger | None) -> None:
    if ledger is None:  # no ledger: no review, and the launch makes none
        raise Refused("no review recorded: nothing to compare the files against",
                      hint="run `launcher review` after reading the files to be run")


def _image_for(name: str, cfg: Config, ledger: Ledger, reviewed: dict[str, str]) -> str | None:
    """The image legs on this backend run: docker, one built from exactly the reviewed files
    (exit 3 otherwise); sky, one pushed (exit 3), with a store a cloud can reach (exit 2)."""
    if name == "docker":
        from launcher.image import image_for_launch

        return image_for_launch(cfg, ledger, reviewed)
    if name == "sky":
        if not store_uri(cfg).startswith("hf://"):
            raise BadInput("the sky backend needs a store a cloud instance can reach: set store: hf://owner/repo "
                           f"(not {store_uri(cfg)}, which exists only on this machine)")
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
    raise Refused("no pushed image was built from the reviewed files: a cloud instance could not pull it",
                  hint="run `launcher image build --gpu` and `launcher image push`")


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
    """The run launches only past a passing report (launcher.gate), or with a recorded reason."""
    from launcher import gate

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

"""The preflight ladder: cheapest evidence first, each rung a different question.

The one source of rung facts: what each rung asks, where its legs run, how many
legs it trains (none: it runs on the host), whether it resumes, which proofs it
feeds, each leg's step count, and which function runs it (`runner`, resolved by
launcher.rungs). The table is the one in docs/design.md and the README; `launcher up
RUNG` looks rungs up by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import BadInput


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder."""

    name: str
    index: int
    where: str
    """Where its legs run: the host, a CPU leg, or a GPU instance."""
    question: str
    """The one question the rung answers."""
    needs_gpu: bool
    """Whether the rung's answer needs the accelerator."""
    legs: int
    """Legs a rung launches (0: runs on the host, no leg)."""
    proofs: tuple[int, ...]
    """Which of docs/design.md's eight proofs the rung feeds."""
    resumes: bool = False
    """Whether a later leg resumes from what an earlier one pushed (its resumes are checked)."""
    runner: str = ""
    """The function that runs it: "module:function" under launcher.rungs, called (ctx, cmp)
    (the drill's also takes its kills, moment and seed: `launcher drill` calls it)."""
    runner_sky: str | None = None
    """The runner on the sky backend, where it differs."""
    available: bool = True
    """False for rungs this version cannot run yet (refused with exit 2)."""
    oracle: bool = False
    """Whether its resumes are compared with the same trainer run straight through, on a CPU
    (one leg more: `straight_leg`). A GPU leg keeps the user's settings: no oracle there."""

    @property
    def straight_leg(self) -> bool:
        """Whether a straight-through leg runs beside its legs: the one place that decides it
        (the runners run it, the launch plan counts and shows it)."""
        return self.oracle and not self.needs_gpu

    @property
    def trains(self) -> bool:
        """Whether it launches legs that train (rung 0 checks on the host and trains nothing)."""
        return self.legs > 0


RUNGS: tuple[Rung, ...] = (
    Rung(
        "static",
        0,
        "host, seconds",
        "Does it import? Does the launch command line parse? "
        "Do the hashes of the files about to run match the reviewed ones?",
        False,
        0,
        (),
        runner="static:climb",
    ),
    Rung(
        "rehearsal",
        1,
        "fresh empty dir, CPU, minutes",
        "Does the whole control flow work with the real modules: plan, resume decision, cursor math, checkpoint cycle?",
        False,
        3,
        (1, 2, 3, 4, 7, 8),
        resumes=True,
        runner="rehearsal:climb",
        oracle=True,
    ),
    Rung(
        "smoke",
        2,
        "fresh instance, GPU, ~10 min",
        "Does it run on the accelerator: install, device, one real optimizer step, one push, one verified resume?",
        True,
        3,
        (1, 2, 3, 4, 8),
        resumes=True,
        runner="smoke:climb",
        oracle=True,
    ),
    Rung(
        "probe",
        3,
        "fresh instance, GPU, 1–1.5 h",
        "Does the config hold for hours: sustained rate, flat memory, cadence cost, cold resume from the store?",
        True,
        2,
        (1, 2, 3, 4, 5, 7),
        resumes=True,
        runner="probe:climb",
        oracle=True,
    ),
    Rung(
        "run",
        4,
        "fresh instance(s), leg after leg",
        "The run itself, after a signed report with every "
        "proof PASS: carried to its last step, each resume checked, spend watched against the plan",
        True,
        1,
        (5,),
        resumes=True,
        runner="run:climb",
        runner_sky="run_sky:climb",
    ),
)


RESUME_LEGS = 3
"""Legs of a resume rung (rehearsal, smoke): leg 0 trains and pushes, each later leg resumes."""
PROBE_TAIL_FRACTION = 0.1
"""The share of the probe's steps left to its cold-resumed leg."""


PAST_WARMUP = 13
"""The step a resume rung's last resumed leg before the final one trains to at least, where the
steps allow (`resume_plan`): 3 steps past a 10-step warm-up. That leg's LAUNCHER_MAX_STEPS is one
short of the run's (`leg_steps`), so a schedule whose horizon is each leg's own step limit runs
there with another LR than the straight-through run's. With equal thirds of 15 steps leg 1 ended
at step 10, inside the warm-up, where the horizon has no effect, and the rehearsal passed such a
schedule (measured on the reference trainer; at 20 steps, step 13, it failed the LR check)."""
MIN_LAST_LEG = 2
"""Steps left to a resume rung's final leg, at the least, when leg 1 is moved to PAST_WARMUP."""


def resume_plan(steps: int, legs: int = RESUME_LEGS) -> list[int]:
    """The step each leg of a resume rung ends at: equal shares, the last reaching `steps`; of three
    legs or more, the last but one past a 10-step warm-up where `steps` leaves room (PAST_WARMUP: 15
    steps and more)."""
    plan = [steps * (i + 1) // legs for i in range(legs)]
    if legs >= 3 and steps - MIN_LAST_LEG >= PAST_WARMUP:  # fewer steps: no room past a warm-up
        plan[-2] = max(plan[-2], PAST_WARMUP)
    return plan


def probe_plan(steps: int) -> list[int]:
    """LAUNCHER_MAX_STEPS of the probe's two legs: the long measured leg, then the cold resume."""
    first = max(1, steps - max(1, int(steps * PROBE_TAIL_FRACTION)))
    return [first, steps]


def leg_steps(rung: str, steps: int, can_terminate: bool, legs: int) -> list[int]:
    """LAUNCHER_MAX_STEPS of each of a rung's `legs` legs, in order: the one rule the launch plan
    shows and the rungs' runners launch by. A resume rung: leg 0 as `first_leg_steps` says, the
    middle legs one short of the end (their deadline stops them), the last to the end; the probe
    its two legs (`probe_plan`); the drill and the run train every leg to the end (the drill
    kills its legs on the way, the run's legs are stopped by their deadlines). A straight-through
    oracle leg, where there is one, trains to the end."""
    if rung == "static" or legs <= 0:
        return []
    if rung == "probe":
        return probe_plan(steps)[:legs]
    if rung in ("rehearsal", "smoke"):
        if legs == 1:
            return [steps]
        return [resume_leg0_steps(steps, can_terminate, legs)] + [steps - 1] * (legs - 2) + [steps]
    return [steps] * legs


def first_leg_steps(rung: str, steps: int, can_terminate: bool) -> int:
    """LAUNCHER_MAX_STEPS of a rung's leg 0 (`leg_steps`; 0 for a rung without legs). A resume
    rung's leg 0, on a backend that can SIGTERM a leg, is given all but the last step of leg 1's
    share and stopped by SIGTERM at the end of its own (launcher.rungs.resume_legs.plan_endings)."""
    planned = leg_steps(rung, steps, can_terminate, rung_named(rung).legs)
    return planned[0] if planned else 0


def resume_leg0_steps(steps: int, can_terminate: bool, legs: int = RESUME_LEGS) -> int:
    """LAUNCHER_MAX_STEPS of a resume rung's leg 0: with SIGTERM (sent at the end of its share),
    all but the last step of leg 1's share, so only the signal can stop it there; else its share."""
    plan = resume_plan(steps, legs)
    return plan[1] - 1 if can_terminate else plan[0]


def resume_leg0_hold(rung: str, steps: int, can_terminate: bool, legs: int = RESUME_LEGS) -> int | None:
    """Where a resume rung's leg 0 holds for its SIGTERM (LAUNCHER_HOLD_AT_STEP with
    LAUNCHER_HOLD_UNTIL=sigterm): the end of its share, where the launcher sends it; None for
    other rungs and for a backend that cannot SIGTERM a leg. The dry run shows it, the launch uses it."""
    if rung not in ("rehearsal", "smoke") or not can_terminate:
        return None
    return resume_plan(steps, legs)[0]


def rung_order() -> tuple[str, ...]:
    """Every rung by name, ladder order, then the drill."""
    return tuple(r.name for r in (*RUNGS, DRILL))


def resume_rungs() -> tuple[str, ...]:
    """The rungs whose legs resume, ladder order then the drill (the report ranks evidence so)."""
    return tuple(r.name for r in (*RUNGS, DRILL) if r.resumes)


def rung_named(name: str) -> Rung:
    """Look a rung up by name; an unknown name is bad input (exit 2)."""
    for rung in RUNGS:
        if rung.name == name:
            return rung
    names = ", ".join(r.name for r in RUNGS)
    raise BadInput(f"unknown rung {name!r} (rungs: {names})")


DRILL = Rung(
    "drill",
    -1,
    "the chosen backend",
    "Does the run survive losing its instance at the worst "
    "moment: resumed solely from the store, at the newest verified checkpoint, exactly?",
    False,
    3,
    (1, 2, 3, 4, 6, 8),
    resumes=True,
    runner="drill:climb",
    oracle=True,
)
"""Not a rung of the ladder: `launcher drill cold-resume`, recorded like one."""

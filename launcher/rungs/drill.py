"""`launcher drill cold-resume`: kill the instance at a chosen moment, relaunch on an
empty disk, and check that the run resumed exactly — N times.

Moments, read from the leg's own events (each after the leg's first completed
storage cycle, so there is a verified checkpoint to fall back to):
  after-push   a checkpoint went through its whole cycle (`prune` seen)
  mid-save     the next checkpoint was snapshot and its background write is in flight (an
               asynchronous `save`); a trainer that saves synchronously has no such moment
  mid-push     the next checkpoint was written and handed to the upload (`serialized`, or a
               synchronous `save`): upload in flight
  mid-verify   the next checkpoint was uploaded and is being read back (`push`)
  mid-step     two steps after the leg's first completed cycle
  random       one of the above but mid-save, per kill (seeded)
  auto         (the default) kills placed where rare state changes, read from the events of
               the straight-through run, which a CPU drill runs first: one SIGKILL just after
               the first change of the LR's course the trainer printed (a plateau cut, the
               end of warm-up) and one graceful SIGTERM just after the first epoch boundary
               (the `epoch` a step prints); more kills spread between. A GPU drill has no
               straight run to read: its kills go at even steps, the second a SIGTERM.
  mid-epoch    a graceful SIGTERM after half the steps of the first epoch (read, as `auto`
               does, from the straight run's `epoch`): the next leg resumes mid-epoch 0
  epoch-end    a SIGTERM at the first epoch's last step: the next leg resumes exactly at the
               epoch boundary, its first step the second epoch's first
  mid-epoch-1  a SIGTERM after half the steps of the second epoch: a resume mid-epoch >= 1
`--at` takes one moment for every kill, or a comma list of one per kill in order
(`mid-epoch,epoch-end,mid-epoch-1`: three kills, the 2nd and 3rd resumes in the same run).
`--kills-at STEP,STEP` kills when rank 0 prints each of those steps (a user's own schedule).
A SIGTERM "kill" is a graceful stop, as a spot notice or `launcher stop` sends: the leg holds
at the planned step until it comes (LAUNCHER_HOLD_AT_STEP), must stop on it, push a final
checkpoint, and the store's newest verified must be that step.
On the local backend the leg is frozen (SIGSTOP) at that line and killed with
its disk; then the store is read — the newest *verified* checkpoint there is
where the next leg must resume. A kill mid-push or mid-verify
must fall back to the previous verified checkpoint. The moments and the `auto` placement
are in launcher/rungs/drill_moments.py.
"""

from __future__ import annotations

import json
import os
import random
from typing import Callable

from launcher.backends.local import trainer_python
from launcher.checks.evidence import Check, Kind, silent
from launcher.checks.kills import Kill, brief, check_store_after_kill, drill_checks, read_states
from launcher.checks.leg import check_leg_exit
from launcher.checks.readback import StateReader, check_leg_store
from launcher.leg_env import Ending
from launcher.legs import LegOutcome, RunContext, run_leg
from launcher.rungs.drill_moments import NODE_LOST, Planned, Unplaced, kill_predicate, planned_kills, step_predicate
from launcher.rungs.oracle import find_oracle, judge
from runtime.store.base import newest_verified
from runtime.store.seal import KEY_ENV


def climb(
    ctx: RunContext, steps: int, kills: int, moments: list[str], seed: int = 0, kills_at: list[int] | None = None
) -> list[Check]:
    """Kill and relaunch `kills` times (with `kills_at`, one kill at each of its steps: the
    caller passes their count), then let the last leg finish; return the checks. `moments`: one
    for every kill, or one per kill (drill_moments.parse_at). On a CPU the straight-through run
    (the oracle) goes first: `--at auto` and the epoch moments read their steps there."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV} | ctx.secrets()
    reader = StateReader(trainer_python(ctx.cfg.trainer.command), ctx.store_uri, f"runs/{ctx.run_id}", env)
    try:
        return _drill(ctx, steps, kills, moments, seed, kills_at, reader)
    finally:
        reader.close()


def _drill(
    ctx: RunContext,
    steps: int,
    kills: int,
    moments: list[str],
    seed: int,
    kills_at: list[int] | None,
    reader: StateReader,
) -> list[Check]:
    rng = random.Random(seed)
    store = ctx.open_store()
    outs: list[LegOutcome] = []
    record: list[Kill] = []
    placed: list[Check] = []  # each epoch moment's leg stopped where it was planned
    straight, oracle = None, find_oracle(ctx, kills + 1, steps)  # one the ledger proves the drill's own: rungs.oracle
    if ctx.rung.straight_leg and oracle is None:  # the oracle: the same trainer straight through, on an empty store
        straight = run_leg(ctx, kills + 1, steps, ending=Ending(straight=True))
    first = oracle or straight
    try:
        plan = planned_kills(kills, moments, kills_at, steps, first.events if first else None, rng)
    except Unplaced as err:  # an epoch moment the straight run has no place for: no leg runs
        return [not_placed(str(err))]
    if len(plan) < kills:  # --at auto: no step left between the first checkpoint and the run's end
        return [no_room(kills, len(plan), steps)]
    for leg in range(kills + 1):
        if leg == kills:
            outs.append(run_leg(ctx, leg, steps))
            break
        planned = plan[leg]
        chosen = planned.name
        if planned.how == "sigterm":
            record.append(sigterm_leg(ctx, store, outs, leg, steps, planned))
            record[-1].reads = read_states(reader, store, outs, record[-1].expected)
            if planned.moment:
                placed.append(stopped_where_planned(outs[-1], planned))
            continue
        outs.append(_killed_leg(ctx, leg, steps, planned, record))
        if record and record[-1].leg == leg:
            # Read after the kill: the instance is gone, so this is the store the next leg will find
            # (a backend that cannot freeze a leg may have let it verify once more before dying).
            newest = newest_verified(store)
            record[-1].expected = newest.step if newest else None
            record[-1].store_check = check_store_after_kill(store, outs, newest.step if newest else None)
            record[-1].reads = read_states(reader, store, outs, record[-1].expected)
        if not record or record[-1].leg != leg:  # the leg ended before the moment came
            return _missed(outs, leg, chosen)
    from launcher.rungs.resume_legs import exact_checks, under_torchrun

    legs, said = [o.events for o in outs], list[Check]()
    if oracle is not None:  # judged against the reused oracle, or (a check failed there) a fresh straight leg
        said, straight = judge(ctx, oracle, legs, steps)
    checks = drill_checks(outs, record, steps, straight, under_torchrun(ctx)) + placed + said
    checks.append(check_leg_store(store, outs[-1].events))
    if oracle is not None and straight is None:
        return checks
    return checks + exact_checks(ctx, legs, straight.events if straight else None, bool(ctx.gpu_count), steps)


def _killed_leg(ctx: RunContext, leg: int, steps: int, planned: Planned, record: list[Kill]) -> LegOutcome:
    """Leg `leg`, killed at its planned moment: the kill goes when rank 0 prints the moment's line
    (the Kill is recorded then)."""
    chosen = planned.name
    seen: list[str] = []
    predicate = kill_predicate(chosen) if planned.how != "step" else step_predicate(int(planned.step or 0))

    def kill_when(line: str, predicate: Callable[[str], bool] = predicate, seen: list[str] = seen) -> bool:
        hit = predicate(line)
        if hit:
            seen.append(line.strip())
        return hit

    def at_kill(leg: int = leg, chosen: str = chosen, seen: list[str] = seen) -> str:
        record.append(Kill(leg, chosen, seen[0] if seen else "", None))
        return f"drill kill {chosen} at {brief(seen[0]) if seen else '?'}"

    return run_leg(
        ctx, leg, steps, kill_when=kill_when, at_kill=at_kill, lose_node=ctx.nodes - 1 if chosen == NODE_LOST else None
    )


def _missed(outs: list[LegOutcome], leg: int, chosen: str) -> list[Check]:
    """The leg ended before its kill moment came: the answer, naming the cause."""
    if silent(outs[-1].events):
        return [check_leg_exit(o) for o in outs]  # the leg said nothing: that is the answer
    return [check_leg_exit(o) for o in outs] + [
        Check(
            f"leg {leg}: reached the kill moment {chosen}",
            False,
            f"leg {leg} exited {outs[-1].result.exit_code} before any `{chosen}` moment: raise the drill's "
            "steps or lower the checkpoint cadence",
            kind=Kind.KILL_MOMENT,
            leg=leg,
        )
    ]


def no_room(kills: int, room: int, steps: int) -> Check:
    return Check(
        "the drill's kills fit its steps",
        False,
        f"{kills} kills planned, room for {room} between the first storage cycle and step {steps}: "
        "raise rungs.drill.steps or lower the checkpoint cadence",
        kind=Kind.KILLS_FIT,
    )


def not_placed(why: str) -> Check:
    return Check("the drill's moments fit its run", False, f"{why}; no leg was killed", kind=Kind.KILLS_FIT)


def stopped_where_planned(out: LegOutcome, planned: Planned) -> Check:
    """An epoch moment's leg stopped at its planned step (the next leg resumes exactly there): a
    leg that resumed past it, or a trainer that does not hold at LAUNCHER_HOLD_AT_STEP, did not."""
    leg = out.events.leg
    stop = out.events.last("stop")
    stopped = stop[1].get("step") if stop else None
    return Check(
        f"leg {leg}: reached the kill moment {planned.moment}",
        stopped == planned.step,
        f"leg {leg} stopped at step {stopped}, {planned.moment} planned it at step {planned.step}"
        + (
            ""
            if stopped == planned.step
            else ": the next leg would not resume there (an earlier kill fell back "
            "past it, or the trainer ran on after its step)"
        ),
        out.events.pointer(stop),
        kind=Kind.KILL_MOMENT,
        leg=leg,
    )


def sigterm_leg(
    ctx: RunContext,
    store,
    outs: list[LegOutcome],
    leg: int,
    steps: int,  # noqa: ANN001
    planned: Planned,
) -> Kill:
    """A graceful stop in place of a kill: SIGTERM when rank 0 prints the planned step, the leg
    held there until it comes (so it stops at that step on any machine speed); then the store as
    the next leg will find it."""
    out = run_leg(ctx, leg, steps, ending=Ending(sigterm_at=planned.step, hold_at=planned.step))
    outs.append(out)
    newest = newest_verified(store)
    stop = out.events.last("stop")
    return Kill(
        leg,
        planned.name,
        json.dumps(stop[1]) if stop else "",
        newest.step if newest else None,
        check_store_after_kill(store, outs, newest.step if newest else None, "the SIGTERM"),
        sigterm_at=planned.step,
    )

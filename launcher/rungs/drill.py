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
On the local backend the leg is frozen (SIGSTOP) at that line and killed with
its disk; then the store is read — the newest *verified* checkpoint there is
where the next leg must resume. A kill mid-push or mid-verify
must fall back to the previous verified checkpoint.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable

from launcher.evidence import Check, LegEvents, silent
from launcher.legs import Ending, LegOutcome, RunContext, run_leg
from launcher.rungs.checks import check_leg_exit
from runtime.cycle import newest_verified
from runtime.events import parse_line

MOMENTS = ("after-push", "mid-save", "mid-push", "mid-verify", "mid-step")
RANDOM_MOMENTS = ("after-push", "mid-push", "mid-verify", "mid-step")
"""What `random` picks from: the moments every trainer has (a synchronous save has no mid-save)."""


def kill_predicate(moment: str) -> Callable[[str], bool]:
    """True on the output line at which to kill, for one leg (state kept per leg)."""
    seen = {"cycled": False, "steps_after": 0}

    def at(line: str) -> bool:
        event = parse_line(line)
        if event is None or event.get("rank", 0) != 0:
            return False
        kind, cycled = event["event"], seen["cycled"]
        if kind == "prune":
            seen["cycled"] = True
            return moment == "after-push"
        if not cycled:
            return False
        if kind == "step":
            seen["steps_after"] += 1
        background = kind == "save" and event.get("async_save") is True
        return {"mid-save": background,
                "mid-push": kind == "serialized" or (kind == "save" and not background), "mid-verify": kind == "push",
                "mid-step": kind == "step" and seen["steps_after"] == 2}.get(moment, False)
    return at


@dataclass
class Kill:
    leg: int
    moment: str
    at_line: str
    expected: int | None
    """The newest verified checkpoint's step in the store once the leg was dead (None: nothing verified)."""
    store_check: Check | None = None
    """The launcher's read of that checkpoint, against what the legs' logs say was verified."""


def check_store_after_kill(store, outs: list[LegOutcome], newest: int | None,  # noqa: ANN001
                           when: str = "the kill") -> Check:
    """The resume point must not come only from the store as found: every checkpoint the
    legs' logs call verified may be pruned, never lost, so the newest one the store holds
    is at least the newest the logs verified; and the launcher reads it back itself."""
    from launcher.readback import read_checkpoint

    leg = outs[-1].events.leg
    claimed = [int(e["step"]) for o in outs for _, e in o.events.all("verify") if e.get("ok")]
    newest_claimed = max(claimed) if claimed else None
    name = f"leg {leg}: the store after {when} holds the newest verified checkpoint"
    if newest_claimed is not None and (newest is None or newest < newest_claimed):
        return Check(name, False, f"the logs say step {newest_claimed} was verified, but the newest verified "
                     f"checkpoint in the store after {when} is {newest}: the store lost checkpoints")
    if newest is None:
        return Check(name, True, "nothing verified yet, in the logs or the store: a fresh start is right")
    ok, detail, _ = read_checkpoint(store, newest)
    return Check(name, ok, f"{detail} (newest verified in the logs: step {newest_claimed})")


def run_drill(ctx: RunContext, steps: int, kills: int, moment: str, seed: int = 0) -> list[Check]:
    """Kill and relaunch `kills` times, then let the last leg finish; return the checks."""
    rng = random.Random(seed)
    store = ctx.open_store()
    outs: list[LegOutcome] = []
    record: list[Kill] = []
    for leg in range(kills + 1):
        if leg == kills:
            outs.append(run_leg(ctx, leg, steps))
            break
        chosen = rng.choice(RANDOM_MOMENTS) if moment == "random" else moment
        seen: list[str] = []
        predicate = kill_predicate(chosen)

        def kill_when(line: str, predicate: Callable[[str], bool] = predicate, seen: list[str] = seen) -> bool:
            hit = predicate(line)
            if hit:
                seen.append(line.strip())
            return hit

        def at_kill(leg: int = leg, chosen: str = chosen, seen: list[str] = seen) -> str:
            record.append(Kill(leg, chosen, seen[0] if seen else "", None))
            return f"drill kill {chosen} at {_brief(seen[0]) if seen else '?'}"

        outs.append(run_leg(ctx, leg, steps, kill_when=kill_when, at_kill=at_kill))
        if record and record[-1].leg == leg:
            # Read after the kill: the instance is gone, so this is the store the next leg will find
            # (a backend that cannot freeze a leg may have let it verify once more before dying).
            newest = newest_verified(store)
            record[-1].expected = newest.step if newest else None
            record[-1].store_check = check_store_after_kill(store, outs, newest.step if newest else None)
        if not record or record[-1].leg != leg:  # the leg ended before the moment came
            if silent(outs[-1].events):
                return [check_leg_exit(o) for o in outs]  # the leg said nothing: that is the answer
            return [check_leg_exit(o) for o in outs] + [Check(
                f"leg {leg}: reached the kill moment {chosen}", False,
                f"leg {leg} exited {outs[-1].result.exit_code} before any `{chosen}` moment: raise the drill's "
                "steps or lower the checkpoint cadence")]
    straight = None
    if not ctx.gpu_count:  # the oracle: the same trainer straight through, on its own empty store
        s_out = run_leg(ctx, len(outs), steps, ending=Ending(straight=True))
        straight = s_out
    from launcher.readback import check_leg_store
    from launcher.rungs.resume import oracle_checks

    exact = not ctx.gpu_count and ctx.cfg.trainer.deterministic
    checks = drill_checks(outs, record, steps, straight) + [check_leg_store(store, outs[-1].events)]
    return checks + oracle_checks(ctx, [o.events for o in outs], straight.events if straight else None, exact, steps)


def drill_checks(outs: list[LegOutcome], kills: list[Kill], steps: int,
                 straight: LegOutcome | None = None) -> list[Check]:
    """The kill and store checks (the timeline's come from rehearsal.oracle_checks)."""
    checks = [Check(f"leg {k.leg} killed {k.moment}", True,
                    f"killed at {_brief(k.at_line)}; newest verified in store after the kill: step {k.expected}",
                    ()) for k in kills]
    checks += [check_nothing_left(outs[k.leg]) for k in kills]
    checks += [k.store_check for k in kills if k.store_check is not None]
    for kill, out in zip(kills, outs[1:]):
        checks.append(check_resumed_newest(out.events, kill))
    checks.append(check_leg_exit(outs[-1]))
    done = outs[-1].events.last("done")
    checks.append(Check("the run ended at exactly its step count", bool(done and done[1]["step"] == steps),
                        f"last leg finished at step {done[1]['step'] if done else None} of {steps}",
                        outs[-1].events.pointer(done)))
    if straight is not None:
        ran = check_leg_exit(straight)
        checks.append(Check(f"straight-through run (leg {straight.events.leg}, no restart) finished", ran.ok,
                            ran.detail, ran.evidence))
    return checks


def check_nothing_left(out: LegOutcome) -> Check:
    """A lost instance takes every process of the leg with it (torchrun's workers too): a
    survivor would go on training and writing to the store beside the resumed leg."""
    r = out.result
    name = f"leg {out.events.leg}: no process outlived the kill"
    if r.survivors is None:
        return Check(name, True, "this backend's kill ends the whole instance; nothing is counted")
    found = "" if r.killed_processes is None else f"{r.killed_processes} processes of the leg killed; "
    return Check(name, r.survivors == 0, f"{found}{r.survivors} left once the kill returned")


def check_resumed_newest(ev: LegEvents, kill: Kill) -> Check:
    resume = ev.first("resume")
    got = resume[1]["from_step"] if resume else None
    name = f"leg {ev.leg} resumed from the newest verified checkpoint"
    detail = f"resumed at step {got}; the newest verified checkpoint when leg {kill.leg} died was step {kill.expected}"
    return Check(name, got == kill.expected, detail, ev.pointer(resume))


def _brief(line: str) -> str:
    event = parse_line(line)
    if event is None:
        return line[:80]
    return json.dumps({k: event[k] for k in ("event", "step", "name") if k in event})

"""`launcher drill cold-resume`: kill the instance at a chosen moment, relaunch on an
empty disk, and check that the run resumed exactly — N times.

Moments, read from the leg's own events (each after the leg's first completed
storage cycle, so there is a verified checkpoint to fall back to):
  after-push   a checkpoint went through its whole cycle (`prune` seen)
  mid-push     the next checkpoint was saved and handed to the pusher (`save`): upload in flight
  mid-verify   the next checkpoint was uploaded and is being read back (`push`)
  mid-step     two steps after the leg's first completed cycle
  random       one of the above per kill (seeded)
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

from launcher.evidence import Check, LegEvents, surviving_timeline
from launcher.legs import LegOutcome, RunContext, run_leg
from launcher.rehearsal import check_leg_exit, check_lr, check_no_reread
from runtime.contract import NO_SAMPLE_INDEX
from runtime.cycle import newest_verified
from runtime.events import parse_line
from runtime.metrics import loss_continuity

MOMENTS = ("after-push", "mid-push", "mid-verify", "mid-step")


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
        return {"mid-push": kind == "save", "mid-verify": kind == "push",
                "mid-step": kind == "step" and seen["steps_after"] == 2}.get(moment, False)
    return at


@dataclass
class Kill:
    leg: int
    moment: str
    at_line: str
    expected: int | None
    """The newest verified checkpoint's step in the store once the leg was dead (None: nothing verified)."""


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
        chosen = rng.choice(MOMENTS) if moment == "random" else moment
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
        if not record or record[-1].leg != leg:  # the leg ended before the moment came
            return [check_leg_exit(o) for o in outs] + [Check(
                f"leg {leg}: reached the kill moment {chosen}", False,
                f"leg {leg} exited {outs[-1].result.exit_code} before any `{chosen}` moment: raise the drill's "
                "steps or lower the checkpoint cadence")]
    return drill_checks(outs, record, steps)


def drill_checks(outs: list[LegOutcome], kills: list[Kill], steps: int) -> list[Check]:
    checks = [Check(f"leg {k.leg} killed {k.moment}", True,
                    f"killed at {_brief(k.at_line)}; newest verified in store after the kill: step {k.expected}",
                    ()) for k in kills]
    checks += [check_nothing_left(outs[k.leg]) for k in kills]
    for kill, out in zip(kills, outs[1:]):
        checks.append(check_resumed_newest(out.events, kill))
        if kill.expected is not None:  # with nothing verified, a fresh start is the right answer
            checks += [check_lr_replay(outs[kill.leg].events, out.events),
                       check_position(outs[kill.leg].events, out.events),
                       check_replay(outs[kill.leg].events, out.events)]
    checks.append(check_leg_exit(outs[-1]))
    done = outs[-1].events.last("done")
    checks.append(Check("the run reached its end", bool(done and done[1]["step"] == steps),
                        f"last leg finished at step {done[1]['step'] if done else None} of {steps}",
                        outs[-1].events.pointer(done)))
    checks.append(check_no_reread(surviving_timeline([o.events for o in outs])))
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


def check_lr_replay(before: LegEvents, after: LegEvents) -> Check:
    """The first resumed LR equals the schedule's, and every re-run step's LR equals
    the one the killed leg used there: a scheduler restored only in part shows here."""
    first = check_lr(after)
    pre = {e["step"]: e["lr"] for _, e in before.all("step")}
    post = {e["step"]: e["lr"] for _, e in after.all("step")}
    overlap = sorted(set(pre) & set(post))
    wrong = [s for s in overlap if pre[s] != post[s]]
    detail = first.detail + (f"; steps {overlap[0]}-{overlap[-1]} re-run with the same LR" if overlap and not wrong
                             else f"; step {wrong[0]} re-ran with LR {post[wrong[0]]!r}, leg {before.leg} had "
                                  f"{pre[wrong[0]]!r}" if wrong else "")
    return Check(first.name, first.ok and not wrong, detail, first.evidence)


def check_position(before: LegEvents, after: LegEvents) -> Check:
    """The resumed leg reads, at each step, exactly what the killed leg read at that step."""
    name = f"leg {after.leg}: exact data position"
    resume, first = after.first("resume"), after.first("step")
    if resume is None or first is None:
        return Check(name, False, "no resume or step event in the resumed leg")
    if any("sample_index" not in e for _, e in before.all("step") + [first]):
        return Check(name, False, NO_SAMPLE_INDEX)
    earlier = {e["step"]: e["sample_index"] for _, e in before.all("step")}
    step = first[1]["step"]
    ok = first[1]["sample_index"] == resume[1]["sample_index"] and earlier.get(step, first[1]["sample_index"]) == \
        first[1]["sample_index"]
    return Check(name, ok, f"step {step} reads from sample {first[1]['sample_index']} (cursor {resume[1]['sample_index']}, "
                 f"batch {resume[1]['batch_hash'][:12]} re-hashed on resume); leg {before.leg} read "
                 f"{earlier.get(step, 'nothing')} there", after.pointer(resume) + after.pointer(first))


def check_replay(before: LegEvents, after: LegEvents) -> Check:
    """Loss continuity: steps the killed leg had already run are re-run identically (within
    the run's own noise band); otherwise the jump across the restart is compared."""
    name = f"leg {after.leg}: loss continuity"
    pre = {e["step"]: e["loss"] for _, e in before.all("step")}
    post = {e["step"]: e["loss"] for _, e in after.all("step")}
    resume = after.first("resume")
    start = resume[1]["from_step"] if resume else 0
    upto = [pre[s] for s in sorted(pre) if s <= start]
    cont = loss_continuity(upto, [post[s] for s in sorted(post)]) if post else None
    overlap = sorted(set(pre) & set(post))
    if overlap:
        worst = max(abs(pre[s] - post[s]) for s in overlap)
        band = cont.band if cont else 1e-6
        return Check(name, worst <= band, f"steps {overlap[0]}-{overlap[-1]} re-run after the kill: max |loss diff| "
                     f"{worst:.6f} (band +-{band:.5f})", after.pointer(after.first("step")))
    if cont is None:
        return Check(name, False, "too few steps on one side of the restart")
    return Check(name, cont.ok, f"jump across the restart {cont.delta:+.5f} (band +-{cont.band:.5f})",
                 after.pointer(after.first("step")))


def _brief(line: str) -> str:
    event = parse_line(line)
    if event is None:
        return line[:80]
    return json.dumps({k: event[k] for k in ("event", "step", "name") if k in event})

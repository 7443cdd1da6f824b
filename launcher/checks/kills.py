"""The checks of a killed leg and the leg that resumed after it: what the store held once the
instance was dead (read by the launcher, not told by the leg), that the kill left nothing
running, and that the next leg resumed from the newest verified checkpoint with its state.
Used by the cold-resume drill (launcher.rungs.drill), the preemption drill and the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents
from launcher.checks.leg import check_ending, check_leg_exit
from launcher.checks.readback import StateReader, read_checkpoint
from launcher.checks.state import tracked_kinds
from launcher.leg_env import Ending
from launcher.legs import LegOutcome
from runtime.events import parse_line


@dataclass
class Kill:
    leg: int
    moment: str
    at_line: str
    expected: int | None
    """The newest verified checkpoint's step in the store once the leg was dead (None: nothing verified)."""
    store_check: Check | None = None
    """The launcher's read of that checkpoint, against what the legs' logs say was verified."""
    sigterm_at: int | None = None
    """A graceful stop, not a kill: the SIGTERM went when rank 0 printed this step (the leg must
    stop on it with a final push)."""
    reads: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The launcher's read of the state of each checkpoint the store held once the leg was dead,
    from the newest verified one on (newer ones never verified), by step (`read_states`)."""


def check_store_after_kill(
    store,
    outs: list[LegOutcome],
    newest: int | None,  # noqa: ANN001
    when: str = "the kill",
) -> Check:
    """The resume point must not come only from the store as found: every checkpoint the
    legs' logs call verified may be pruned, never lost, so the newest one the store holds
    is at least the newest the logs verified; and the launcher reads it back itself."""
    leg = outs[-1].events.leg
    claimed = [int(e["step"]) for o in outs for _, e in o.events.all("verify") if e.get("ok")]
    newest_claimed = max(claimed) if claimed else None
    name = f"leg {leg}: the store after {when} holds the newest verified checkpoint"
    if newest_claimed is not None and (newest is None or newest < newest_claimed):
        return Check(
            name,
            False,
            f"the logs say step {newest_claimed} was verified, but the newest verified "
            f"checkpoint in the store after {when} is {newest}: the store lost checkpoints",
            kind=Kind.STORE_AFTER_KILL,
            leg=leg,
        )
    if newest is None:
        return Check(
            name,
            True,
            "nothing verified yet, in the logs or the store: a fresh start is right",
            kind=Kind.STORE_AFTER_KILL,
            leg=leg,
        )
    ok, detail, _ = read_checkpoint(store, newest)
    return Check(
        name, ok, f"{detail} (newest verified in the logs: step {newest_claimed})", kind=Kind.STORE_AFTER_KILL, leg=leg
    )


def read_states(
    reader: StateReader,
    store,
    outs: list[LegOutcome],
    newest: int | None,  # noqa: ANN001
) -> dict[int, dict[str, Any]]:
    """The state the next leg must train from, as the launcher reads it: the store's newest
    verified checkpoint, and each newer one that never verified (to name it if a leg trains
    from one), digested by `runtime.programs.loadcheck` (StateReader)."""
    kinds = tracked_kinds([o.events for o in outs]) or {}
    found = [c for c in store.scan().checkpoints if newest is None or c.step >= newest]
    return {c.step: reader.read(c.name, kinds) for c in found}


def drill_checks(
    outs: list[LegOutcome], kills: list[Kill], steps: int, straight: LegOutcome | None = None, torchrun: bool = False
) -> list[Check]:
    """The kill and store checks (the timeline's come from rehearsal.oracle_checks)."""

    checks = [
        Check(
            f"leg {k.leg} killed {k.moment}",
            True,
            f"killed at {brief(k.at_line)}; newest verified in store after the kill: step {k.expected}",
            (),
            kind=Kind.KILLED,
            leg=k.leg,
            facts={"moment": k.moment, "expected": k.expected},
        )
        for k in kills
        if k.sigterm_at is None
    ]
    for k in kills:
        if k.sigterm_at is not None:
            checks += _sigterm_checks(outs[k.leg], k, torchrun)
    checks += [check_nothing_left(outs[k.leg]) for k in kills if k.sigterm_at is None]
    checks += [k.store_check for k in kills if k.store_check is not None]
    for kill, out in zip(kills, outs[1:]):
        checks.append(check_resumed_newest(out.events, kill))
    checks.append(check_leg_exit(outs[-1]))
    done = outs[-1].events.last("done")
    checks.append(
        Check(
            "the run ended at exactly its step count",
            bool(done and done[1]["step"] == steps),
            f"last leg finished at step {done[1]['step'] if done else None} of {steps}",
            outs[-1].events.pointer(done),
            kind=Kind.RUN_LENGTH,
        )
    )
    if straight is not None:
        ran = check_leg_exit(straight)
        checks.append(
            Check(
                f"straight-through run (leg {straight.events.leg}, no restart) finished",
                ran.ok,
                ran.detail,
                ran.evidence,
                kind=Kind.STRAIGHT_FINISHED,
                leg=straight.events.leg,
            )
        )
    return checks


def _sigterm_checks(out: LegOutcome, k: Kill, torchrun: bool) -> list[Check]:
    """A graceful stop in place of a kill: the leg stopped on the SIGTERM, exited as it should, and
    its final checkpoint is the store's newest verified."""
    step = k.sigterm_at
    checks: list[Check] = []
    ended = check_ending(out, Ending(sigterm_at=step))
    if ended is not None:
        checks.append(ended)
    checks.append(check_leg_exit(out, sigterm=torchrun))
    stop = out.events.last("stop")
    stopped = int(stop[1]["step"]) if stop and isinstance(stop[1].get("step"), int) else None
    checks.append(
        Check(
            f"leg {k.leg}: its final checkpoint on SIGTERM is the store's newest verified",
            stopped is not None and k.expected == stopped,
            f"stopped at step {stopped} on the SIGTERM sent at step {step}; the newest verified "
            f"checkpoint in the store after it: step {k.expected}"
            + (
                ""
                if stopped is None or k.expected == stopped
                else " (no final push on SIGTERM: a spot notice loses every step since the last one)"
            ),
            out.events.pointer(stop),
            kind=Kind.SIGTERM_FINAL,
            leg=k.leg,
        )
    )
    return checks


def check_nothing_left(out: LegOutcome) -> Check:
    """A lost instance takes every process of the leg with it (torchrun's workers too): a
    survivor would go on training and writing to the store beside the resumed leg."""
    r = out.result
    name = f"leg {out.events.leg}: no process outlived the kill"
    if r.survivors is None:
        return Check(
            name,
            True,
            "this backend's kill ends the whole instance; nothing is counted",
            kind=Kind.NOTHING_LEFT,
            leg=out.events.leg,
        )
    found = "" if r.killed_processes is None else f"{r.killed_processes} processes of the leg killed; "
    return Check(
        name,
        r.survivors == 0,
        f"{found}{r.survivors} left once the kill returned",
        kind=Kind.NOTHING_LEFT,
        leg=out.events.leg,
    )


def check_resumed_newest(ev: LegEvents, kill: Kill) -> Check:
    """The step the leg says it resumed at, and the state it trained from, against the launcher's
    own read of the store after the kill: a loop that replaces the restored state before it
    trains (a host-local copy, a newer checkpoint that never verified) is named here."""
    resume = ev.first("resume")
    got = resume[1]["from_step"] if resume else None
    name = f"leg {ev.leg} resumed from the newest verified checkpoint"
    detail = f"resumed at step {got}; the newest verified checkpoint when leg {kill.leg} died was step {kill.expected}"
    facts = {"resumed_at": got, "expected": kill.expected}
    if got != kill.expected or kill.expected is None:
        return Check(
            name, got == kill.expected, detail, ev.pointer(resume), kind=Kind.RESUMED_NEWEST, leg=ev.leg, facts=facts
        )
    ok, said, pointer = trained_from(ev, kill)
    return Check(
        name,
        ok,
        f"{detail}; {said}",
        ev.pointer(pointer or resume),
        kind=Kind.RESUMED_NEWEST,
        leg=ev.leg,
        facts={**facts, "state": said},
    )


def trained_from(ev: LegEvents, kill: Kill) -> tuple[bool, str, Any]:
    """(ok, what was compared, the event it rests on): the digests the leg printed of the state
    its first training forward used (`trains_from`; else of each object as loaded, `resume`)
    against the launcher's read of the checkpoint at `kill.expected`."""
    read = kill.reads.get(kill.expected) if kill.expected is not None else None
    if read is None or not read.get("ok"):
        why = read.get("error") if read else "not in the store when the launcher read it"
        return False, f"the launcher's read of step {kill.expected}'s state failed: {why}", None
    first, resume = ev.first("trains_from"), ev.first("resume")
    item, key, what = (
        (first, "trains_from", "the state its first training forward used")
        if first is not None
        else (resume, "digests", "each object as loaded")
    )
    printed = (item[1].get("digests") if item else None) or {}
    mine = read.get(key) or {}
    shared = sorted(set(printed) & set(mine))
    if not shared:
        return (
            True,
            ("the leg printed no state digests: the state it trained from was not compared with the store's"),
            None,
        )
    wrong = [k for k in shared if printed[k] != mine[k]]
    if not wrong:
        return True, f"{what} ({', '.join(shared)}) = the launcher's read of that checkpoint in the store", item
    other = next(
        (
            s
            for s, r in sorted(kill.reads.items())
            if s != kill.expected and r.get("ok") and all((r.get(key) or {}).get(k) == printed[k] for k in wrong)
        ),
        None,
    )
    where = (
        "a copy from elsewhere (a host-local cache? it matches no checkpoint the store held)"
        if other is None
        else f"the store's step-{other} checkpoint"
        + ("" if kill.reads[other].get("verified") else ", which never verified")
    )
    return (
        False,
        (
            f"but {what} is not that checkpoint's: {', '.join(wrong)} "
            f"{printed[wrong[0]][:12]} vs {mine[wrong[0]][:12]} in the store; it is {where}"
        ),
        item,
    )


def brief(line: str) -> str:
    event = parse_line(line)
    if event is None:
        return line[:80]
    return json.dumps({k: event[k] for k in ("event", "step", "name") if k in event})

"""Resume checks on what the session measured itself (runtime.session.step_evidence), not on what the
loop handed it: the batch the model was fed, the optimizer that stepped, the digest of every
tracked object's state, and every field a step event prints.

- `check_fed_batch`: a step whose `batch=` is not among the tensors the tracked model was fed
  (`step_batch_fed: false`) fails: the data checks hash what the model ate, and a loop that
  hands `step()` another batch (a prefetch) is named, not trusted.
- `check_optimizer_in_use`: the tracked optimizer must be the one stepping. Its step count
  (`opt_steps`, a post-hook) must advance in a resumed leg; an optimizer re-created after the
  resume leaves it at 0. Fewer steps than the session's (a GradScaler skipping an overflow)
  pass, with both numbers said. No optimizer tracked: MISSING.
- `check_restored`: each object's digest as loaded (the `resume` event) equals the digest
  saved at that step (the pushing leg's `state_digest` event).
- `check_state_straight` (CPU, exact): every digest at every checkpoint step of the surviving
  timeline equals the straight-through run's at that step, for the state that is not a float
  result of the model's arithmetic: schedulers, loaders, counters, `extra`, RNG streams. The
  model's weights and the optimizer's moments are left to the loss comparison, at float32
  resolution: a CPU BLAS may sum in another order from one process to the next (a 1e-6 loss
  difference seen once in the 20-kill drill), and a digest has no resolution. An object
  whose digest differs between leg 0 and the straight run before any resume is not
  reproducible from one process to the next (an unseeded RNG stream, a wall-clock field): it
  is left out, and named.
- `check_fields_straight` (CPU): every other field a resumed step prints (epoch, counters,
  metrics) equals the straight-through run's at that step; floats to float32 resolution.

Which proof each digest check belongs to goes by the kind of the object (`PROOF_KINDS`):
the loader's position is data (2), optimizer and scheduler are proof 3, the rest proof 4.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.data import (
    check_batches,
    check_batches_straight,
    check_every_rank,
    check_fed_batch,
    check_no_repeat,
    check_sample_index,
)
from launcher.checks.evidence import Check, Kind, LegEvents, surviving_timeline
from launcher.checks.ranks import check_accumulation_every_rank, check_rank_state, check_samples
from launcher.checks.resume import (
    VARYING_FIELDS,
    check_loss,
    check_lr,
    check_saved_not_loaded,
    compare_straight,
    missing,
    resume_step,
    resumed_legs,
    same_loss,
    steps_of,
)

PROOF_KINDS: dict[int, frozenset[str]] = {
    2: frozenset({"data"}),
    3: frozenset({"optimizer", "scheduler"}),
    4: frozenset({"model", "other", "extra", "rng"}),
}
FLOAT_STATE = frozenset({"model", "optimizer"})
"""Compared with the straight run through the loss (to float32 resolution), not bit for bit."""


def kind_of(name: str, tracked: dict[str, str]) -> str:
    if name == "extra":
        return "extra"
    if name.startswith("rng."):
        return "rng"
    return tracked.get(name, "other")


def tracked_kinds(legs: list[LegEvents]) -> dict[str, str] | None:
    """name -> kind from the first `start` event that says (None: an older trainer said nothing),
    with the objects tracked only after a resume (`tracked_late`: an optimizer re-created then)."""
    for ev in legs:
        start = ev.first("start")
        if start is not None and isinstance(start[1].get("tracked"), dict):
            late = {str(e["name"]): str(e["kind"]) for leg in legs for _, e in leg.all("tracked_late")}
            return {**late, **start[1]["tracked"]}
    return None


def _digests_at(ev: LegEvents, upto: int | None = None) -> dict[int, tuple[int, dict[str, Any]]]:
    return {int(e["step"]): (n, e) for n, e in ev.all("state_digest") if upto is None or int(e["step"]) <= upto}


# --- the optimizer in use ---------------------------------------------------------------

# adapter (the `start` event's) -> (how its user makes the optimizer tracked, what an untracked one is)
TRACK_HOW: dict[str | None, tuple[str, str]] = {
    None: ("re-created after the resume? `sess.track(optimizer=...)` the one that steps", "the session does not track"),
    "accelerate": (
        "pass it to `accelerator.prepare`: `save_state` saves only what was prepared",
        "that `accelerator.prepare` was not given",
    ),
    "lightning": ("return it from `configure_optimizers`", "Lightning does not hold"),
}


def _no_optimizer_stepped(ev: LegEvents, trained: int, begun: int, tracked: bool) -> str:
    return (
        f"{'neither the tracked optimizer nor any other' if tracked else 'no optimizer is tracked, and none'} stepped "
        f"in leg {ev.leg} ({trained} steps since the resume at step {begun}): the weights are updated without "
        "an optimizer (by hand, on p.data?), so proof 3 cannot be answered from an optimizer's state"
    )


def check_optimizer_in_use(legs: list[LegEvents], i: int) -> Check | None:
    """Resumed leg i: the tracked optimizer stepped. None: an older trainer printed nothing.
    `opt_steps_all` (every optimizer's steps in the process, tracked or not) tells a loop with
    no optimizer at all (MISSING: nothing to answer from) from one stepping another."""
    ev = legs[i]
    name = f"leg {ev.leg}: the tracked optimizer is the one stepping"
    tracked = tracked_kinds([ev])
    if tracked is None:
        return None
    start = next((ev.first("start") for ev in legs if ev.first("start") is not None), None)
    adapter = start[1].get("adapter") if start else None
    fix, tracker = TRACK_HOW.get(adapter, TRACK_HOW[None])
    steps = [e for _, e in ev.all("step")]
    begun = resume_step(ev) or 0
    trained = int(steps[-1]["step"]) - begun if steps else 0
    anywhere = steps[-1].get("opt_steps_all") if steps else None
    if "optimizer" not in tracked.values():
        if anywhere == 0 and trained > 0:
            return missing(name, _no_optimizer_stepped(ev, trained, begun, False), Kind.OPTIMIZER_IN_USE, ev.leg)
        seen = f", and an optimizer stepped {anywhere} times in leg {ev.leg}" if anywhere else ""
        return missing(
            name,
            f"no optimizer is tracked (tracked: {sorted(tracked) or 'nothing'}){seen}: whether the "
            f"optimizer state was restored cannot be checked; {fix}",
            Kind.OPTIMIZER_IN_USE,
            ev.leg,
        )
    if not steps or "opt_steps" not in steps[-1]:
        return missing(name, f"leg {ev.leg}'s step events carry no opt_steps", Kind.OPTIMIZER_IN_USE, ev.leg)
    stepped = int(steps[-1]["opt_steps"])
    if trained > 0 and stepped == 0 and anywhere == 0:
        return missing(name, _no_optimizer_stepped(ev, trained, begun, True), Kind.OPTIMIZER_IN_USE, ev.leg)
    if trained > 0 and stepped == 0:
        return Check(
            name,
            False,
            f"the loop steps an optimizer {tracker}: {trained} steps since the resume at step "
            f"{begun}, 0 steps of the tracked optimizer ({fix})",
            ev.pointer(ev.last("step")),
            kind=Kind.OPTIMIZER_IN_USE,
            leg=ev.leg,
        )
    note = "" if stepped == trained else " (some steps skipped: a GradScaler's overflow?)"
    return Check(
        name,
        True,
        f"{stepped} steps of the tracked optimizer in {trained} steps since the resume at step {begun}{note}",
        ev.pointer(ev.last("step")),
        kind=Kind.OPTIMIZER_IN_USE,
        leg=ev.leg,
    )


# --- state digests ----------------------------------------------------------------------


def check_restored(legs: list[LegEvents], i: int, kinds: frozenset[str]) -> Check | None:
    """Resumed leg i: each object (of `kinds`) as loaded has the digest saved at that step, and
    none the checkpoint holds was left unloaded (check_saved_not_loaded)."""
    if (unloaded := check_saved_not_loaded(legs, i, kinds)) is not None:
        return unloaded
    ev = legs[i]
    resume = ev.first("resume")
    tracked = tracked_kinds(legs) or {}
    loaded = {
        k: v for k, v in ((resume[1].get("digests") or {}) if resume else {}).items() if kind_of(k, tracked) in kinds
    }
    if resume is None or not loaded:
        return None
    step = int(resume[1]["from_step"])
    saved = next((d for d in (_digests_at(e).get(step) for e in reversed(legs[:i])) if d is not None), None)
    name = f"leg {ev.leg}: {', '.join(sorted(loaded))} loaded as saved (state digests)"
    if saved is None:
        return missing(name, f"no earlier leg printed the state digests of step {step}", Kind.STATE_RESTORED, ev.leg)
    wrong = [k for k in sorted(loaded) if k in saved[1]["digests"] and saved[1]["digests"][k] != loaded[k]]
    if wrong:
        return Check(
            name,
            False,
            f"{wrong[0]} as loaded at step {step} differs from what was saved there "
            f"({loaded[wrong[0]][:12]} vs {saved[1]['digests'][wrong[0]][:12]}): the restore changed it",
            ev.pointer(resume),
            kind=Kind.STATE_RESTORED,
            leg=ev.leg,
            facts={"kinds": sorted(kinds)},
        )
    return Check(
        name,
        True,
        f"{len(loaded)} objects at step {step}: each as loaded = as saved",
        ev.pointer(resume),
        kind=Kind.STATE_RESTORED,
        leg=ev.leg,
        facts={"kinds": sorted(kinds)},
    )


def check_state_straight(legs: list[LegEvents], straight: LegEvents, kinds: frozenset[str]) -> Check | None:
    """Every checkpoint's digests (objects of `kinds`) on the surviving timeline = the straight run's."""
    tracked = tracked_kinds(legs) or {}
    ref = _digests_at(straight)
    if not ref:
        return None
    timeline = surviving_timeline(legs)
    got: dict[int, tuple[LegEvents, tuple[int, dict[str, Any]]]] = {}
    for ev, nxt in zip(timeline, timeline[1:] + [None]):
        for s, item in _digests_at(ev, resume_step(nxt) if nxt is not None else None).items():
            got[s] = (ev, item)
    first_resume = resume_step(legs[1]) if len(legs) > 1 else None
    unstable = {
        k
        for s, (ev, (_, e)) in got.items()
        if ev.leg == legs[0].leg and (first_resume is None or s <= first_resume) and s in ref
        for k, v in e["digests"].items()
        if ref[s][1]["digests"].get(k) not in (None, v)
    }
    names = sorted(
        {
            k
            for _, (_, (_, e)) in got.items()
            for k in e["digests"]
            if kind_of(k, tracked) in kinds - FLOAT_STATE and k not in unstable
        }
    )
    label = ", ".join(sorted({kind_of(k, tracked) for k in names})) or "/".join(sorted(kinds))
    name = f"state digests = straight-through run ({label})"
    if not names:
        return None
    left = f"; left out, not reproducible from one process to the next: {sorted(unstable)}" if unstable else ""
    for s in sorted(set(got) & set(ref)):
        ev, (n, e) = got[s]
        for k in names:
            a, b = e["digests"].get(k), ref[s][1]["digests"].get(k)
            if a is not None and b is not None and a != b:
                return Check(
                    name,
                    False,
                    f"first difference at step {s} (leg {ev.leg}): {k}'s state {a[:12]} vs "
                    f"{b[:12]} in the straight-through run{left}",
                    ev.pointer((n, e)) + straight.pointer(ref[s]),
                    kind=Kind.STATE_STRAIGHT,
                    facts={"kinds": sorted(kinds)},
                )
    both = sorted(set(got) & set(ref))
    if not both:
        return missing(name, "no checkpoint step in common with the straight-through run", Kind.STATE_STRAIGHT)
    return Check(
        name,
        True,
        f"{len(names)} objects ({', '.join(names)}) identical at {len(both)} checkpoint steps "
        f"{both[0]}..{both[-1]}{left}",
        straight.pointer(ref[both[-1]]),
        kind=Kind.STATE_STRAIGHT,
        facts={"kinds": sorted(kinds)},
    )


# --- every printed field -----------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and same_loss(float(a), float(b))
    return a == b


CARRIED = "fed_state"
"""The step field of the state carried into the model's forward, by argument name (an RNN's
`hidden`): compared by `_carried_state_differs`, not as a printed field."""


def _fed(item: tuple[int, dict[str, Any]]) -> dict[str, str]:
    return item[1].get(CARRIED) or {}


def _carried_state_differs(legs: list[LegEvents], straight: LegEvents) -> tuple[Check | None, list[str]]:
    """(a FAIL or None, the names compared): the state carried into the model's forward at the
    first step of each resume against the straight run's same step, for each argument whose
    digests agree in leg 0 with the straight run before any resume (a float result of the
    model's arithmetic; one that does not agree there is not reproducible and is left out).
    Only the first resumed step: where a state not restored (a zeroed `hidden`) shows, before
    float noise from the model's arithmetic can."""
    ref = steps_of(straight)
    names = sorted({k for ev in legs + [straight] for _, e in ev.all("step") for k in e.get(CARRIED) or {}})
    first_resume = resume_step(legs[1]) if len(legs) > 1 else None
    before = [(s, item) for s, item in steps_of(legs[0]).items() if s in ref and s <= (first_resume or s)]
    stable = [k for k in names if all(_fed(item).get(k) == _fed(ref[s]).get(k) for s, item in before)]
    for ev in surviving_timeline(legs)[1:]:
        start, mine = resume_step(ev), steps_of(ev)
        s = (start or 0) + 1
        if start is None or s not in mine or s not in ref:
            continue
        for k in stable:
            a, b = _fed(mine[s]).get(k), _fed(ref[s]).get(k)
            if a != b:
                same = mine[s][1].get("batch_hash") == ref[s][1].get("batch_hash")
                return Check(
                    "printed fields = straight-through run",
                    False,
                    f"the model's `{k}` input at step {s} (leg {ev.leg}, resumed at step {start}) differs from the "
                    f"straight-through run's ({(a or 'not given')[:12]} vs {(b or 'not given')[:12]}); "
                    + ("the batch is the same" if same else "the batch differs too")
                    + f": the state carried into the forward as `{k}` was not restored (keep it in `sess.extra`)",
                    ev.pointer(mine[s]) + straight.pointer(ref[s]),
                    kind=Kind.FIELDS_STRAIGHT,
                ), stable
    return None, stable


def check_fields_straight(
    legs: list[LegEvents], straight: LegEvents, vary: frozenset[str] = frozenset()
) -> Check | None:
    """Every field both a resumed step and the straight run's same step print, beyond the
    timings and the ones compare_straight compares, agrees; and the state carried into the
    model's forward (`fed_state`) at each resume. None: no such field."""
    ref = steps_of(straight)
    fields: set[str] = set()
    seq = [(ev, s, item) for ev in surviving_timeline(legs)[1:] for s, item in sorted(steps_of(ev).items())]
    for ev, s, (n, e) in seq:
        if s in ref:
            fields |= (set(e) & set(ref[s][1])) - VARYING_FIELDS - vary
    carried, stable = _carried_state_differs(legs, straight)
    if carried is not None:
        return carried
    if not fields and not stable:
        return None
    name = "printed fields = straight-through run"
    for ev, s, (n, e) in seq:
        if s not in ref:
            continue
        for key in sorted(fields):
            if key in e and key in ref[s][1] and not _same(e[key], ref[s][1][key]):
                return Check(
                    name,
                    False,
                    f"first difference at step {s} (leg {ev.leg}): {key} {e[key]!r} vs "
                    f"{ref[s][1][key]!r} in the straight-through run",
                    ev.pointer((n, e)) + straight.pointer(ref[s]),
                    kind=Kind.FIELDS_STRAIGHT,
                )
    held = (
        f"; the model's carried-state inputs ({', '.join(stable)}) as the straight run's at each resume"
        if stable
        else ""
    )
    return Check(
        name,
        True,
        f"{', '.join(sorted(fields)) or 'no other field'} equal at every resumed step ({len(seq)} steps){held}",
        kind=Kind.FIELDS_STRAIGHT,
    )


# --- every resume check of one run ------------------------------------------------------


def timeline_checks(legs: list[LegEvents], straight: LegEvents | None, exact: bool) -> list[Check]:
    """The data, LR and loss checks of every resume of one run, plus the whole timeline's. The
    accumulation check first: a resume inside a window is the cause the others' findings follow from."""
    checks: list[Check | None] = [check_accumulation_every_rank(legs, straight, exact)]
    for i in resumed_legs(legs):
        checks += [check_lr(legs, i, straight), check_batches(legs, i, straight), check_loss(legs, i, exact, straight)]
        in_use = check_optimizer_in_use(legs, i)
        checks.append(None if in_use is None or in_use.missing else in_use)  # MISSING is the report's to say (proof 3)
        checks += [check_restored(legs, i, kinds) for kinds in PROOF_KINDS.values()]
    checks += [
        check_no_repeat(legs, straight),
        check_every_rank(legs, straight),
        check_sample_index(legs),
        check_fed_batch(legs),
    ]
    if straight is not None:
        checks += [compare_straight(legs, straight, exact), check_batches_straight(legs, straight)]
        checks += [check_samples(legs, straight), check_rank_state(legs, straight, exact)]
        if exact:
            checks.append(check_fields_straight(legs, straight))
            checks += [check_state_straight(legs, straight, kinds) for kinds in PROOF_KINDS.values()]
    return [c for c in checks if c is not None]

"""Every resume check, each in one place with one rule: the rungs, the drill and the
report call these same functions on the same event logs.

What they rest on, strongest first:
- the straight-through run (CPU rungs): the same trainer, same seed and steps, in one
  uninterrupted leg on its own empty store. On a CPU a correct resume reproduces it
  exactly: every step's loss, LR and batch hash. The first step that differs is named;
- the batch hash the leg API computes from the tensor each step read (`batch_hash`),
  not the index a trainer prints: a re-run step reads the batch the killed leg read
  there; the first batch after a resume is none already consumed on the surviving
  timeline; no batch repeats within an epoch (a repeat the straight-through run has
  too is the data's own duplicate, not a re-read);
- the schedule's LR per step (`lr_expected`, printed by a trainer that declares its
  schedule), else the killed leg's LR at re-run steps, else the LR the checkpoint
  saved (for schedules that are not a function of the step, e.g. ReduceLROnPlateau);
- the sample index a trainer prints: a second witness, checked when present.
A trainer that prints no batch hash gets MISSING for the data checks, never PASS.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.causes import rng_cause
from launcher.checks.evidence import Check, Kind, LegEvents, Pointer, surviving_timeline
from runtime.metrics import loss_continuity

FLOAT32_EPS = 2.0**-23
PRINTED = 1e-6  # the step event rounds the loss to 6 decimals


def same_loss(a: float, b: float) -> bool:
    """Equal to float32 resolution: a CPU's BLAS may sum in another order from one process
    to the next (MKL's results depend on memory alignment), which moves a loss by an ulp or
    two and, once rounded to 6 decimals, by 1e-6. Resume bugs move it by 1e-4 and more."""
    return abs(a - b) <= 2 * PRINTED + 8 * FLOAT32_EPS * max(abs(a), abs(b))


VARYING_FIELDS = frozenset(
    "event t rank step loss lr batch_hash loss_local tok_s step_s phases gpu_phases mem_max_bytes flop_s mfu eta_s "
    "gpu_util by_dtype opt_steps opt_steps_all fed_state rng_in rows nondeterministic".split()
)
"""Step fields not compared with the straight-through run as printed fields: the ones
`compare_straight` compares itself (step, loss, lr, batch_hash), timings, counts of one leg,
what this process saw first (nondeterministic), and the state carried into the forward
(fed_state: a float result of the model, compared at each resume by launcher.checks.state; rng_in:
read only to name a cause, by `rng_cause`)."""


def steps_of(ev: LegEvents) -> dict[int, tuple[int, dict[str, Any]]]:
    """Rank 0's step events by step number (a later line for the same step wins)."""
    return {int(e["step"]): (n, e) for n, e in ev.all("step")}


def resume_step(ev: LegEvents) -> int | None:
    resume = ev.first("resume")
    return int(resume[1]["from_step"]) if resume else None


def _ptr(ev: LegEvents, item: tuple[int, dict[str, Any]] | None) -> tuple[Pointer, ...]:
    return ev.pointer(item)


def missing(name: str, why: str, kind: Kind, leg: int | None = None) -> Check:
    """Not answerable from what the legs printed: never a pass."""
    return Check(name, False, why, (), missing=True, kind=kind, leg=leg)


# --- the straight-through oracle -----------------------------------------------------


def compare_straight(
    timeline: list[LegEvents],
    straight: LegEvents,
    exact: bool,
    band: float | None = None,
    name: str = "resumed run = straight-through run",
) -> Check:
    """Every step of the surviving timeline against the uninterrupted run's same step."""
    ref = steps_of(straight)
    got = {s: (ev, item) for ev in surviving_timeline(timeline) for s, item in steps_of(ev).items()}
    if not ref:
        return Check(
            name, False, f"the straight-through leg printed no step events ({straight.log})", kind=Kind.TIMELINE
        )
    if set(got) != set(ref):
        lost = sorted(set(ref) - set(got))
        extra = sorted(set(got) - set(ref))
        return Check(
            name,
            False,
            f"the resumed timeline has steps {_span(got)}, the straight-through run "
            f"{_span(ref)}" + (f"; missing {lost[:5]}" if lost else "") + (f"; extra {extra[:5]}" if extra else ""),
            kind=Kind.TIMELINE,
        )
    if not exact and band is None:  # the run's own noise: 1.5 x its largest step-to-step jump
        losses = [ref[s][1]["loss"] for s in sorted(ref)]
        band = 1.5 * max((abs(b - a) for a, b in zip(losses, losses[1:])), default=0.0)
    tol = 0.0 if exact else (band or 0.0)
    differs = _first_difference(name, ref, got, straight, exact, tol)
    if differs is not None:
        return differs
    hashed = all("batch_hash" in ref[s][1] for s in ref)
    what = "loss, LR and batch hash" if hashed else "loss and LR (no batch hashes printed)"
    how = "identical" if exact else f"within +-{tol:.5f} (not deterministic: band)"
    return Check(
        name,
        True,
        f"steps {_span(ref)}: {what} {how} at every step, legs {[ev.leg for ev in timeline]}"
        + ("; loss to float32 resolution" if exact else ""),
        straight.pointer(ref[max(ref)]),
        kind=Kind.TIMELINE,
    )


def _first_difference(
    name: str, ref: dict[int, Any], got: dict[int, Any], straight: LegEvents, exact: bool, tol: float
) -> Check | None:
    """The first step whose batch hash, LR or loss differs from the straight-through run's."""
    for s in sorted(ref):
        ev, (n, e) = got[s]
        r = ref[s][1]
        for key in ("batch_hash", "lr", "loss"):
            a, b = e.get(key), r.get(key)
            if key == "batch_hash" and (a is None or b is None):
                continue
            same = a == b if key != "loss" else same_loss(a, b) if exact else abs(a - b) <= tol
            if not same:
                differ = sum(
                    1
                    for t in ref
                    if "batch_hash" in ref[t][1]
                    and got[t][1][1].get("batch_hash") not in (None, ref[t][1]["batch_hash"])
                )
                count = f"; {differ} of {len(ref)} batches differ" if differ else ""
                return Check(
                    name,
                    False,
                    f"first difference at step {s} (leg {ev.leg}): {key} {a!r} vs {b!r} in the "
                    f"straight-through run" + ("" if exact else f" (band +-{tol:.5f})") + rng_cause(ev, ref) + count,
                    _ptr(ev, (n, e)) + straight.pointer(ref[s]),
                    kind=Kind.TIMELINE,
                    facts={"step": s, "field": key, "batches_differ": differ, "steps": len(ref)},
                )
    return None


def check_deterministic(first: LegEvents, repeat: LegEvents) -> Check:
    """Two straight-through runs of the same trainer: identical on a deterministic CPU trainer,
    in every field they both print but timings (the first step and field that differ named)."""
    a, b = steps_of(first), steps_of(repeat)
    name = "the trainer is deterministic on CPU"
    for s in sorted(set(a) & set(b)):
        x, y = a[s][1], b[s][1]
        keys = ["loss", "lr", "batch_hash"] + sorted((set(x) & set(y)) - VARYING_FIELDS)
        for key in keys:
            u, v = x.get(key), y.get(key)
            same = same_loss(u, v) if key == "loss" and u is not None and v is not None else u == v
            if not same:
                return Check(
                    name,
                    False,
                    f"two straight-through runs differ at step {s}: {key} {u!r} vs {v!r}",
                    repeat.pointer(b[s]),
                    kind=Kind.REPEATABLE,
                )
    return Check(name, True, f"two straight-through runs agree on every step ({len(a)} steps)", kind=Kind.REPEATABLE)


# --- data: what each resumed leg read ------------------------------------------------


# --- LR and loss ----------------------------------------------------------------------


def check_lr(legs: list[LegEvents], i: int, straight: LegEvents | None = None) -> Check:
    """Every step of resumed leg i against the schedule's own LR at that step."""
    after = legs[i]
    name = f"leg {after.leg}: LR follows the schedule"
    post = steps_of(after)
    resume = after.first("resume")
    if resume is None or not post:
        return Check(name, False, f"leg {after.leg} printed no resume or no step event", kind=Kind.LR, leg=after.leg)
    if straight is not None:
        ref, source = {s: it[1]["lr"] for s, it in steps_of(straight).items()}, "the straight-through run's"
    elif all("lr_expected" in e for _, e in post.values()):
        ref, source = {s: e["lr_expected"] for s, (_, e) in post.items()}, "the declared schedule's"
    else:
        ref = {s: it[1]["lr"] for ev in legs[:i] for s, it in steps_of(ev).items()}
        source = "the earlier legs'"
    compared = [s for s in sorted(post) if s in ref]
    for s in compared:
        if post[s][1]["lr"] != ref[s]:
            return Check(
                name,
                False,
                f"step {s} ran with LR {post[s][1]['lr']!r}; {source} LR there is {ref[s]!r}",
                after.pointer(post[s]),
                kind=Kind.LR,
                leg=after.leg,
            )
    if compared:
        return Check(
            name,
            True,
            f"steps {compared[0]}-{compared[-1]} ({len(compared)}) ran with {source} LR, "
            f"from {post[compared[0]][1]['lr']!r}",
            after.pointer(post[compared[0]]),
            kind=Kind.LR,
            leg=after.leg,
        )
    # A schedule that is not a function of the step (ReduceLROnPlateau): the LR the checkpoint saved.
    saved, first = resume[1].get("lr"), post[min(post)][1]["lr"]
    if saved is None:
        return missing(
            name,
            "no reference LR: no straight-through run, no lr_expected, no re-run step, and the "
            "resume event carries no lr",
            Kind.LR,
            after.leg,
        )
    return Check(
        name,
        saved == first,
        f"no step-wise reference for this schedule: the first resumed step ran with "
        f"{first!r}, the checkpoint saved {saved!r}",
        after.pointer(resume) + after.pointer(post[min(post)]),
        kind=Kind.LR,
        leg=after.leg,
    )


def check_loss(legs: list[LegEvents], i: int, exact: bool, straight: LegEvents | None = None) -> Check:
    """Re-run steps reproduce the earlier loss (exactly on a deterministic CPU); otherwise
    the jump across the restart is within the run's own noise band, or (exact, with a
    straight-through run) is the straight run's own jump at those steps, to the bit: a rank's
    local loss can jump further than the band by itself (seen on 2 ranks, -0.24 vs +-0.21)."""
    after = legs[i]
    name = f"leg {after.leg}: loss continuity"
    post = {s: it[1]["loss"] for s, it in steps_of(after).items()}
    start = resume_step(after) or 0
    pre_all = {s: it[1]["loss"] for ev in legs[:i] for s, it in steps_of(ev).items()}
    overlap = sorted(set(pre_all) & set(post))
    before = [pre_all[s] for s in sorted(pre_all) if s <= start]
    cont = loss_continuity(before, [post[s] for s in sorted(post)]) if post else None
    if overlap:
        worst = max(abs(pre_all[s] - post[s]) for s in overlap)
        band = 0.0 if exact else (cont.band if cont else 1e-6)
        ok = all(same_loss(pre_all[s], post[s]) for s in overlap) if exact else worst <= band
        how = "exactly (CPU, deterministic: to float32 resolution)" if exact else f"within the band +-{band:.5f}"
        return Check(
            name,
            ok,
            f"steps {overlap[0]}-{overlap[-1]} re-run: max |loss diff| {worst:.6g}, must match {how}",
            after.pointer(after.first("step")),
            kind=Kind.LOSS_CONTINUITY,
            leg=after.leg,
        )
    ref = {s: it[1]["loss"] for s, it in steps_of(straight).items()} if straight is not None and exact else {}
    pre_step = max((s for s in pre_all if s <= start), default=None)
    if cont is None:
        return _too_few_steps(name, after, ref, pre_step, pre_all, post)
    detail = f"loss {before[-1]:.5f} -> {post[min(post)]:.5f} across the restart ({cont.delta:+.5f}); "
    if (
        not cont.ok
        and pre_step in ref
        and min(post) in ref
        and same_loss(ref[pre_step], before[-1])
        and same_loss(ref[min(post)], post[min(post)])
    ):
        return Check(
            name,
            True,
            detail + f"beyond the band +-{cont.band:.5f}, and the straight-through run's own "
            f"jump at steps {pre_step}-{min(post)}, exactly",
            after.pointer(after.first("step")),
            kind=Kind.LOSS_CONTINUITY,
            leg=after.leg,
        )
    return Check(
        name,
        cont.ok,
        detail + f"band +-{cont.band:.5f} (1.5 x the largest step-to-step jump of the last {cont.window} steps)",
        after.pointer(after.first("step")),
        kind=Kind.LOSS_CONTINUITY,
        leg=after.leg,
    )


def _too_few_steps(name: str, after: LegEvents, ref: dict, pre_step: int | None, pre_all: dict, post: dict) -> Check:
    """Too few steps on one side of the restart for a band (a resume 2 steps into the run, a leg
    of 1 step): with an exact straight-through run the losses either side of it are compared to
    the bit instead (a drill's `mid-epoch` on 4-step epochs failed here, exact at every step);
    without one there is nothing to measure, and the check says so."""
    first = min(post) if post else None
    if pre_step is not None and first is not None and pre_step in ref and first in ref:
        ok = same_loss(ref[pre_step], pre_all[pre_step]) and same_loss(ref[first], post[first])
        return Check(
            name,
            ok,
            f"too few steps for a band; the losses at steps {pre_step} and {first}, either side of the restart, "
            + ("equal" if ok else "differ from")
            + " the straight-through run's exactly",
            after.pointer(after.first("step")),
            kind=Kind.LOSS_CONTINUITY,
            leg=after.leg,
        )
    return Check(
        name, False, "too few steps on one side of the restart to measure", kind=Kind.LOSS_CONTINUITY, leg=after.leg
    )


def resumed_legs(legs: list[LegEvents]) -> list[int]:
    """Indexes of the legs that resumed from a checkpoint and trained past it (a leg whose
    deadline came before its first step has nothing to compare; the next leg resumes
    from the same checkpoint and is checked instead)."""
    return [i for i, ev in enumerate(legs) if i > 0 and ev.first("resume") is not None and ev.all("step")]


def _span(steps: Any) -> str:
    s = sorted(steps)
    return f"{s[0]}..{s[-1]}" if s else "none"


def check_pushed(ev: LegEvents) -> tuple[Check, int | None]:
    """The newest checkpoint this leg pushed AND verified: the only one a resume may use."""
    name = f"leg {ev.leg} pushed a verified checkpoint"
    verified = [(n, e) for n, e in ev.all("verify") if e.get("ok")]
    if not verified:
        return Check(
            name,
            False,
            f"no `verify` event with ok=true in leg {ev.leg}{ev.unverified()}",
            kind=Kind.PUSHED,
            leg=ev.leg,
        ), None
    item = verified[-1]
    e = item[1]
    detail = f"{e['name']} verified: {e['windows']} windows, {e['bytes_read']} bytes read in {e['seconds']} s"
    return Check(name, True, detail, ev.pointer(item), kind=Kind.PUSHED, leg=ev.leg), int(e["step"])


def check_resumed(ev: LegEvents, pushed_step: int | None) -> Check:
    resume = ev.first("resume")
    name = f"leg {ev.leg} resumed from the store"
    if resume is None:
        return Check(
            name,
            False,
            f"leg {ev.leg} printed no `resume` event: it started from scratch",
            kind=Kind.RESUMED,
            leg=ev.leg,
        )
    e = resume[1]
    ok = pushed_step is not None and e["from_step"] == pushed_step
    ranks = {r["from_step"] for _, r in ev.all("resume", rank=None)}
    if len(ranks) > 1:
        ok = False
    return Check(
        name,
        ok,
        f"resumed from {e['checkpoint']} at step {e['from_step']}; leg {ev.leg - 1} pushed "
        f"step {pushed_step}" + (f"; ranks disagree: {sorted(ranks)}" if len(ranks) > 1 else ""),
        ev.pointer(resume),
        kind=Kind.RESUMED,
        leg=ev.leg,
    )


# --- state saved and never loaded -----------------------------------------------------


def check_saved_not_loaded(legs: list[LegEvents], i: int, kinds: frozenset[str]) -> Check | None:
    """Resumed leg i: an object (of `kinds`) the checkpoint holds, which the resume did not load
    because nothing was tracked under its name then, tracked later in the leg with a state of its
    own (the session's `tracked_late` event: saved digest != live). The shape: an optimizer
    re-created after `sess.resume()` and tracked only then, its moments fresh at every resume.
    None: nothing tracked late with a state other than the saved one."""
    ev = legs[i]
    late = [(n, e) for n, e in ev.all("tracked_late") if e.get("kind") in kinds and e.get("saved") != e.get("live")]
    if not late:
        return None
    n, e = late[0]
    names = sorted({str(x["name"]) for _, x in late})
    return Check(
        f"leg {ev.leg}: {', '.join(names)} loaded as saved (state digests)",
        False,
        f"{e['checkpoint']} holds the {e['kind']} {e['name']!r} (digest {str(e['saved'])[:12]}), which the "
        f"resume never loaded: `track({e['name']}=...)` came after `resume()` (at step {e['step']}), with a "
        f"state of its own ({str(e['live'])[:12]}): saved != live, so every resume starts it afresh; "
        f"track it before `sess.resume()`",
        ev.pointer((n, e)),
        kind=Kind.STATE_RESTORED,
        leg=ev.leg,
        facts={"kinds": sorted(kinds), "not_loaded": names},
    )

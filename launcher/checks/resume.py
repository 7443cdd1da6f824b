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
    {
        "event",
        "t",
        "rank",
        "step",
        "loss",
        "lr",
        "batch_hash",  # compared by compare_straight already
        "loss_local",
        "tok_s",
        "step_s",
        "phases",
        "gpu_phases",
        "mem_max_bytes",
        "flop_s",
        "mfu",
        "eta_s",
        "gpu_util",
        "by_dtype",
        "opt_steps",
        "nondeterministic",  # timings, and what this process saw first
    }
)
"""Step fields not compared with the straight-through run as printed fields: the ones
`compare_straight` compares itself, timings, and counts of one leg."""

NO_BATCH_HASH = (
    "the trainer's step events carry no batch_hash (the leg API's `Session.step(batch=...)` "
    "prints it): what each step read cannot be checked"
)


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
                    f"straight-through run" + ("" if exact else f" (band +-{tol:.5f})") + count,
                    _ptr(ev, (n, e)) + straight.pointer(ref[s]),
                    kind=Kind.TIMELINE,
                )
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


def check_batches(legs: list[LegEvents], i: int, straight: LegEvents | None = None) -> Check:
    """Leg i (resumed): re-run steps read the batch earlier legs read there; the first batch
    after the resume is none consumed before it on the surviving timeline."""
    after = legs[i]
    name = f"leg {after.leg}: exact data position (batch hashes)"
    start = resume_step(after)
    post = steps_of(after)
    if start is None or not post:
        return Check(
            name, False, f"leg {after.leg} printed no resume or no step event", kind=Kind.DATA_POSITION, leg=after.leg
        )
    if any("batch_hash" not in e for _, e in post.values()):
        return missing(name, NO_BATCH_HASH, Kind.DATA_POSITION, after.leg)
    earlier = [steps_of(ev) for ev in legs[:i]]
    for s in sorted(post):  # a re-run step must read what was read there before
        for ev, steps in zip(legs[:i], earlier):
            if s in steps and "batch_hash" in steps[s][1] and steps[s][1]["batch_hash"] != post[s][1]["batch_hash"]:
                return Check(
                    name,
                    False,
                    f"step {s} read batch {post[s][1]['batch_hash'][:12]}, leg {ev.leg} read "
                    f"{steps[s][1]['batch_hash'][:12]} at that step",
                    after.pointer(post[s]) + ev.pointer(steps[s]),
                    kind=Kind.DATA_POSITION,
                    leg=after.leg,
                )
    consumed: dict[str, tuple[LegEvents, int]] = {}
    for ev in surviving_timeline(legs[:i] + [after])[:-1]:
        for s, (_, e) in steps_of(ev).items():
            if s <= start and "batch_hash" in e:
                consumed.setdefault(e["batch_hash"], (ev, s))
    first = min(post)
    h = post[first][1]["batch_hash"]
    ref = steps_of(straight) if straight else {}
    if h in consumed and not (first in ref and ref[first][1].get("batch_hash") == h):
        ev, s = consumed[h]
        return Check(
            name,
            False,
            f"the first batch after the resume at step {start} ({h[:12]}, step {first}) was "
            f"already consumed at step {s} (leg {ev.leg}): the resume re-read data",
            after.pointer(post[first]),
            kind=Kind.DATA_POSITION,
            leg=after.leg,
        )
    want = ref[first][1].get("batch_hash") if first in ref else None
    at = next((s for s, (_, e) in sorted(ref.items()) if e.get("batch_hash") == h), None) if want != h else None
    if want is not None and at is not None:  # the straight run's batch of another step: the position moved
        return Check(
            name,
            False,
            f"the first batch after the resume at step {start} ({h[:12]}, step {first}) is "
            f"not the straight-through run's ({want[:12]}) but its batch of step {at}: {at - first:+d} "
            f"batches: the resume moved the data position",
            after.pointer(post[first]) + straight.pointer(ref[first]),
            kind=Kind.DATA_POSITION,
            leg=after.leg,
        )
    rerun = sorted(s for s in post if any(s in st for st in earlier))
    return Check(
        name,
        True,
        f"resumed at step {start}; step {first} read {h[:12]}, not among the {len(consumed)} "
        f"batches consumed before"
        + (f"; steps {rerun[0]}-{rerun[-1]} re-run reading the same batches" if rerun else ""),
        after.pointer(post[first]),
        kind=Kind.DATA_POSITION,
        leg=after.leg,
    )


def check_no_repeat(legs: list[LegEvents], straight: LegEvents | None = None) -> Check:
    """On the surviving timeline no batch is read twice within an epoch (the step's
    `epoch` when printed, else the whole timeline), unless the straight-through run
    reads the same repeat: then it is the data's own duplicate."""
    timeline = surviving_timeline(legs)
    seq = [(ev, s, item) for ev in timeline for s, item in sorted(steps_of(ev).items())]
    name = f"no batch read twice ({len(legs)} legs, {len(seq)} steps)"
    if not seq:
        return Check(name, False, "no step events", kind=Kind.NO_REPEAT)
    if any("batch_hash" not in item[1] for _, _, item in seq):
        return missing(name, NO_BATCH_HASH, Kind.NO_REPEAT)
    ref = {s: item[1].get("batch_hash") for s, item in steps_of(straight).items()} if straight else {}
    seen: dict[tuple[Any, str], tuple[LegEvents, int]] = {}
    for ev, s, (n, e) in seq:
        key = (e.get("epoch"), e["batch_hash"])
        if key in seen:
            prev_ev, prev_s = seen[key]
            if ref and ref.get(s) == e["batch_hash"] and ref.get(prev_s) == e["batch_hash"]:
                continue  # the uninterrupted run reads it twice too: the data holds it twice
            where = f" in epoch {e['epoch']}" if e.get("epoch") is not None else ""
            return Check(
                name,
                False,
                f"leg {ev.leg} step {s} read batch {e['batch_hash'][:12]}, already read at step "
                f"{prev_s} (leg {prev_ev.leg}){where}",
                ev.pointer((n, e)),
                kind=Kind.NO_REPEAT,
            )
        seen[key] = (ev, s)
    steps = [s for _, s, _ in seq]
    gaps = [b for a, b in zip(steps, steps[1:]) if b != a + 1]
    if gaps or steps[0] != 1:
        return Check(
            name,
            False,
            f"the surviving timeline's steps are not consecutive from 1 (at {gaps[:3] or steps[0]})",
            kind=Kind.NO_REPEAT,
        )
    return Check(
        name,
        True,
        f"steps 1..{steps[-1]}: {len(seen)} batch hashes, none read twice"
        + (" within an epoch" if any(k[0] is not None for k in seen) else "")
        + f", legs {[e.leg for e in legs]}",
        kind=Kind.NO_REPEAT,
    )


def as_rank(ev: LegEvents, rank: int) -> LegEvents:
    """Rank `rank`'s events of a leg, read as rank 0's: the rank-0 data checks then judge it."""
    return LegEvents(ev.leg, ev.log, [(n, {**e, "rank": 0}) for n, e in ev.items if e.get("rank", 0) == rank])


def check_every_rank(legs: list[LegEvents], straight: LegEvents | None = None) -> Check | None:
    """On several ranks (several nodes too), each rank's own data position: at every resume the
    rank re-read what it read before at a re-run step and nothing it had consumed (its batch
    hashes, as `check_batches` judges rank 0), and across every rank and step of the surviving
    timeline no batch was read twice (one rank whose cursor was not restored reads its shard
    again, or another rank's). None on one rank."""
    ranks = sorted({int(e.get("rank", 0)) for ev in legs for _, e in ev.all("step", rank=None)})
    if len(ranks) < 2:
        return None
    name = f"every rank's data position ({len(ranks)} ranks)"
    views = {r: [as_rank(ev, r) for ev in legs] for r in ranks}
    for r in ranks[1:]:  # rank 0's are the checks above
        mine = as_rank(straight, r) if straight is not None else None
        for c in [check_batches(views[r], i, mine) for i in resumed_legs(views[r])] + [check_no_repeat(views[r], mine)]:
            if not c.ok:
                return Check(
                    name,
                    False,
                    f"rank {r}: {c.detail}",
                    c.evidence,
                    missing=c.missing,
                    kind=Kind.RANK_DATA,
                    facts={"rank": r, "ranks": len(ranks)},
                )
    seen: dict[tuple[Any, str], tuple[int, int, int]] = {}
    for r in ranks:
        for ev in surviving_timeline(views[r]):
            for s, (n, e) in sorted(steps_of(ev).items()):
                key = (e.get("epoch"), e.get("batch_hash"))
                if key[1] is None:
                    continue
                if key in seen and seen[key][0] != r:
                    other, leg, step = seen[key]
                    return Check(
                        name,
                        False,
                        f"rank {r} read batch {key[1][:12]} at step {s} (leg {ev.leg}), which "
                        f"rank {other} read at step {step} (leg {leg}): two ranks read one shard",
                        ev.pointer((n, e)),
                        kind=Kind.RANK_DATA,
                        facts={"rank": r, "ranks": len(ranks)},
                    )
                seen.setdefault(key, (r, ev.leg, s))
    return Check(
        name,
        True,
        f"ranks {ranks[0]}..{ranks[-1]}: each resumed where it stood, none re-read a batch; "
        f"{len(seen)} batch hashes across the ranks, none read by two",
        kind=Kind.RANK_DATA,
        facts={"ranks": len(ranks)},
    )


def check_sample_index(legs: list[LegEvents]) -> Check | None:
    """The trainer's own index, a second witness: consecutive steps on the surviving
    timeline advance it by one stride. None when the trainer prints none."""
    seq = [(ev.leg, s, item[1]) for ev in surviving_timeline(legs) for s, item in sorted(steps_of(ev).items())]
    if len(seq) < 2 or any("sample_index" not in e for _, _, e in seq):
        return None
    name = "sample index continues (the trainer's own witness)"
    stride = seq[1][2]["sample_index"] - seq[0][2]["sample_index"]
    for a, b in zip(seq, seq[1:]):
        if b[2]["sample_index"] - a[2]["sample_index"] != stride or b[1] != a[1] + 1 or stride <= 0:
            return Check(
                name,
                False,
                f"leg {a[0]} step {a[1]} read sample {a[2]['sample_index']}, then leg {b[0]} "
                f"step {b[1]} read sample {b[2]['sample_index']} (stride {stride})",
                kind=Kind.SAMPLE_INDEX,
            )
    return Check(
        name,
        True,
        f"samples {seq[0][2]['sample_index']}..{seq[-1][2]['sample_index'] + stride - 1} read "
        f"once each, in order, stride {stride}",
        kind=Kind.SAMPLE_INDEX,
    )


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
    if cont is None:
        return Check(
            name, False, "too few steps on one side of the restart to measure", kind=Kind.LOSS_CONTINUITY, leg=after.leg
        )
    detail = f"loss {before[-1]:.5f} -> {post[min(post)]:.5f} across the restart ({cont.delta:+.5f}); "
    ref = {s: it[1]["loss"] for s, it in steps_of(straight).items()} if straight is not None and exact else {}
    pre_step = max((s for s in pre_all if s <= start), default=None)
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

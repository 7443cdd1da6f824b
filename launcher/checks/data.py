"""The data checks of a resume: what each resumed leg read, on every rank.

They rest on the batch hash the leg API computes from the tensor each step read, not on the
index a trainer prints (launcher.checks.resume says why, and what else a resume is checked on).
A trainer that prints no batch hash gets MISSING here, never PASS.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents, surviving_timeline
from launcher.checks.resume import missing, resume_step, resumed_legs, steps_of

NO_BATCH_HASH = (
    "the trainer's step events carry no batch_hash (the leg API's `Session.step(batch=...)` "
    "prints it): what each step read cannot be checked"
)


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
    reread = _rerun_differs(name, after, post, legs[:i], earlier)
    if reread is not None:
        return reread
    consumed = _consumed_before(legs[:i] + [after], start)
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


def ranks_of(legs: list[LegEvents]) -> list[int]:
    """The ranks that printed step events."""
    return sorted({int(e.get("rank", 0)) for ev in legs for _, e in ev.all("step", rank=None)})


def as_rank(ev: LegEvents, rank: int) -> LegEvents:
    """Rank `rank`'s events of a leg, read as rank 0's: the rank-0 data checks then judge it."""
    return LegEvents(ev.leg, ev.log, [(n, {**e, "rank": 0}) for n, e in ev.items if e.get("rank", 0) == rank])


def check_every_rank(legs: list[LegEvents], straight: LegEvents | None = None) -> Check | None:
    """On several ranks (several nodes too), each rank's own data position: at every resume the
    rank re-read what it read before at a re-run step and nothing it had consumed (its batch
    hashes, as `check_batches` judges rank 0), and across every rank and step of the surviving
    timeline no batch was read twice (one rank whose cursor was not restored reads its shard
    again, or another rank's). None on one rank."""
    ranks = ranks_of(legs)
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


def _rerun_differs(
    name: str, after: LegEvents, post: dict[int, Any], before: list[LegEvents], earlier: list[dict[int, Any]]
) -> Check | None:
    """A re-run step of `after` that read another batch than an earlier leg read at that step."""
    for s in sorted(post):  # a re-run step must read what was read there before
        for ev, steps in zip(before, earlier):
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
    return None


def _consumed_before(legs: list[LegEvents], start: int) -> dict[str, tuple[LegEvents, int]]:
    """Batch hash -> (leg, step) of every batch read up to `start` on the surviving timeline
    that leads to the last of `legs` (the first reader of each)."""
    consumed: dict[str, tuple[LegEvents, int]] = {}
    for ev in surviving_timeline(legs)[:-1]:
        for s, (_, e) in steps_of(ev).items():
            if s <= start and "batch_hash" in e:
                consumed.setdefault(e["batch_hash"], (ev, s))
    return consumed


# --- the batch the model ate ----------------------------------------------------------


def check_fed_batch(legs: list[LegEvents]) -> Check | None:
    """Whether each `step(batch=...)` was among the tensors the model was fed: a report, never a
    FAIL. A random augmentation feeds the model another batch than the one read (measured: a
    control whose RNG was restored resumed exactly and failed here), and a prefetching loop
    hands `step()` the next one; the data checks judge the batches the model was fed, which is
    what resumes or not. None: nothing to report."""
    seen = [(ev, n, e) for ev in legs for n, e in ev.all("step") if "step_batch_fed" in e]
    if not seen:
        return None
    name = "the batch given to step() is the one the model was fed (reported, not judged)"
    other = [(ev, n, e) for ev, n, e in seen if e["step_batch_fed"] is False]
    if not other:
        return Check(
            name,
            True,
            f"{len(seen)} steps: every batch given to step() was among the model's inputs",
            kind=Kind.FED_BATCH,
        )
    ev, n, e = other[0]
    return Check(
        name,
        True,
        f"{len(other)} of {len(seen)} steps gave step() a batch the model was not fed (first: leg {ev.leg} step "
        f"{e['step']}): an augmentation, or a batch fetched ahead of its step; the data checks judge the batches "
        "the model was fed",
        ev.pointer((n, e)),
        kind=Kind.FED_BATCH,
    )


NOWHERE_CAUSES = (
    "the data position moved where the straight-through run reads nothing at that step (a skip counted from "
    "the run's start rather than the epoch's?), or the batch is drawn at random (an augmentation whose RNG was "
    "not restored?), or the model takes state carried from step to step under an argument name not read as "
    "state (runtime.session.batches.CARRIED_STATE)"
)


def check_batches_straight(legs: list[LegEvents], straight: LegEvents) -> Check | None:
    """Every step of a resumed leg (not only its first) fed the model the straight-through run's
    batch of that step. A batch the straight run read at *another* step is the data position
    moved (a loader skipped twice shows at the next epoch's start, well after the resume); one
    it never reads at that step is a FAIL too: the batch hash covers the batch only (state
    carried into the forward, an RNN's `hidden`, is hashed apart), so a batch found nowhere is
    the data's doing (`NOWHERE_CAUSES`). None: no hashes to compare."""
    ref = {s: e["batch_hash"] for s, (_, e) in steps_of(straight).items() if "batch_hash" in e}
    where: dict[str, int] = {}
    for s in sorted(ref):
        where.setdefault(ref[s], s)
    timeline = surviving_timeline(legs)
    got = [
        (timeline[i], s, item)
        for i in resumed_legs(legs)  # each leg up to where the next resumed
        for s, item in sorted(steps_of(timeline[i]).items())
        if s in ref and "batch_hash" in item[1]
    ]
    if not got:
        return None
    name = "every resumed step's batch = straight-through run's"
    differ = [(ev, s, item) for ev, s, item in got if item[1]["batch_hash"] != ref[s]]
    moved = [(ev, s, item) for ev, s, item in differ if item[1]["batch_hash"] in where]
    if moved:
        ev, s, item = moved[0]
        at = where[item[1]["batch_hash"]]
        return Check(
            name,
            False,
            f"step {s} (leg {ev.leg}, resumed at step {resume_step(ev)}) read the straight-"
            f"through run's batch of step {at} ({at - s:+d} batches): the data position moved; {len(moved)} "
            f"of {len(got)} resumed steps read another step's batch",
            ev.pointer(item) + straight.pointer(steps_of(straight)[s]),
            kind=Kind.DATA_POSITION,
            leg=ev.leg,
        )
    if differ:
        ev, s, item = differ[0]
        return Check(
            name,
            False,
            f"step {s} (leg {ev.leg}, resumed at step {resume_step(ev)}) fed the model a batch "
            f"({item[1]['batch_hash'][:12]}) the straight-through run reads at no step (at step {s}: {ref[s][:12]}); "
            f"{len(differ)} of {len(got)} resumed steps did: {NOWHERE_CAUSES}",
            ev.pointer(item) + straight.pointer(steps_of(straight)[s]),
            kind=Kind.DATA_POSITION,
            leg=ev.leg,
        )
    return Check(
        name,
        True,
        f"{len(got)} resumed steps: each read the straight-through run's batch of that step",
        kind=Kind.DATA_POSITION,
    )

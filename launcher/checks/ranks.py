"""Every rank proved, not rank 0: each rank's samples and its state at the resume, against the
same rank of the same-shape straight-through run.

- `check_samples` (proof 2): from each rank's step events on the surviving timeline, the samples
  it trained (`rows`: a digest per fed row, runtime.session.samples; else each step's batch
  hash) counted against the straight run's over the same steps: seen twice, never seen, out of
  order, per rank and across ranks, and any sample two ranks trained in one step that the
  straight run's ranks did not. Counted against the straight run, not against "once each": a
  DistributedSampler pads an epoch's last batch with samples another rank trains, and data may
  hold a sample twice; the straight run does the same.
- `check_rank_state` (proof 3): each rank's global RNG at its first resumed step (`rng_in`)
  equal to that rank's in the straight run, one equal to ANOTHER rank's named ("rank 1 resumed
  rank 0's RNG"); each rank's optimizer steps since the resume (`opt_steps`) equal to the straight
  run's over the same steps.
- `check_accumulation_every_rank` (proof 3): launcher.checks.accumulation on each rank's events, every
  rank whose answer is no named.

Each returns None on one rank (rank 0's own checks judge it) and without the evidence.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from launcher.checks.accumulation import check_accumulation, insides, measure
from launcher.checks.data import as_rank, ranks_of
from launcher.checks.evidence import Check, Kind, LegEvents, surviving_timeline
from launcher.checks.resume import resume_step, resumed_legs, same_loss, steps_of


def rank_view(ev: LegEvents, rank: int) -> LegEvents:
    """Rank `rank`'s events of a leg, read as rank 0's (`as_rank`: the rank-0 checks then judge
    it); rank 0's `resume` and `start` stand in where the rank printed none (an adapter's rank 1
    may not)."""
    own = as_rank(ev, rank).items
    have = {e["event"] for _, e in own}
    lent = [(n, e) for n, e in ev.items if e.get("rank", 0) == 0 and e["event"] in {"resume", "start"} - have]
    return LegEvents(ev.leg, ev.log, sorted(lent + own, key=lambda item: item[0]))


@dataclass(frozen=True)
class Stream:
    """One rank's units (sample digests, or batch hashes) step by step: step -> (leg, units)."""

    steps: dict[int, tuple[int, list[str]]]

    def counter(self) -> Counter[str]:
        return Counter(u for _, units in self.steps.values() for u in units)


def _units(e: dict[str, Any], rows: bool) -> list[str]:
    return list(e["rows"]) if rows else [e["batch_hash"]]


def _stream(legs: list[LegEvents], rows: bool, upto: int) -> Stream:
    out: dict[int, tuple[int, list[str]]] = {}
    for ev in legs:
        for s, (_, e) in steps_of(ev).items():
            if s <= upto:
                out[s] = (ev.leg, _units(e, rows))
    return Stream(out)


def _counts(got: Stream, want: Stream) -> dict[str, int]:
    """Seen twice (more often than the straight run), never seen (less often), out of order (as
    often, at other steps), other (not read by the straight run in these steps), of how many."""
    g, w = got.counter(), want.counter()
    at_g: dict[str, list[int]] = {}
    at_w: dict[str, list[int]] = {}
    for stream, at in ((got, at_g), (want, at_w)):
        for s, (_, units) in sorted(stream.steps.items()):
            for u in units:
                at.setdefault(u, []).append(s)
    return {
        "twice": sum(max(0, g[u] - w[u]) for u in g if w[u]),
        "never": sum(max(0, w[u] - g[u]) for u in w),
        "order": sum(1 for u in w if g[u] == w[u] and at_g[u] != at_w[u]),
        "other": sum(g[u] for u in g if not w[u]),
        "of": sum(w.values()),
    }


def _said(c: dict[str, int], unit: str) -> str:
    out = f"{c['twice']} {unit} seen twice, {c['never']} never seen, {c['order']} out of order"
    return out + (f", {c['other']} the straight run does not train by then" if c["other"] else "") + f" of {c['of']}"


def _shared(streams: dict[int, Stream]) -> list[tuple[int, int, int, int]]:
    """(step, rank, other rank, how many) where two ranks trained the same units in one step."""
    out = []
    for s in sorted({s for st in streams.values() for s in st.steps}):
        at = {r: Counter(st.steps[s][1]) for r, st in streams.items() if s in st.steps}
        for r in sorted(at):
            for q in sorted(at):
                if q > r and (n := sum((at[r] & at[q]).values())):
                    out.append((s, r, q, n))
    return out


def legs_items(legs: list[LegEvents]) -> list[tuple[int, dict[str, Any]]]:
    return [item for ev in legs for item in ev.all("step", rank=None)]


def _evidence(legs: list[LegEvents], straight: LegEvents) -> tuple[bool, int] | None:
    """(row digests or batch hashes, the last step compared); None: neither on every step."""
    items = [e for ev in legs + [straight] for _, e in ev.all("step", rank=None)]
    last = min(
        max((int(e["step"]) for _, e in group), default=0) for group in (legs_items(legs), legs_items([straight]))
    )
    items = [e for e in items if int(e["step"]) <= last]
    if items and all(e.get("rows") for e in items):
        return True, last
    if items and all("batch_hash" in e for e in items):
        return False, last
    return None


def check_samples(legs: list[LegEvents], straight: LegEvents | None) -> Check | None:
    """Proof 2 on several ranks: each rank's samples on the surviving timeline against the same
    rank's in the straight-through run, counted (module docstring), and across the ranks."""
    ranks = ranks_of(legs)
    if straight is None or len(ranks) < 2 or not resumed_legs(legs) or ranks_of([straight]) != ranks:
        return None
    found = _evidence(legs, straight)
    if found is None:
        return None
    rows, last = found
    unit = "samples" if rows else "batches"
    got = {r: _stream(surviving_timeline([rank_view(ev, r) for ev in legs]), rows, last) for r in ranks}
    want = {r: _stream([rank_view(straight, r)], rows, last) for r in ranks}
    counts = {r: _counts(got[r], want[r]) for r in ranks}
    every = _counts(Stream(_merged(got)), Stream(_merged(want)))
    shared = Counter((s, r, q) for s, r, q, n in _shared(got) for _ in range(n))
    shared.subtract(Counter((s, r, q) for s, r, q, n in _shared(want) for _ in range(n)))
    extra = sorted((key, n) for key, n in shared.items() if n > 0)
    name = f"every rank's samples = straight-through run's ({len(ranks)} ranks, steps 1..{last}, {unit})"
    facts: dict[str, Any] = {"ranks": len(ranks), "unit": unit, "per_rank": counts, "across": every}
    first = _first_difference(got, want)
    bad = [r for r in ranks if any(counts[r][k] for k in ("twice", "never", "order", "other"))]
    if bad or extra or first is not None:
        said = "; ".join(f"rank {r}: {_said(counts[r], unit)}" for r in bad) or f"every rank: {unit} as straight"
        if extra:
            (s, r, q), n = extra[0]
            said += f"; ranks {r} and {q} both trained {n} of the same {unit} at step {s}"
            said += f" ({sum(n for _, n in extra)} in all, the straight run's ranks none)"
        where = ""
        if first is not None:
            r, s, leg = first
            where = f"; first difference: rank {r}, step {s} (leg {leg})"
            facts.update(rank=r, step=s, leg=leg)
        return Check(
            name, False, f"{said}; across the ranks: {_said(every, unit)}{where}", kind=Kind.RANK_SAMPLES, facts=facts
        )
    sizes = ", ".join(f"rank {r}: {counts[r]['of']}" for r in ranks)
    both = sum(n for *_, n in _shared(want))
    return Check(
        name,
        True,
        f"each rank trained the straight-through run's {unit} at its steps ({sizes}): 0 seen twice, 0 never "
        f"seen, 0 out of order; across the ranks {every['of']}; {both} trained by two ranks in one step, as in "
        "the straight run",
        kind=Kind.RANK_SAMPLES,
        facts=facts,
    )


def _merged(streams: dict[int, Stream]) -> dict[int, tuple[int, list[str]]]:
    out: dict[int, tuple[int, list[str]]] = {}
    for st in streams.values():
        for s, (leg, units) in st.steps.items():
            out[s] = (leg, out.get(s, (leg, []))[1] + units)
    return out


def _first_difference(got: dict[int, Stream], want: dict[int, Stream]) -> tuple[int, int, int] | None:
    """(rank, step, leg) of the earliest step a rank trained other units than the straight run's."""
    for s in sorted({s for st in want.values() for s in st.steps}):
        for r in sorted(got):
            mine, ref = got[r].steps.get(s), want[r].steps.get(s)
            if ref is not None and (mine is None or Counter(mine[1]) != Counter(ref[1])):
                return r, s, mine[0] if mine else -1
    return None


def check_rank_state(legs: list[LegEvents], straight: LegEvents | None, exact: bool) -> Check | None:
    """Proof 3 on several ranks: at each resumed leg's first step, each rank's `rng_in` against the
    same rank's in the straight-through run (another rank's named; one no rank had named where
    rank 0's came back and this rank's loss then left the straight run's: a draw both runs make
    alike is no finding), and where compared exactly, each rank's optimizer steps since the resume
    and its epoch against the straight run's over the same steps (a resume inside an accumulation
    window is launcher.checks.accumulation's finding, left to it)."""
    ranks = ranks_of(legs)
    if straight is None or len(ranks) < 2 or not resumed_legs(legs) or ranks_of([straight]) != ranks:
        return None
    ref = {r: steps_of(rank_view(straight, r)) for r in ranks}
    windows = measure(legs, straight)
    inside = {x.leg.leg for x in insides(legs, windows, straight, exact)} if windows and windows.size > 1 else set()
    name = f"every rank's RNG and optimizer steps at the resume = straight-through run's ({len(ranks)} ranks)"
    said: list[int] = [0, 0]
    for i in resumed_legs(legs):
        mine = {r: steps_of(rank_view(legs[i], r)) for r in ranks}
        at = resume_step(legs[i]) or 0
        for r in ranks:
            found = _rng_differs(legs[i], r, mine, ref, at, said) or (
                _opt_differs(legs[i], r, mine[r], ref[r], at, said) if exact and legs[i].leg not in inside else None
            )
            if found is not None:
                detail, item, other = found
                facts = {"rank": r, "ranks": len(ranks)} | ({"other": other} if other is not None else {})
                return Check(
                    name, False, detail, legs[i].pointer(item), kind=Kind.RANK_STATE, leg=legs[i].leg, facts=facts
                )
    if not any(said):
        return None
    return Check(
        name,
        True,
        f"{said[0]} resumes of a rank: each one's global RNG at its first step that rank's in the straight run; "
        f"{said[1]} resumed steps of a rank: the optimizer steps since the resume and the epoch the straight run's",
        kind=Kind.RANK_STATE,
        leg=legs[-1].leg,
        facts={"ranks": len(ranks)},
    )


Steps = dict[int, tuple[int, dict[str, Any]]]


def _rng_differs(
    ev: LegEvents, r: int, mine: dict[int, Steps], ref: dict[int, Steps], at: int, said: list[int]
) -> tuple[str, Any, int | None] | None:
    if not mine[r]:
        return None
    first = min(mine[r])
    got = mine[r][first][1].get("rng_in")
    want = {q: ref[q][first][1].get("rng_in") for q in ref if first in ref[q]}
    if got is None or want.get(r) is None:
        return None
    said[0] += 1
    if got == want[r]:
        return None
    where = f"at step {first}, leg {ev.leg}'s first after its resume at step {at}"
    other = next((q for q in sorted(want) if q != r and want[q] == got), None)
    if other is not None:
        return (
            f"rank {r} resumed rank {other}'s RNG: its global RNG {where} is rank {other}'s in the straight-through "
            f"run, not its own (one rank's RNG saved and restored on every rank?)",
            mine[r][first],
            other,
        )
    zero = mine.get(0, {}).get(first, (0, {}))[1].get("rng_in")
    left = [
        s
        for s, (_, e) in sorted(mine[r].items())
        if s in ref[r] and "loss" in e and not same_loss(e["loss"], ref[r][s][1].get("loss", e["loss"]))
    ]
    if r == 0 or zero is None or zero != want.get(0) or not left:
        return None  # rank 0's own is launcher.checks.causes' to name; a draw that changed nothing is no finding
    return (
        f"rank {r}'s global RNG {where} is not the straight-through run's, where rank 0's is (a rank whose RNG "
        f"was not restored: its file missing from the checkpoint?); its loss left the straight run's at step {left[0]}",
        mine[r][first],
        None,
    )


def _opt_differs(
    ev: LegEvents, r: int, mine: Steps, ref: Steps, at: int, said: list[int]
) -> tuple[str, Any, int | None] | None:
    """A resumed step of rank `r` whose optimizer steps since the resume, or whose epoch (the
    sampler's, as the step prints it), is not the straight run's at that step."""
    base = 0 if at == 0 else ref.get(at, (0, {}))[1].get("opt_steps")
    for s, item in sorted(mine.items()):
        e, want = item[1], ref.get(s, (0, {}))[1]
        if "epoch" in e and "epoch" in want and e["epoch"] != want["epoch"]:
            return (
                f"rank {r} trained step {s} (leg {ev.leg}, resumed at step {at}) in epoch {e['epoch']}, the "
                f"straight-through run in epoch {want['epoch']}",
                item,
                None,
            )
        if e.get("opt_steps") is None or want.get("opt_steps") is None or base is None:
            continue
        said[1] += 1
        if e["opt_steps"] != want["opt_steps"] - base:
            return (
                f"rank {r} stepped its optimizer {e['opt_steps']} times from the resume at step {at} to step {s} "
                f"(leg {ev.leg}), the straight-through run {want['opt_steps'] - base}",
                item,
                None,
            )
    return None


def check_accumulation_every_rank(legs: list[LegEvents], straight: LegEvents | None, exact: bool) -> Check | None:
    """launcher.checks.accumulation on every rank: rank 0's answer where no rank's is no; else the
    first such rank's, naming every rank whose answer is no ("ranks 0 and 1: resumed at ...": a
    loop that accumulates alike on every rank is inside the window on every rank)."""
    zero = check_accumulation(legs, straight, exact)
    ranks = ranks_of(legs)
    if len(ranks) < 2:
        return zero
    answers = {ranks[0]: zero} | {
        r: check_accumulation(
            [rank_view(ev, r) for ev in legs], rank_view(straight, r) if straight is not None else None, exact
        )
        for r in ranks[1:]
    }
    bad = [r for r, c in answers.items() if c is not None and not c.ok]
    if not bad:
        return zero
    first = answers[bad[0]]
    assert first is not None
    who = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad[:-1]))} and {bad[-1]}"
    return Check(
        first.name,
        False,
        f"{who}: {first.detail}",
        first.evidence,
        kind=Kind.ACCUMULATION,
        leg=first.leg,
        facts={**first.facts, "rank": bad[0], "ranks_inside": bad},
    )

"""Proofs 2, 3, 4 and 8: what a resume must bring back, over every resume of every run.

They use launcher.checks.resume and launcher.checks.state: the same functions, on the same
logs, that the rungs and the drill answered with.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import NO_EVENTS, Check, Kind, LegEvents, find, silent
from launcher.config.schema import Config
from launcher.report.runs import (
    FAIL,
    MISSING,
    PASS,
    RESUME_RUNGS,
    Evidence,
    NoResume,
    Proof,
    RunData,
    never_resumed,
    resumes,
    run_exact,
)


def resume_findings(run: RunData, number: int, exact: bool) -> list[tuple[int, Check]]:
    """(leg, check) for proof `number` (2, 3 or 4) over one run."""
    from launcher.checks.resume import check_lr, resumed_legs
    from launcher.checks.state import PROOF_KINDS, check_optimizer_in_use, check_restored, check_state_straight

    legs, straight = run.legs, (run.straight[0] if run.straight else None)
    found: list[tuple[int, Check]] = []
    kinds = PROOF_KINDS[number]
    measured: list[tuple[int, Check | None]] = [
        (legs[i].leg, check_restored(legs, i, kinds)) for i in resumed_legs(legs)
    ]
    if straight is not None and exact and resumed_legs(legs):
        measured.append((legs[-1].leg, check_state_straight(legs, straight, kinds)))
    if number == 2:
        found = _data_position(legs, straight, measured)
    elif number == 3:  # accumulation first: a resume inside a window explains the loss that follows
        from launcher.checks.accumulation import within_first_window
        from launcher.checks.ranks import check_accumulation_every_rank, check_rank_state

        acc = check_accumulation_every_rank(legs, straight, exact)
        found = ([(acc.leg or legs[-1].leg, acc)] if acc else []) + [
            (legs[i].leg, check_lr(legs, i, straight)) for i in resumed_legs(legs)
        ]
        measured.append((legs[-1].leg, check_rank_state(legs, straight, exact)))
        measured += [
            (legs[i].leg, check_optimizer_in_use(legs, i))
            for i in resumed_legs(legs)
            if not within_first_window(legs, i, straight)
        ]
    elif number == 4:
        found = _loss_continuity(legs, straight, exact, measured)
    if number == 4 and legs:  # two straight-through runs that disagreed: the rung's finding stands here too
        found += [
            (legs[-1].leg, Check(c["name"], False, c["detail"], kind=Kind.CPU_DETERMINISM))
            for c in find(run.row.get("checks", []), Kind.CPU_DETERMINISM, ok=False)
        ]
    return found + [(leg, c) for leg, c in measured if c is not None]


def _data_position(legs: list[LegEvents], straight: LegEvents | None, measured: list[Any]) -> list[tuple[int, Check]]:
    """Proof 2's checks of one run (the batch each resumed leg fed, measured, joins `measured`)."""
    from launcher.checks.data import check_batches, check_batches_straight, check_fed_batch, check_sample_index
    from launcher.checks.resume import resumed_legs

    found = [(legs[i].leg, check_batches(legs, i, straight)) for i in resumed_legs(legs)]
    if straight is not None and found:
        from launcher.checks.ranks import check_samples

        found.append((legs[-1].leg, check_batches_straight(legs, straight)))
        measured.append((legs[-1].leg, check_samples(legs, straight)))
    witness = check_sample_index(legs)
    if witness is not None and found:
        found.append((legs[-1].leg, witness))
    if found:
        measured.append((legs[-1].leg, check_fed_batch(legs)))
    return found


def _loss_continuity(
    legs: list[LegEvents], straight: LegEvents | None, exact: bool, measured: list[Any]
) -> list[tuple[int, Check]]:
    """Proof 4's checks of one run: re-run steps against their first loss, the timeline against
    the straight-through run (its measured fields join `measured`)."""
    from launcher.checks.resume import check_loss, compare_straight, resumed_legs
    from launcher.checks.state import check_fields_straight

    if straight is not None and exact and resumed_legs(legs):
        measured.append((legs[-1].leg, check_fields_straight(legs, straight)))
    rerun = [
        i
        for i in resumed_legs(legs)
        if any(
            s in {int(e["step"]) for ev in legs[:i] for _, e in ev.all("step")}
            for s in (int(e["step"]) for _, e in legs[i].all("step"))
        )
    ]
    found = [(legs[i].leg, check_loss(legs, i, exact)) for i in rerun]
    if straight is not None and resumed_legs(legs):
        found.append((legs[-1].leg, compare_straight(legs, straight, exact)))
    elif not rerun:
        found = [(legs[i].leg, check_loss(legs, i, exact)) for i in resumed_legs(legs)]
    return found


def proof_resume_checks(number: int, runs: list[RunData], cfg: Config, cite: Evidence, never: list[NoResume]) -> Proof:
    """Proofs 2-4: every resume across every run; any failure fails the proof, and so does
    a leg that should have resumed and never did. A check that cannot be answered from
    what the trainer printed (no batch hashes) makes the proof MISSING, never PASS."""
    checks = [
        (run, leg, c)
        for run in runs
        if run.rung in RESUME_RUNGS
        for leg, c in resume_findings(run, number, run_exact(run, cfg))
    ]
    if not checks and not never:
        quiet = [r for r in runs if r.rung in RESUME_RUNGS and r.legs and all(silent(ev) for ev in r.legs)]
        if quiet:
            return Proof(number, MISSING, f"{quiet[0].rung} {quiet[0].id}: {NO_EVENTS}")
        return Proof(number, MISSING, "no leg resumed from the store in the runs reported")
    items = [(run, leg, c) for run, leg, c in checks] + [
        (n.run, n.leg.leg, Check(f"leg {n.leg.leg} resumed", False, n.reason, (), kind=Kind.RESUMED, leg=n.leg.leg))
        for n in never
    ]
    failed = [t for t in items if not t[2].ok and not t[2].missing]
    absent = [t for t in items if t[2].missing]
    shown = failed[:3] or absent[:1] or (items[:1] + items[-1:] if len(items) > 1 else items)
    evidence: list[dict[str, Any]] = []
    for run, _, c in shown:
        evidence += cite.cite(run, c.evidence)
    lines = [f"{run.rung} {run.id} leg {leg}: {c.name}: {c.detail}" for run, leg, c in items]
    if failed:
        names = list(dict.fromkeys(c.name for _, _, c in failed))
        also = f" ({'; '.join(names)})" if len(names) > 1 else ""
        status, head = (
            FAIL,
            (f"{len(failed)} of {len(items)} checks failed{also}; first: {failed[0][2].name}: {failed[0][2].detail}"),
        )
    elif absent:
        status, head = MISSING, f"{absent[0][2].name}: {absent[0][2].detail}"
    else:
        status, head = (
            PASS,
            (
                f"all {len(items)} checks across {len({r.id for r, _, _ in items})} runs hold; e.g. "
                f"{items[-1][2].name}: {items[-1][2].detail}"
            ),
        )
    return Proof(number, status, head, {"checks": len(items), "failed": len(failed), "each": lines}, evidence)


def proof_2(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Exact data position: each resumed leg reads the batches due there (and the
    trainer's sample index, when it prints one, advances by one stride a step)."""
    return proof_resume_checks(2, runs, cfg, cite, never_resumed(runs))


def proof_3(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Optimizer and LR state restored: every step of a resumed leg has the schedule's own LR."""
    return proof_resume_checks(3, runs, cfg, cite, never_resumed(runs))


def proof_4(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Loss continuity: re-run steps reproduce the earlier loss (exactly on a deterministic
    CPU), or the whole timeline equals the straight-through run."""
    return proof_resume_checks(4, runs, cfg, cite, never_resumed(runs))


def proof_8(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Two sequential resumes on one run: the batch hashes on the surviving timeline never
    repeat, and (CPU) the whole timeline equals the straight-through run."""
    from launcher.checks.data import check_no_repeat
    from launcher.checks.resume import compare_straight

    best: tuple[RunData, list[Check], int] | None = None
    for run in runs:
        pairs = resumes(run)
        if len(pairs) < 2:
            continue
        straight = run.straight[0] if run.straight else None
        found = [check_no_repeat(run.legs, straight)]
        if straight is not None:
            found.append(compare_straight(run.legs, straight, run_exact(run, cfg)))
        bad = any(not c.ok for c in found)
        if best is None or bad or (all(c.ok for c in best[1]) and run.on_gpu):
            best = (run, found, len(pairs))
        if bad:
            break
    if best is None:
        return Proof(8, MISSING, "no run resumed twice (rehearsal, smoke and the drill do)")
    run, found, n = best
    evidence = cite.cite(run, tuple(p for ev in run.legs[1:] for p in ev.pointer(ev.first("resume"))))
    failed = [c for c in found if not c.ok and not c.missing]
    status = FAIL if failed else MISSING if any(c.missing for c in found) else PASS
    detail = "; ".join(f"{c.name}: {c.detail}" for c in (failed or found))
    return Proof(
        8,
        status,
        f"{run.rung} {run.id}: {n} sequential resumes; {detail}",
        {"run": run.id, "resumes": n, "detail": detail},
        evidence,
    )

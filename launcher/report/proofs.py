"""The eight proofs of docs/design.md, re-derived from the runs' ledger rows and leg logs
alone, and `PROOFS`: the one table of their numbers, titles and functions.

A proof with no number to state is MISSING, never PASS. Proofs 2-4 and 8 (what a
resume must bring back) use launcher.checks.resume: the same functions, on the
same logs, that the rungs and the drill answered with. Proofs 1, 6 and 7 rest on
the launcher's own reads of the store (ledger checks), never on what a leg says
about itself alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from launcher.checks.evidence import NO_EVENTS, Check, Kind, LegEvents, find, silent
from launcher.checks.measure import RATE_REL_ERR_MAX
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
    all_resumes,
    crashed_legs,
    never_resumed,
    rate_leg,
    readback_of,
    resumes,
    run_exact,
)

BYTES_PER_PARAM = 12.0
"""Model + AdamW state in fp32: weights 4 + two moments 8 bytes per parameter."""
REPRESENTATIVE_FRACTION = 0.5
"""A checkpoint under half of ~12 B/param was not sized like the real one."""


def storage_failures(runs: list[RunData]) -> list[tuple[RunData, dict[str, Any]]]:
    """Ledger checks that say a leg's checkpoint did not reach the store: the launcher's own
    read failed, or a leg the launcher ended (SIGTERM, deadline) did not stop as asked, so
    it pushed no final checkpoint."""
    lost = (Kind.READBACK, Kind.STOPPED_AS_ASKED)
    return [(run, c) for run in runs for c in run.row.get("checks", []) if c.get("kind") in lost and not c["ok"]]


def proof_1(runs: list[RunData], cite: Evidence, cfg: Config | None = None) -> Proof:
    """Upload and pull back: rests on the launcher's own read of the store after the pushing
    leg, not on its `verify` event. (`cfg` is unused: every proof takes the same keywords.)"""
    pairs, never = all_resumes(runs), never_resumed(runs)
    lost = storage_failures(runs)
    if lost:
        run, c = lost[0]
        return Proof(1, FAIL, f"{run.rung} {run.id}: {c['name']}: {c['detail']}", {"failed": len(lost)})
    read = {(p.run.id, p.before.leg): readback_of(p.run, p.before.leg) for p in pairs}
    bad = [p for p in pairs if read[(p.run.id, p.before.leg)] is not None and not read[(p.run.id, p.before.leg)]["ok"]]
    if bad:
        b = bad[0]
        return Proof(
            1,
            FAIL,
            f"{b.run.rung} {b.run.id}: the launcher's read of the store after leg {b.before.leg} "
            f"failed: {read[(b.run.id, b.before.leg)]['detail']}",
            {"failed": len(bad)},
        )
    usable = [p for p in pairs if p.verify is not None and read[(p.run.id, p.before.leg)] is not None]
    if never:
        n = never[0]
        return Proof(
            1,
            FAIL,
            f"{len(never)} leg(s) did not pull a checkpoint back; {n.detail}"
            + (f"; {len(usable)} other resumes did" if usable else ""),
            {"failed": [x.detail for x in never], "resumes_seen": len(usable)},
            cite.cite(n.run, n.leg.pointer(n.leg.first("start"))),
        )
    if not usable:
        return Proof(
            1,
            MISSING,
            "no resume from a checkpoint a previous leg pushed and the launcher read back from the store itself",
        )
    best = max(
        usable,
        key=lambda p: (p.run.on_gpu, RESUME_RUNGS.index(p.run.rung) if p.run.rung in RESUME_RUNGS else -1, p.after.leg),
    )
    leg, (line, v) = best.verify  # type: ignore[misc]
    ev = {e.leg: e for e in best.run.legs}
    push = next(((n, e) for n, e in ev[leg].all("push") if e.get("step") == best.step), None)
    resume = best.after.first("resume")
    numbers = {
        "run": best.run.id,
        "checkpoint": v["name"],
        "step": best.step,
        "pushed_by_leg": leg,
        "bytes": push[1]["bytes"] if push else None,
        "push_s": push[1]["seconds"] if push else None,
        "verify_bytes_read": v["bytes_read"],
        "resumed_by_leg": best.after.leg,
        "store": best.run.row["store_uri"],
        "resumes_seen": len(usable),
    }
    size = f"{numbers['bytes']:,} B pushed in {numbers['push_s']} s, " if push else ""
    evidence = cite.cite(
        best.run, (push and ev[leg].pointer(push) or ()) + ev[leg].pointer((line, v)) + best.after.pointer(resume)
    )
    numbers["launcher_read"] = read[(best.run.id, best.before.leg)]["detail"]
    return Proof(
        1,
        PASS,
        f"{v['name']}: {size}verified by reading back {v['bytes_read']:,} B; the launcher's own "
        f"read: {numbers['launcher_read']}; leg "
        f"{best.after.leg} (fresh disk) pulled it and resumed at step {best.step} "
        f"({best.run.rung} {best.run.id}; {len(usable)} such resumes in all)",
        numbers,
        evidence,
    )


def resume_findings(run: RunData, number: int, exact: bool) -> list[tuple[int, Check]]:
    """(leg, check) for proof `number` (2, 3 or 4) over one run."""
    from launcher.checks.resume import (
        check_batches,
        check_loss,
        check_lr,
        check_sample_index,
        compare_straight,
        resumed_legs,
    )
    from launcher.checks.state import (
        PROOF_KINDS,
        check_batches_straight,
        check_fed_batch,
        check_fields_straight,
        check_optimizer_in_use,
        check_restored,
        check_state_straight,
    )

    legs, straight = run.legs, (run.straight[0] if run.straight else None)
    found: list[tuple[int, Check]] = []
    kinds = PROOF_KINDS[number]
    measured: list[tuple[int, Check | None]] = [
        (legs[i].leg, check_restored(legs, i, kinds)) for i in resumed_legs(legs)
    ]
    if straight is not None and exact and resumed_legs(legs):
        measured.append((legs[-1].leg, check_state_straight(legs, straight, kinds)))
    if number == 2:
        found = [(legs[i].leg, check_batches(legs, i, straight)) for i in resumed_legs(legs)]
        if straight is not None and found:
            found.append((legs[-1].leg, check_batches_straight(legs, straight)))
        witness = check_sample_index(legs)
        if witness is not None and found:
            found.append((legs[-1].leg, witness))
        if found:
            measured.append((legs[-1].leg, check_fed_batch(legs)))
    elif number == 3:
        found = [(legs[i].leg, check_lr(legs, i, straight)) for i in resumed_legs(legs)]
        measured += [(legs[i].leg, check_optimizer_in_use(legs, i)) for i in resumed_legs(legs)]
    elif number == 4:
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
    if number == 4 and legs:  # two straight-through runs that disagreed: the rung's finding stands here too
        found += [
            (legs[-1].leg, Check(c["name"], False, c["detail"], kind=Kind.CPU_DETERMINISM))
            for c in find(run.row.get("checks", []), Kind.CPU_DETERMINISM, ok=False)
        ]
    return found + [(leg, c) for leg, c in measured if c is not None]


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


def proof_5(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Sustained throughput on the target GPU (a standard error within RATE_REL_ERR_MAX), and
    the ETA it implies for the run rung's steps."""
    measured = rate_leg(runs, gpu=True)
    if measured is None:
        cpu = rate_leg(runs, gpu=False)
        note = (
            f"; the CPU legs measured {cpu[2]['tok_s']:,.0f} tok/s ({cpu[0].rung} leg {cpu[1].leg}), which "
            "says nothing about the target GPU"
            if cpu
            else ""
        )
        return Proof(
            5, MISSING, "no GPU rung ran: no rate on the target hardware (run `launcher up probe --gpus ...`)" + note
        )
    run, ev, s = measured
    run_steps = cfg.rungs.run.steps
    tps = s["tokens_per_step"]
    eta = run_steps * tps / s["tok_s"] if tps else None
    numbers = {
        "run": run.id,
        "leg": ev.leg,
        "gpus": run.gpus,
        "tok_s": s["tok_s"],
        "rel_err": s["rel_err"],
        "window": [s["window_first"], s["window_last"]],
        "window_steps": s["window_steps"],
        "window_s": s["seconds"],
        "tokens_per_step": tps,
        "run_steps": run_steps,
        "eta_s": eta,
    }
    evidence = cite.cite(run, s["evidence"])
    rel = s["rel_err"]
    text = (
        f"{s['tok_s']:,.1f} tok/s on {run.gpus} ({run.rung} leg {ev.leg}, steps {s['window_first']}.."
        f"{s['window_last']}, {s['seconds']:.0f} s, warm-up excluded), standard error "
        + ("unknown" if rel is None else f"+-{100 * rel:.2f} %")
        + (
            f"; ETA for the run's {run_steps:,} steps: {run_steps:,} x {tps:,} tokens / {s['tok_s']:,.1f} tok/s = "
            f"{eta / 3600:,.1f} h"
            if eta
            else ""
        )
    )
    if rel is None or rel > RATE_REL_ERR_MAX:
        return Proof(
            5,
            FAIL,
            text + f" — not a sustained rate (needs a standard error <= "
            f"{100 * RATE_REL_ERR_MAX:.0f} %; measure a longer leg)",
            numbers,
            evidence,
        )
    return Proof(5, PASS, text, numbers, evidence)


def proof_6(runs: list[RunData], cite: Evidence, cfg: Config | None = None) -> Proof:
    """Cold resume: each drill kill is followed by a leg on a fresh instance that resumed from
    the newest verified checkpoint, read from the store alone. (`cfg` is unused.)"""
    drills = [r for r in runs if r.rung == "drill"]
    if not drills:
        return Proof(6, MISSING, "no cold-resume drill in the runs reported (run `launcher drill cold-resume`)")
    kills, bad, evidence = [], [], []
    for run in drills:
        legs = {leg["leg"]: leg for leg in run.row["legs"]}
        for i, leg in legs.items():
            if not leg["killed"] or i + 1 not in legs:  # a leg killed and relaunched: a cold resume to judge
                continue
            after = run.legs[i + 1]
            resume = after.first("resume")
            logged = [int(e["step"]) for ev in run.legs[: i + 1] for _, e in ev.all("verify") if e.get("ok")]
            newest_logged = max(logged) if logged else None
            store_check = next(iter(find(run.row["checks"], Kind.RESUMED_NEWEST, leg=i + 1)), None)
            got = int(resume[1]["from_step"]) if resume else None
            fresh = legs[i + 1]["instance"] != leg["instance"]
            read = readback_of(run, i)
            ok = (
                resume is not None
                and fresh
                and store_check is not None
                and store_check["ok"]
                and read is not None
                and read["ok"]
                and (newest_logged is None or got >= newest_logged)
            )
            kills.append(
                {
                    "run": run.id,
                    "killed_leg": i,
                    "how": leg["end_reason"],
                    "resumed_at": got,
                    "next_leg_exit": legs[i + 1]["exit_code"],
                    "newest_verified_in_logs": newest_logged,
                    "fresh_instance": fresh,
                    # the drill read the store after the kill; its check says what it found
                    "store_read_at_kill": _at_kill(store_check),
                    "launcher_read": read["detail"] if read else "the launcher did not read the store back",
                }
            )
            if not ok:
                bad.append(kills[-1])
            evidence += cite.cite(run, after.pointer(resume))
    if not kills:
        return Proof(6, MISSING, "the drill runs reported killed no leg")
    status = FAIL if bad else PASS
    k = bad[0] if bad else kills[-1]  # a failure is told by the first kill that failed
    summary = (
        f"{len(kills) - len(bad)} of {len(kills)} kills recovered solely from the store on a fresh instance; "
        f"e.g. leg {k['killed_leg']} {k['how']}: the next leg (exit {k['next_leg_exit']}) resumed at step "
        f"{k['resumed_at']} "
        f"(newest verified in the logs: {k['newest_verified_in_logs']}; {k['store_read_at_kill']})"
    )
    return Proof(6, status, summary, {"kills": kills, "failed": len(bad)}, evidence[-4:])


def _at_kill(check: dict[str, Any] | None) -> str | None:
    """What the drill's own read of the store found at a kill, from its check's facts."""
    if check is None:
        return None
    facts = check.get("facts") or {}
    return f"newest verified at the kill: step {facts.get('expected')}" + (
        f"; {facts['state']}" if facts.get("state") else ""
    )


def storage_cycles(ev: LegEvents) -> list[dict[str, Any]]:
    """push -> verify ok -> delete_local (free space read) -> a later step, all in one leg."""
    steps = [e["step"] for _, e in ev.all("step")]
    start = ev.first("start")
    params = int(start[1].get("params") or 0) if start else 0
    found = []
    for item in ev.all("push"):
        s = item[1]["step"]
        verify = next(((n, e) for n, e in ev.all("verify") if e.get("step") == s and e.get("ok") and n > item[0]), None)
        delete = next(
            ((n, e) for n, e in ev.all("delete_local") if e.get("step") == s and verify and n > verify[0]), None
        )
        later = next((x for x in steps if x > s), None)
        if verify and delete and later is not None and delete[1].get("free_bytes") is not None:
            found.append({"push": item, "verify": verify, "delete": delete, "later_step": later, "params": params})
    return found


def proof_7(runs: list[RunData], cite: Evidence, cfg: Config | None = None) -> Proof:
    """The storage cycle at a representative size: the largest whole cycle, checked against
    the launcher's read of the store and the bytes the saved state should take. (`cfg` is unused.)"""
    candidates = [(run, ev, c) for run in runs for ev in run.legs for c in storage_cycles(ev)]
    if not candidates:
        return Proof(
            7,
            MISSING,
            "no leg shows a whole cycle: push, verify by reading back, delete locally, "
            "free space read, and training on",
        )
    run, ev, c = max(candidates, key=lambda t: (t[0].on_gpu, t[2]["push"][1]["bytes"]))
    p, v, d = c["push"][1], c["verify"][1], c["delete"][1]
    per_param = p["bytes"] / c["params"] if c["params"] else None
    read = readback_of(run, ev.leg)
    save = next((e for _, e in ev.all("save") if e.get("step") == p["step"]), None)
    sizes = save.get("state_bytes") if save and isinstance(save.get("state_bytes"), dict) else None
    numbers = {
        "run": run.id,
        "leg": ev.leg,
        "checkpoint": p["name"],
        "bytes": p["bytes"],
        "push_s": p["seconds"],
        "verify_windows": v["windows"],
        "verify_bytes_read": v["bytes_read"],
        "verify_s": v["seconds"],
        "bytes_freed": d["bytes_freed"],
        "free_bytes_after": d["free_bytes"],
        "trained_on_to": c["later_step"],
        "params": c["params"],
        "bytes_per_param": round(per_param, 2) if per_param else None,
        "state_bytes": sizes,
        "launcher_read": read["detail"] if read else None,
        "cycles_seen": len(candidates),
    }
    evidence = cite.cite(run, ev.pointer(c["push"]) + ev.pointer(c["verify"]) + ev.pointer(c["delete"]))
    text = (
        f"{p['name']} ({run.rung} leg {ev.leg}): {p['bytes']:,} B pushed in {p['seconds']} s; verified "
        f"{v['bytes_read']:,} B in {v['windows']} windows in {v['seconds']} s; deleted locally "
        f"({d['bytes_freed']:,} B freed, {d['free_bytes'] / 1e9:,.1f} GB free); trained on to step {c['later_step']}"
    )
    if read is None or not read["ok"]:
        return Proof(
            7,
            FAIL if read else MISSING,
            text + "; the launcher's own read of the store after leg "
            f"{ev.leg}: " + (read["detail"] if read else "none was made"),
            numbers,
            evidence,
        )
    text += f"; the launcher read it back: {read['detail']}"
    if per_param is None:
        return Proof(7, FAIL, text + "; the leg did not say its parameter count: size unknown", numbers, evidence)
    text += f"; {per_param:.1f} B/param for {c['params']:,} params"
    if sizes:  # what the saved state really holds: SGD 4 B/param of state on top of the weights, Adam 8, ...
        need = sum(int(x) for x in sizes.values())
        opt = sizes.get("optimizer", 0) / c["params"]
        text += (
            f"; the saved state holds {need:,} B ({opt:.1f} B/param of optimizer state, "
            f"{sizes.get('model', 0) / c['params']:.1f} of weights)"
        )
        if p["bytes"] < 0.9 * need:
            return Proof(
                7,
                FAIL,
                text + " — the checkpoint pushed is smaller than the state it claims to hold",
                numbers,
                evidence,
            )
        return Proof(7, PASS, text, numbers, evidence)
    if per_param < REPRESENTATIVE_FRACTION * BYTES_PER_PARAM:
        return Proof(
            7,
            FAIL,
            text + f" — much smaller than the ~{BYTES_PER_PARAM:.0f} B/param of model + optimizer "
            "state, and the leg did not say what its saved state holds",
            numbers,
            evidence,
        )
    return Proof(7, PASS, text, numbers, evidence)


def proof_8(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    """Two sequential resumes on one run: the batch hashes on the surviving timeline never
    repeat, and (CPU) the whole timeline equals the straight-through run."""
    from launcher.checks.resume import check_no_repeat, compare_straight

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


# --- the table ----------------------------------------------------------------------


class ProofCheck(Protocol):
    """How `derive` calls every proof: by keyword, so a proof that needs no config may
    leave `cfg` as an optional last parameter."""

    def __call__(self, *, runs: list[RunData], cfg: Config, cite: Evidence) -> Proof: ...


@dataclass(frozen=True)
class ProofSpec:
    """One row of the table: docs/design.md's number and title, and the function that derives it."""

    number: int
    title: str
    check: ProofCheck


PROOFS: tuple[ProofSpec, ...] = (
    ProofSpec(1, "Upload a checkpoint to the store; restart and pull it back", proof_1),
    ProofSpec(2, "Exact data position on resume (sample index + batch hash)", proof_2),
    ProofSpec(3, "Optimizer and LR state restored", proof_3),
    ProofSpec(4, "Loss continuity across the restart, within noise", proof_4),
    ProofSpec(5, "Sustained throughput on the target hardware, and the ETA it implies", proof_5),
    ProofSpec(6, "Cold resume: kill the instance, recover solely from the store", proof_6),
    ProofSpec(7, "The storage cycle at a representative size", proof_7),
    ProofSpec(8, "Two sequential resumes: never backwards, nothing re-read", proof_8),
)
TITLES = {spec.number: spec.title for spec in PROOFS}


def over_crashed_legs(number: int, proof: Proof, runs: list[RunData]) -> Proof:
    """No PASS over what the launcher did not see go right: a proof resting on a leg that
    exited non-zero outside a planned kill FAILs, whatever its checks said (a rank-only
    `assert` after a verified final checkpoint kills every correct leg)."""
    if proof.status != PASS:
        return proof
    rests = (
        [r for r in runs if r.id == proof.numbers.get("run")]
        if number == 5
        else [r for r in runs if r.rung in RESUME_RUNGS]
    )
    bad = [line for r in rests for line in crashed_legs(r)]
    if not bad:
        return proof
    return Proof(
        number,
        FAIL,
        f"{len(bad)} leg(s) this proof rests on exited non-zero outside a planned kill "
        f"(first: {bad[0]}): its checks held, the legs did not; {proof.summary}",
        {**proof.numbers, "crashed_legs": bad},
        proof.evidence,
    )


def derive(cfg: Config, runs: list[RunData], cite: Evidence) -> dict[int, Proof]:
    """The eight proofs, from the runs' ledger rows and leg logs alone."""
    return {
        spec.number: over_crashed_legs(spec.number, spec.check(runs=runs, cfg=cfg, cite=cite), runs) for spec in PROOFS
    }

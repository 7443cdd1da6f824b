"""Proofs 1, 6 and 7: the store. Each rests on the launcher's own read of the store after a
leg (a ledger check), never on what a leg says about itself alone.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import Kind, LegEvents, find
from launcher.config.schema import Config
from launcher.report.runs import (
    FAIL,
    MISSING,
    PASS,
    RESUME_RUNGS,
    Evidence,
    Proof,
    RunData,
    all_resumes,
    never_resumed,
    nothing_to_resume,
    readback_of,
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
    return _proof_1_pass(best, read[(best.run.id, best.before.leg)], len(usable), cite)


def _proof_1_pass(best: Any, read: dict[str, Any], seen: int, cite: Evidence) -> Proof:
    """Proof 1's PASS, told by its best resume (on a GPU, the latest rung and leg): the push, the
    verify, the launcher's own read and the resume that pulled it back."""
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
        "resumes_seen": seen,
    }
    size = f"{numbers['bytes']:,} B pushed in {numbers['push_s']} s, " if push else ""
    evidence = cite.cite(
        best.run, (push and ev[leg].pointer(push) or ()) + ev[leg].pointer((line, v)) + best.after.pointer(resume)
    )
    numbers["launcher_read"] = read["detail"]
    return Proof(
        1,
        PASS,
        f"{v['name']}: {size}verified by reading back {v['bytes_read']:,} B; the launcher's own "
        f"read: {numbers['launcher_read']}; leg "
        f"{best.after.leg} (fresh disk) pulled it and resumed at step {best.step} "
        f"({best.run.rung} {best.run.id}; {seen} such resumes in all)",
        numbers,
        evidence,
    )


def proof_6(runs: list[RunData], cite: Evidence, cfg: Config | None = None) -> Proof:
    """Cold resume: each drill kill is followed by a leg on a fresh instance that resumed from
    the newest verified checkpoint, read from the store alone. (`cfg` is unused.)"""
    drills = [r for r in runs if r.rung == "drill"]
    if not drills:
        return Proof(6, MISSING, "no cold-resume drill in the runs reported (run `launcher drill cold-resume`)")
    kills, bad, evidence, early = [], [], [], 0
    for run in drills:
        legs = {leg["leg"]: leg for leg in run.row["legs"]}
        for i, leg in legs.items():
            if not leg["killed"] or i + 1 not in legs:  # a leg killed and relaunched: a cold resume to judge
                continue
            if nothing_to_resume(run, i + 1):  # killed before its first checkpoint verified
                early += 1
                continue
            kill, ok, pointer = _cold_resume(run, legs, i)
            kills.append(kill)
            if not ok:
                bad.append(kill)
            evidence += cite.cite(run, pointer)
    if not kills:
        if early:
            return Proof(
                6,
                MISSING,
                f"{early} kill(s), each before the first checkpoint verified: the next leg rightly started "
                "fresh, and nothing was recovered to prove it (run the drill again, or kill later)",
            )
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


def _cold_resume(run: RunData, legs: dict[int, dict[str, Any]], i: int) -> tuple[dict[str, Any], bool, Any]:
    """(the record of leg i's kill and the next leg's resume, whether it recovered from the store
    alone on a fresh instance, the resume's pointer)."""
    leg, after = legs[i], run.legs[i + 1]
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
    kill = {
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
    return kill, ok, after.pointer(resume)


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
    numbers = _cycle_numbers(run, ev, c, read, sizes, len(candidates))
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
    return _sized(text, p, c["params"], per_param, sizes, numbers, evidence)


def _cycle_numbers(
    run: RunData, ev: LegEvents, c: dict[str, Any], read: dict[str, Any] | None, sizes: Any, seen: int
) -> dict[str, Any]:
    """Proof 7's numbers: one whole storage cycle of one leg, and the launcher's read after it."""
    p, v, d = c["push"][1], c["verify"][1], c["delete"][1]
    per_param = p["bytes"] / c["params"] if c["params"] else None
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
        "cycles_seen": seen,
    }
    return numbers


def _sized(
    text: str, p: dict[str, Any], params: int, per_param: float, sizes: Any, numbers: dict[str, Any], evidence: Any
) -> Proof:
    """Proof 7's last question: was the checkpoint pushed the size of the state it holds (or, where
    the leg did not say, of ~12 B/param of model + optimizer state)?"""
    text += f"; {per_param:.1f} B/param for {params:,} params"
    if sizes:  # what the saved state really holds: SGD 4 B/param of state on top of the weights, Adam 8, ...
        need = sum(int(x) for x in sizes.values())
        opt = sizes.get("optimizer", 0) / params
        text += (
            f"; the saved state holds {need:,} B ({opt:.1f} B/param of optimizer state, "
            f"{sizes.get('model', 0) / params:.1f} of weights)"
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

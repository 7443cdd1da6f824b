"""`launcher report`: the signed preflight report.

Reads the ledger and the legs' host-side logs (never an instance's disk, which
is gone), re-derives each of DESIGN.md's eight proofs from the event lines
(a proof with no number is MISSING, never PASS), writes the plan numbers
(sustained rate, ETA, GPU-hours, the quota arithmetic), plots, and copies of
every log it cites, then signs the folder: sha256 of every file, and one
digest over them all. `launcher report --check DIR` re-verifies a folder.

The signature is tamper evidence, not authorship: anyone who can rerun the
launcher can sign a folder. It answers "was this edited after it was written?".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher import __version__
from launcher.config import Config, GpuSpec
from launcher.errors import BadInput
from launcher.evidence import NO_EVENTS, Check, LegEvents, Pointer, last_line, silent
from launcher.ledger import Ledger
from launcher.measure import (RATE_REL_ERR_MAX, check_cadence, check_memory, cycle_cost, describe_breakdown,
                              memory_trend, step_breakdown, sustained)

PASS, FAIL, MISSING = "PASS", "FAIL", "MISSING"
RUNG_ORDER = ("static", "rehearsal", "smoke", "probe", "run", "drill")
RESUME_RUNGS = ("rehearsal", "smoke", "probe", "run", "drill")
BYTES_PER_PARAM = 12.0
"""Model + AdamW state in fp32: weights 4 + two moments 8 bytes per parameter."""
REPRESENTATIVE_FRACTION = 0.5
"""A checkpoint under half of ~12 B/param was not sized like the real one."""
SIGNATURE = "signature.json"
TITLES = {
    1: "Upload a checkpoint to the store; restart and pull it back",
    2: "Exact data position on resume (sample index + batch hash)",
    3: "Optimizer and LR state restored",
    4: "Loss continuity across the restart, within noise",
    5: "Sustained throughput on the target hardware, and the ETA it implies",
    6: "Cold resume: kill the instance, recover solely from the store",
    7: "The storage cycle at a representative size",
    8: "Two sequential resumes: never backwards, nothing re-read",
}


@dataclass
class Proof:
    number: int
    status: str
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "title": TITLES[self.number], "status": self.status,
                "summary": self.summary, "numbers": self.numbers, "evidence": self.evidence}


@dataclass
class RunData:
    row: dict[str, Any]
    legs: list[LegEvents]
    """The run's timeline: every leg but the straight-through reference."""
    straight: list[LegEvents] = field(default_factory=list)
    """The uninterrupted reference run(s) of a CPU rung (its first is the oracle)."""

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def rung(self) -> str:
        return str(self.row["rung"])

    @property
    def on_gpu(self) -> bool:
        """GPUs were requested AND the legs say they ran on CUDA."""
        if not self.row["gpu_count"]:
            return False
        starts = [ev.first("start") for ev in self.legs]
        return bool(starts) and all(s is not None and str(s[1].get("device", "")).startswith("cuda") for s in starts)

    @property
    def gpus(self) -> str:
        if not self.row["gpu_count"]:
            return "CPU"
        nodes = f" x {self.row['nodes']} nodes" if self.row["nodes"] > 1 else ""
        return f"{self.row['gpu_name']}:{self.row['gpu_count']}{nodes}"


class Evidence:
    """Turns pointers into report-relative citations and remembers which logs to copy."""

    def __init__(self) -> None:
        self.logs: dict[str, Path] = {}

    def cite(self, run: RunData, pointers: tuple[Pointer, ...] | list[Pointer]) -> list[dict[str, Any]]:
        out = []
        for p in pointers:
            rel = f"evidence/{run.id}/leg-{p.leg}.log"
            self.logs[rel] = Path(p.log)
            out.append({"run": run.id, "leg": p.leg, "log": rel, "line": p.line, "text": p.text})
        return out


# --- choosing and loading runs -------------------------------------------------

def select_runs(ledger: Ledger, run_ids: list[str]) -> list[dict[str, Any]]:
    """The named runs, or: the newest run of each rung that ran the newest run's reviewed files."""
    if run_ids:
        rows = []
        for rid in run_ids:
            found = ledger.runs(run_id=rid)
            if not found:
                raise BadInput(f"no run {rid!r} in the ledger (`launcher ledger` lists them)")
            rows.append(found[0])
        return rows
    every = ledger.runs()
    if not every:
        raise BadInput("nothing to report: the ledger has no runs yet (start with `launcher up static`)")
    digest = every[0]["files_digest"]
    newest: dict[tuple[str, bool], dict[str, Any]] = {}
    for row in every:  # newest first; a GPU run is kept beside a newer CPU dress rehearsal of its rung
        if row["files_digest"] == digest and row["ended_at"] is not None:
            newest.setdefault((row["rung"], bool(row["gpu_count"])), row)
    return [newest[(r, g)] for r in RUNG_ORDER for g in (True, False) if (r, g) in newest]


def load_run(row: dict[str, Any]) -> RunData:
    def read(role: str | None) -> list[LegEvents]:
        return [LegEvents.read(leg["leg"], Path(leg["log_path"])) for leg in row["legs"] if leg.get("role") == role]
    return RunData(row, read(None), read("straight"))


# --- resumes: the pairs proofs 1-4 rest on -----------------------------------

@dataclass
class Resume:
    run: RunData
    before: LegEvents
    after: LegEvents
    step: int
    verify: tuple[int, dict[str, Any]] | None  # the verify event of the checkpoint resumed from


@dataclass
class NoResume:
    """A leg that should have resumed from the store and printed no `resume` event."""

    run: RunData
    leg: LegEvents
    exit_code: int | None

    @property
    def reason(self) -> str:
        if silent(self.leg):
            return f"never resumed (exit {self.exit_code}): {NO_EVENTS}"
        return f"never resumed (exit {self.exit_code}; last line of its log: {last_line(self.leg.log)!r})"

    @property
    def detail(self) -> str:
        return f"{self.run.rung} {self.run.id} leg {self.leg.leg} {self.reason}"


def failed_resumes(run: RunData) -> list[NoResume]:
    codes = {leg["leg"]: leg["exit_code"] for leg in run.row["legs"]}
    return [NoResume(run, ev, codes.get(ev.leg)) for ev in run.legs[1:] if ev.first("resume") is None]


def resumes(run: RunData) -> list[Resume]:
    out = []
    for i, ev in enumerate(run.legs):
        resume = ev.first("resume")
        if i == 0 or resume is None:
            continue
        step = int(resume[1]["from_step"])
        before = next((b for b in reversed(run.legs[:i]) if any(e["step"] == step for _, e in b.all("step"))),
                      run.legs[i - 1])
        verify = None
        for b in reversed(run.legs[:i]):
            found = [(n, e) for n, e in b.all("verify") if e.get("ok") and e.get("step") == step]
            if found:
                verify = (b.leg, found[-1])
                break
        out.append(Resume(run, before, ev, step, verify))
    return out


def resume_findings(run: RunData, number: int, exact: bool) -> list[tuple[int, Check]]:
    """(leg, check) for proof `number` over one run, from launcher.resume_checks: the same
    functions, on the same logs, that the rungs and the drill answered with."""
    from launcher.resume_checks import (check_batches, check_loss, check_lr, check_sample_index,
                                        compare_straight, resumed_legs)

    legs, straight = run.legs, (run.straight[0] if run.straight else None)
    found: list[tuple[int, Check]] = []
    if number == 2:
        found = [(legs[i].leg, check_batches(legs, i, straight)) for i in resumed_legs(legs)]
        witness = check_sample_index(legs)
        if witness is not None and found:
            found.append((legs[-1].leg, witness))
    elif number == 3:
        found = [(legs[i].leg, check_lr(legs, i, straight)) for i in resumed_legs(legs)]
    elif number == 4:
        rerun = [i for i in resumed_legs(legs) if any(s in {int(e["step"]) for ev in legs[:i] for _, e in ev.all("step")}
                                                      for s in (int(e["step"]) for _, e in legs[i].all("step")))]
        found = [(legs[i].leg, check_loss(legs, i, exact)) for i in rerun]
        if straight is not None and resumed_legs(legs):
            found.append((legs[-1].leg, compare_straight(legs, straight, exact)))
        elif not rerun:
            found = [(legs[i].leg, check_loss(legs, i, exact)) for i in resumed_legs(legs)]
    return found


def run_exact(run: RunData, cfg: Config) -> bool:
    """A CPU run of a deterministic trainer: comparisons are exact (bit-identical)."""
    fell_back = any(c["name"] == "CPU determinism" for c in run.row.get("checks", []))
    return not run.row["gpu_count"] and cfg.trainer.deterministic and not fell_back


def proof_resume_checks(number: int, runs: list[RunData], cfg: Config, cite: Evidence, never: list[NoResume]) -> Proof:
    """Proofs 2-4: every resume across every run; any failure fails the proof, and so does
    a leg that should have resumed and never did. A check that cannot be answered from
    what the trainer printed (no batch hashes) makes the proof MISSING, never PASS."""
    checks = [(run, leg, c) for run in runs if run.rung in RESUME_RUNGS
              for leg, c in resume_findings(run, number, run_exact(run, cfg))]
    if not checks and not never:
        quiet = [r for r in runs if r.rung in RESUME_RUNGS and r.legs and all(silent(ev) for ev in r.legs)]
        if quiet:
            return Proof(number, MISSING, f"{quiet[0].rung} {quiet[0].id}: {NO_EVENTS}")
        return Proof(number, MISSING, "no leg resumed from the store in the runs reported")
    items = [(run, leg, c) for run, leg, c in checks] + [
        (n.run, n.leg.leg, Check(f"leg {n.leg.leg} resumed", False, n.reason, ())) for n in never]
    failed = [t for t in items if not t[2].ok and not t[2].missing]
    absent = [t for t in items if t[2].missing]
    shown = failed[:3] or absent[:1] or (items[:1] + items[-1:] if len(items) > 1 else items)
    evidence: list[dict[str, Any]] = []
    for run, _, c in shown:
        evidence += cite.cite(run, c.evidence)
    lines = [f"{run.rung} {run.id} leg {leg}: {c.name}: {c.detail}" for run, leg, c in items]
    if failed:
        status, head = FAIL, f"{len(failed)} of {len(items)} checks failed; first: {failed[0][2].name}: {failed[0][2].detail}"
    elif absent:
        status, head = MISSING, f"{absent[0][2].name}: {absent[0][2].detail}"
    else:
        status, head = PASS, (f"all {len(items)} checks across {len({r.id for r, _, _ in items})} runs hold; e.g. "
                              f"{items[-1][2].name}: {items[-1][2].detail}")
    return Proof(number, status, head, {"checks": len(items), "failed": len(failed), "each": lines}, evidence)


def readback_of(run: RunData, leg: int) -> dict[str, Any] | None:
    """The launcher's own read of the store after leg `leg` (a ledger check), if it made one."""
    names = (f"leg {leg}: the launcher read back its checkpoint from the store",
             f"leg {leg}: the store after the kill holds the newest verified checkpoint")
    return next((c for c in run.row.get("checks", []) if c["name"] in names), None)


def _leg_of(p: "Resume | NoResume") -> int:
    return p.after.leg if isinstance(p, Resume) else p.leg.leg


def storage_failures(runs: list[RunData]) -> list[tuple[RunData, dict[str, Any]]]:
    """Ledger checks that say a leg's checkpoint did not reach the store: the launcher's own
    read failed, or a leg the launcher ended (SIGTERM, deadline) did not stop as asked, so
    it pushed no final checkpoint."""
    found = []
    for run in runs:
        for c in run.row.get("checks", []):
            if not c["ok"] and (c["name"].endswith("the launcher read back its checkpoint from the store")
                                or c["name"].endswith(("stopped on sigterm", "stopped on deadline"))):
                found.append((run, c))
    return found


def proof_1(pairs: list[Resume], cite: Evidence, never: list[NoResume], runs: list[RunData] | None = None) -> Proof:
    """Rests on the launcher's own read of the store after the pushing leg, not on its `verify` event."""
    lost = storage_failures(runs or [])
    if lost:
        run, c = lost[0]
        return Proof(1, FAIL, f"{run.rung} {run.id}: {c['name']}: {c['detail']}", {"failed": len(lost)})
    read = {(p.run.id, p.before.leg): readback_of(p.run, p.before.leg) for p in pairs}
    bad = [p for p in pairs if read[(p.run.id, p.before.leg)] is not None and not read[(p.run.id, p.before.leg)]["ok"]]
    if bad:
        b = bad[0]
        return Proof(1, FAIL, f"{b.run.rung} {b.run.id}: the launcher's read of the store after leg {b.before.leg} "
                     f"failed: {read[(b.run.id, b.before.leg)]['detail']}", {"failed": len(bad)})
    usable = [p for p in pairs if p.verify is not None and read[(p.run.id, p.before.leg)] is not None]
    if never:
        n = never[0]
        return Proof(1, FAIL, f"{len(never)} leg(s) did not pull a checkpoint back; {n.detail}"
                     + (f"; {len(usable)} other resumes did" if usable else ""),
                     {"failed": [x.detail for x in never], "resumes_seen": len(usable)},
                     cite.cite(n.run, n.leg.pointer(n.leg.first("start"))))
    if not usable:
        return Proof(1, MISSING, "no resume from a checkpoint a previous leg pushed and the launcher read back "
                     "from the store itself")
    best = max(usable, key=lambda p: (p.run.on_gpu, RESUME_RUNGS.index(p.run.rung) if p.run.rung in RESUME_RUNGS
                                      else -1, p.after.leg))
    leg, (line, v) = best.verify  # type: ignore[misc]
    ev = {e.leg: e for e in best.run.legs}
    push = next(((n, e) for n, e in ev[leg].all("push") if e.get("step") == best.step), None)
    resume = best.after.first("resume")
    numbers = {"run": best.run.id, "checkpoint": v["name"], "step": best.step, "pushed_by_leg": leg,
               "bytes": push[1]["bytes"] if push else None, "push_s": push[1]["seconds"] if push else None,
               "verify_bytes_read": v["bytes_read"], "resumed_by_leg": best.after.leg,
               "store": best.run.row["store_uri"], "resumes_seen": len(usable)}
    size = f"{numbers['bytes']:,} B pushed in {numbers['push_s']} s, " if push else ""
    evidence = cite.cite(best.run, (push and ev[leg].pointer(push) or ()) + ev[leg].pointer((line, v)) +
                         best.after.pointer(resume))
    numbers["launcher_read"] = read[(best.run.id, best.before.leg)]["detail"]
    return Proof(1, PASS, f"{v['name']}: {size}verified by reading back {v['bytes_read']:,} B; the launcher's own "
                 f"read: {numbers['launcher_read']}; leg "
                 f"{best.after.leg} (fresh disk) pulled it and resumed at step {best.step} "
                 f"({best.run.rung} {best.run.id}; {len(usable)} such resumes in all)", numbers, evidence)


def proof_6(runs: list[RunData], cite: Evidence) -> Proof:
    drills = [r for r in runs if r.rung == "drill"]
    if not drills:
        return Proof(6, MISSING, "no cold-resume drill in the runs reported (run `launcher drill cold-resume`)")
    kills, bad, evidence = [], [], []
    for run in drills:
        legs = {leg["leg"]: leg for leg in run.row["legs"]}
        ledger_checks = {c["name"]: c for c in run.row["checks"]}
        for i, leg in legs.items():
            if not (leg["killed"] and str(leg.get("end_reason") or "").startswith("drill kill")) or i + 1 not in legs:
                continue
            after = run.legs[i + 1]
            resume = after.first("resume")
            logged = [int(e["step"]) for ev in run.legs[:i + 1] for _, e in ev.all("verify") if e.get("ok")]
            newest_logged = max(logged) if logged else None
            store_check = ledger_checks.get(f"leg {i + 1} resumed from the newest verified checkpoint")
            got = int(resume[1]["from_step"]) if resume else None
            fresh = legs[i + 1]["instance"] != leg["instance"]
            read = readback_of(run, i)
            ok = (resume is not None and fresh and store_check is not None and store_check["ok"]
                  and read is not None and read["ok"] and (newest_logged is None or got >= newest_logged))
            kills.append({"run": run.id, "killed_leg": i, "how": leg["end_reason"], "resumed_at": got,
                          "next_leg_exit": legs[i + 1]["exit_code"],
                          "newest_verified_in_logs": newest_logged, "fresh_instance": fresh,
                          # the drill read the store after the kill; its check says what it found
                          "store_read_at_kill": store_check["detail"].split("; ", 1)[-1] if store_check else None,
                          "launcher_read": read["detail"] if read else "the launcher did not read the store back"})
            if not ok:
                bad.append(kills[-1])
            evidence += cite.cite(run, after.pointer(resume))
    if not kills:
        return Proof(6, MISSING, "the drill runs reported killed no leg")
    status = FAIL if bad else PASS
    k = kills[-1]
    summary = (f"{len(kills) - len(bad)} of {len(kills)} kills recovered solely from the store on a fresh instance; "
               f"e.g. leg {k['killed_leg']} {k['how']}: the next leg (exit {k['next_leg_exit']}) resumed at step "
               f"{k['resumed_at']} "
               f"(newest verified in the logs: {k['newest_verified_in_logs']}; {k['store_read_at_kill']})")
    return Proof(6, status, summary, {"kills": kills, "failed": len(bad)}, evidence[-4:])


def storage_cycles(ev: LegEvents) -> list[dict[str, Any]]:
    """push -> verify ok -> delete_local (free space read) -> a later step, all in one leg."""
    steps = [e["step"] for _, e in ev.all("step")]
    start = ev.first("start")
    params = int(start[1].get("params") or 0) if start else 0
    found = []
    for item in ev.all("push"):
        s = item[1]["step"]
        verify = next(((n, e) for n, e in ev.all("verify") if e.get("step") == s and e.get("ok") and n > item[0]), None)
        delete = next(((n, e) for n, e in ev.all("delete_local") if e.get("step") == s and verify and n > verify[0]),
                      None)
        later = next((x for x in steps if x > s), None)
        if verify and delete and later is not None and delete[1].get("free_bytes") is not None:
            found.append({"push": item, "verify": verify, "delete": delete, "later_step": later, "params": params})
    return found


def proof_7(runs: list[RunData], cite: Evidence) -> Proof:
    candidates = [(run, ev, c) for run in runs for ev in run.legs for c in storage_cycles(ev)]
    if not candidates:
        return Proof(7, MISSING, "no leg shows a whole cycle: push, verify by reading back, delete locally, "
                     "free space read, and training on")
    run, ev, c = max(candidates, key=lambda t: (t[0].on_gpu, t[2]["push"][1]["bytes"]))
    p, v, d = c["push"][1], c["verify"][1], c["delete"][1]
    per_param = p["bytes"] / c["params"] if c["params"] else None
    read = readback_of(run, ev.leg)
    save = next((e for _, e in ev.all("save") if e.get("step") == p["step"]), None)
    sizes = save.get("state_bytes") if save and isinstance(save.get("state_bytes"), dict) else None
    numbers = {"run": run.id, "leg": ev.leg, "checkpoint": p["name"], "bytes": p["bytes"], "push_s": p["seconds"],
               "verify_windows": v["windows"], "verify_bytes_read": v["bytes_read"], "verify_s": v["seconds"],
               "bytes_freed": d["bytes_freed"], "free_bytes_after": d["free_bytes"], "trained_on_to": c["later_step"],
               "params": c["params"], "bytes_per_param": round(per_param, 2) if per_param else None,
               "state_bytes": sizes, "launcher_read": read["detail"] if read else None,
               "cycles_seen": len(candidates)}
    evidence = cite.cite(run, ev.pointer(c["push"]) + ev.pointer(c["verify"]) + ev.pointer(c["delete"]))
    text = (f"{p['name']} ({run.rung} leg {ev.leg}): {p['bytes']:,} B pushed in {p['seconds']} s; verified "
            f"{v['bytes_read']:,} B in {v['windows']} windows in {v['seconds']} s; deleted locally "
            f"({d['bytes_freed']:,} B freed, {d['free_bytes'] / 1e9:,.1f} GB free); trained on to step {c['later_step']}")
    if read is None or not read["ok"]:
        return Proof(7, FAIL if read else MISSING, text + "; the launcher's own read of the store after leg "
                     f"{ev.leg}: " + (read["detail"] if read else "none was made"), numbers, evidence)
    text += f"; the launcher read it back: {read['detail']}"
    if per_param is None:
        return Proof(7, FAIL, text + "; the leg did not say its parameter count: size unknown", numbers, evidence)
    text += f"; {per_param:.1f} B/param for {c['params']:,} params"
    if sizes:  # what the saved state really holds: SGD 4 B/param of state on top of the weights, Adam 8, ...
        need = sum(int(x) for x in sizes.values())
        opt = sizes.get("optimizer", 0) / c["params"]
        text += (f"; the saved state holds {need:,} B ({opt:.1f} B/param of optimizer state, "
                 f"{sizes.get('model', 0) / c['params']:.1f} of weights)")
        if p["bytes"] < 0.9 * need:
            return Proof(7, FAIL, text + " — the checkpoint pushed is smaller than the state it claims to hold",
                         numbers, evidence)
        return Proof(7, PASS, text, numbers, evidence)
    if per_param < REPRESENTATIVE_FRACTION * BYTES_PER_PARAM:
        return Proof(7, FAIL, text + f" — much smaller than the ~{BYTES_PER_PARAM:.0f} B/param of model + optimizer "
                     "state, and the leg did not say what its saved state holds", numbers, evidence)
    return Proof(7, PASS, text, numbers, evidence)


def proof_8(runs: list[RunData], cite: Evidence, cfg: Config) -> Proof:
    """Two sequential resumes on one run: the batch hashes on the surviving timeline never
    repeat, and (CPU) the whole timeline equals the straight-through run."""
    from launcher.resume_checks import check_no_repeat, compare_straight

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
    return Proof(8, status, f"{run.rung} {run.id}: {n} sequential resumes; {detail}",
                 {"run": run.id, "resumes": n, "detail": detail}, evidence)


# --- throughput, ETA and the plan -------------------------------------------------

def rate_leg(runs: list[RunData], gpu: bool) -> tuple[RunData, LegEvents, dict[str, Any]] | None:
    """The longest measured leg (most steps) on the GPU (or, gpu=False, anywhere)."""
    found = []
    for run in runs:
        if gpu and not run.on_gpu:
            continue
        for ev in run.legs:
            s = sustained(ev)
            if s is not None:
                found.append((len(ev.all("step")), run.on_gpu, run, ev, s))
    if not found:
        return None
    _, _, run, ev, s = max(found, key=lambda t: (t[1], t[0]))
    return run, ev, s


def proof_5(runs: list[RunData], cfg: Config, cite: Evidence) -> Proof:
    measured = rate_leg(runs, gpu=True)
    if measured is None:
        cpu = rate_leg(runs, gpu=False)
        note = (f"; the CPU legs measured {cpu[2]['tok_s']:,.0f} tok/s ({cpu[0].rung} leg {cpu[1].leg}), which "
                "says nothing about the target GPU" if cpu else "")
        return Proof(5, MISSING, "no GPU rung ran: no rate on the target hardware (run `launcher up probe "
                     "--gpus ...`)" + note)
    run, ev, s = measured
    run_steps = cfg.rungs.run.steps
    tps = s["tokens_per_step"]
    eta = run_steps * tps / s["tok_s"] if tps else None
    numbers = {"run": run.id, "leg": ev.leg, "gpus": run.gpus, "tok_s": s["tok_s"], "rel_err": s["rel_err"],
               "window": [s["window_first"], s["window_last"]], "window_steps": s["window_steps"],
               "window_s": s["seconds"], "tokens_per_step": tps, "run_steps": run_steps, "eta_s": eta}
    evidence = cite.cite(run, s["evidence"])
    rel = s["rel_err"]
    text = (f"{s['tok_s']:,.1f} tok/s on {run.gpus} ({run.rung} leg {ev.leg}, steps {s['window_first']}.."
            f"{s['window_last']}, {s['seconds']:.0f} s, warm-up excluded), standard error "
            + ("unknown" if rel is None else f"+-{100 * rel:.2f} %")
            + (f"; ETA for the run's {run_steps:,} steps: {run_steps:,} x {tps:,} tokens / {s['tok_s']:,.1f} tok/s = "
               f"{eta / 3600:,.1f} h" if eta else ""))
    if rel is None or rel > RATE_REL_ERR_MAX:
        return Proof(5, FAIL, text + f" — not a sustained rate (needs a standard error <= "
                     f"{100 * RATE_REL_ERR_MAX:.0f} %; measure a longer leg)", numbers, evidence)
    return Proof(5, PASS, text, numbers, evidence)


def plan(cfg: Config, ledger: Ledger, runs: list[RunData], proofs: dict[int, Proof], cite: Evidence) -> dict[str, Any]:
    """The plan numbers: rate, ETA, GPU-hours and cost, quota, memory, checkpoint cadence."""
    from launcher.spend import summary

    p5 = proofs[5]
    out: dict[str, Any] = {"run_steps": cfg.rungs.run.steps}
    measured = rate_leg(runs, gpu=True)
    gpus = None
    if measured and p5.numbers.get("eta_s"):
        run = measured[0]
        gpus = GpuSpec(run.row["gpu_name"], int(run.row["gpu_count"]))
        nodes = int(run.row["nodes"])
        gpu_n = gpus.count * nodes
        hours = p5.numbers["eta_s"] / 3600.0
        gpu_hours = hours * gpu_n
        price = cfg.prices.get(gpus.name)
        out.update({"rate_source": "target", "rate_status": p5.status, "tok_s": p5.numbers["tok_s"], "eta_hours": hours, "gpus": run.gpus,
                    "gpu_hours": gpu_hours, "usd": None if price is None else gpu_hours * price,
                    "price_per_gpu_hour": price,
                    "run_leg_budget_hours": cfg.rungs.run.budget_minutes / 60.0,
                    "legs_needed": max(1, -int(-hours // (cfg.rungs.run.budget_minutes / 60.0)))})
    spend = summary(cfg, ledger, gpus)
    out["quota"] = {k: spend[k] for k in ("period", "period_from", "quota_gpu_hours", "used_gpu_hours",
                                          "reserved_gpu_hours", "remaining_gpu_hours", "budget_usd", "used_usd")}
    if "gpu_hours" in out:
        remaining = spend["remaining_gpu_hours"]
        out["fits"] = remaining is None or out["gpu_hours"] <= remaining
    actuals = [run_actuals(r) for r in runs if r.rung == "run" and r.row["ended_at"] is not None]
    if actuals:
        out["actuals"] = actuals
    # memory and checkpoint cost: the target's leg if any, else the longest leg measured (labelled)
    leg = measured or rate_leg(runs, gpu=False)
    if leg:
        run, ev, _ = leg
        m = memory_trend(ev)
        if m:
            check = check_memory(ev, cfg.rungs.run.steps)
            out["memory"] = {k: v for k, v in m.items() if k not in ("evidence", "series")}
            out["memory"].update({"run": run.id, "leg": ev.leg, "on": run.gpus, "verdict": check.detail,
                                  "evidence": cite.cite(run, m["evidence"])})
        b = step_breakdown(ev)
        if b:
            out["breakdown"] = {"run": run.id, "leg": ev.leg, "on": run.gpus, "summary": describe_breakdown(b),
                                "largest": b["largest"], "shares": b["shares"],
                                "evidence": cite.cite(run, b["evidence"])}
        c = cycle_cost(ev)
        if c:
            check = check_cadence(ev)
            out["checkpoint"] = {k: v for k, v in c.items() if k != "evidence"}
            out["checkpoint"].update({"run": run.id, "leg": ev.leg, "on": run.gpus, "ok": check.ok,
                                      "verdict": check.detail, "evidence": cite.cite(run, c["evidence"])})
        eff = efficiency_plan(cfg, run, ev, p5 if measured else None, cite, c)
        if eff:
            out["efficiency"] = eff
    return out


def efficiency_plan(cfg: Config, run: RunData, ev: LegEvents, p5: Proof | None, cite: Evidence,
                    checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """MFU, GPU idle and why, and the run's ETA/GPU-hours at the measured and a reachable MFU."""
    from launcher.efficiency import describe, describe_idle, efficiency, idle_breakdown, levers, what_if

    gpu_n = (int(run.row["gpu_count"] or 0) * int(run.row["nodes"] or 1)) if run.on_gpu else 0
    e = efficiency(ev, run.row["gpu_name"] if run.on_gpu else None, gpu_n)
    if e is None:
        return None
    out: dict[str, Any] = {"run": run.id, "leg": ev.leg, "on": run.gpus, "summary": describe(e),
                           **{k: e.get(k) for k in ("flops_per_token", "formula_flops_per_token", "flop_s", "mfu",
                                                     "mfu_note", "dtype", "gpu", "peak_flop_s", "compiled")},
                           "evidence": cite.cite(run, e["evidence"])}
    idle = idle_breakdown(ev)
    if idle:
        out["idle"] = {"share": idle["idle"], "causes": idle["causes"], "summary": describe_idle(idle)}
    rate = sustained(ev)
    tps = rate["tokens_per_step"] if rate else None
    if p5 is not None and tps and gpu_n:
        out["what_if"] = what_if(e, cfg.rungs.run.steps, tps, p5.numbers["eta_s"] / 3600.0, gpu_n)
    out["levers"] = levers(e, ev, checkpoint)
    return out


def run_actuals(run: RunData) -> dict[str, Any]:
    """A finished run beside its plan (the report that let it launch, as the ledger recorded it)."""
    from launcher.watch import rate_now

    row = run.row
    steps = [int(e["step"]) for ev in run.legs for _, e in ev.all("step")]
    rate = rate_now(run.legs)
    gate = row.get("preflight") or {}
    plan = gate.get("plan") or {}
    hours = (row["ended_at"] - row["started_at"]) / 3600.0
    out = {"run": run.id, "gpus": run.gpus, "verdict": row["verdict"], "legs": len(row["legs"]),
           "restarts": max(0, len(row["legs"]) - 1), "last_step": max(steps, default=0),
           "wall_hours": hours, "billed_gpu_hours": row["billed_gpu_hours"], "usd": row["cost_usd"],
           "tok_s": rate["tok_s"] if rate else None,
           "preflight": {"gate": gate.get("gate"), "reason": gate.get("reason"), "report": gate.get("report")},
           "plan": {k: plan.get(k) for k in ("tok_s", "eta_hours", "gpu_hours", "usd")}}
    return out


# --- building the folder ----------------------------------------------------------

def derive(cfg: Config, runs: list[RunData], cite: Evidence) -> dict[int, Proof]:
    """The eight proofs, from the runs' ledger rows and leg logs alone."""
    pairs = [p for run in runs if run.rung in RESUME_RUNGS for p in resumes(run)]
    never = [n for run in runs if run.rung in RESUME_RUNGS for n in failed_resumes(run)]
    return {
        1: proof_1(pairs, cite, never, runs),
        2: proof_resume_checks(2, runs, cfg, cite, never),
        3: proof_resume_checks(3, runs, cfg, cite, never),
        4: proof_resume_checks(4, runs, cfg, cite, never),
        5: proof_5(runs, cfg, cite),
        6: proof_6(runs, cite),
        7: proof_7(runs, cite),
        8: proof_8(runs, cite, cfg),
    }


def build(cfg: Config, run_ids: list[str], out_dir: Path | None) -> tuple[Path, dict[str, Any]]:
    """Write the report folder (atomically: a temp dir renamed into place); returns (path, json)."""
    if out_dir is not None:
        check_out_dir(out_dir)
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    if ledger is None:
        raise BadInput(f"no ledger at {cfg.state_path / 'ledger.db'}: nothing has run yet")
    try:
        from launcher.reconcile import end_dead_runs

        end_dead_runs(ledger)
        rows = select_runs(ledger, run_ids)
        runs = [load_run(r) for r in rows]
        cite = Evidence()
        proofs = derive(cfg, runs, cite)
        numbers = plan(cfg, ledger, runs, proofs, cite)
        images = {r.id: r.row.get("image") for r in runs if r.row.get("image")}
        report = {
            "project": cfg.project, "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "launcher_version": __version__,
            "runs": [{"id": r.id, "rung": r.rung, "backend": r.row["backend"], "gpus": r.gpus, "on_gpu": r.on_gpu,
                      "verdict": r.row["verdict"], "exit_code": r.row["exit_code"],
                      "billed_gpu_hours": r.row["billed_gpu_hours"], "cost_usd": r.row["cost_usd"],
                      "image": r.row.get("image"), "files_digest": r.row["files_digest"],
                      "config_sha256": r.row["config_sha256"],
                      "legs": [{"leg": leg["leg"], "instance": leg["instance"], "exit_code": leg["exit_code"],
                                "killed": leg["killed"], "end_reason": leg["end_reason"],
                                "task_sha256": leg.get("task_sha256"),
                                "log": f"evidence/{r.id}/leg-{leg['leg']}.log"} for leg in r.row["legs"]]}
                     for r in runs],
            "reviewed_files": rows[0]["files"],
            "images": images,
            "task_yaml_sha256": sorted({leg["task_sha256"] for r in rows for leg in r["legs"] if leg.get("task_sha256")}),
            "proofs": [proofs[n].to_json() for n in sorted(proofs)],
            "damaged_lines": [dict(d, run=r.id) for r in runs for ev in r.legs for d in ev.damaged()],
            "plan": numbers,
        }
        return _write(report, runs, cite, out_dir or _default_dir(cfg)), report
    finally:
        ledger.close()


def _default_dir(cfg: Config) -> Path:
    return cfg.state_path / "reports" / f"preflight-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def check_out_dir(out: Path) -> None:
    """--out must be an empty folder or not exist yet: refused before any work is done."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BadInput(f"--out {out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        raise BadInput(f"--out {out}: exists and is not empty (a report folder is written once)")


def _write(report: dict[str, Any], runs: list[RunData], cite: Evidence, out: Path) -> Path:
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".report-", dir=out.parent))
    try:
        for run in runs:  # every leg log of every run reported: the whole record, not only cited lines
            for ev in run.legs:
                cite.logs.setdefault(f"evidence/{run.id}/leg-{ev.leg}.log", ev.log)
        for rel, src in sorted(cite.logs.items()):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_file():
                shutil.copyfile(src, dst)
        (tmp / "evidence" / "ledger.json").parent.mkdir(parents=True, exist_ok=True)
        (tmp / "evidence" / "ledger.json").write_text(json.dumps([r.row for r in runs], indent=1, default=str) + "\n")
        from launcher.report_plots import draw_all

        report["plots"] = draw_all(runs, report, tmp)
        (tmp / "preflight.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        from launcher.report_md import render

        (tmp / "preflight.md").write_text(render(report))
        sign(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --- signature ----------------------------------------------------------------------

def _hash_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != SIGNATURE}


def _digest(files: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items())).encode()).hexdigest()


def sign(folder: Path) -> str:
    files = _hash_tree(folder)
    digest = _digest(files)
    (folder / SIGNATURE).write_text(json.dumps(
        {"algorithm": "sha256", "digest": digest, "files": files,
         "how": "digest = sha256 of the lines '<sha256>  <path>\\n' of every file but this one, sorted by path"},
        indent=1, sort_keys=True) + "\n")
    return digest


def check(folder: Path) -> list[str]:
    """What differs from the signature ([] = intact). Bad input (exit 2) if it is no report."""
    sig_path = folder / SIGNATURE
    if not folder.is_dir() or not sig_path.is_file():
        raise BadInput(f"{folder}: no {SIGNATURE} here: not a report folder")
    try:
        sig = json.loads(sig_path.read_text())
        signed: dict[str, str] = sig["files"]
        digest = sig["digest"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{SIGNATURE} is unreadable ({err.__class__.__name__}): edited"]
    now = _hash_tree(folder)
    problems = [f"edited: {rel}" for rel in sorted(signed) if rel in now and now[rel] != signed[rel]]
    problems += [f"missing: {rel}" for rel in sorted(set(signed) - set(now))]
    problems += [f"added: {rel}" for rel in sorted(set(now) - set(signed))]
    if _digest(signed) != digest:
        problems.append(f"{SIGNATURE}: the file list does not match its digest")
    return problems

"""The records the report works on: a run as the ledger and its legs' logs tell it,
the resumes found in them, the citations into those logs, and a proof's verdict.

Everything here reads; nothing decides whether a proof holds (that is `proofs_*`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.checks.evidence import NO_EVENTS, Kind, LegEvents, Pointer, find, last_line, silent
from launcher.checks.measure import sustained
from launcher.config.schema import Config
from launcher.errors import BadInput
from launcher.ladder import resume_rungs, rung_order
from launcher.ledger.db import Ledger

PASS, FAIL, MISSING = "PASS", "FAIL", "MISSING"
RUNG_ORDER = rung_order()
RESUME_RUNGS = resume_rungs()  # ladder order, then the drill: how proof 1 ranks its evidence


@dataclass
class Proof:
    """One proof's verdict: PASS, FAIL or MISSING, the numbers it rests on, and citations."""

    number: int
    status: str
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self, title: str) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": title,
            "status": self.status,
            "summary": self.summary,
            "numbers": self.numbers,
            "evidence": self.evidence,
        }


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
    newest: dict[tuple[str, bool, str], dict[str, Any]] = {}
    for row in every:  # newest first; a GPU run is kept beside a newer CPU dress rehearsal of its rung,
        # and a `drill preempt` or `drill hang` beside the kill drill (its question is not the kills)
        if row["files_digest"] == digest and row["ended_at"] is not None:
            newest.setdefault((row["rung"], bool(row["gpu_count"]), drill_question(row)), row)
    return [newest[k] for r in RUNG_ORDER for g in (True, False) for q in QUESTIONS if (k := (r, g, q)) in newest]


QUESTIONS = ("kills", "preempt", "hang")


def drill_question(row: dict[str, Any]) -> str:
    """What a drill asked: its kills (cold-resume), a notice (preempt) or a hung rank (hang)."""
    checks = row.get("checks", [])
    return "preempt" if find(checks, Kind.PREEMPT_NOTICE) else "hang" if find(checks, Kind.HANG_FOUND) else "kills"


def load_run(row: dict[str, Any]) -> RunData:
    def read(role: str | None) -> list[LegEvents]:
        return [LegEvents.read(leg["leg"], Path(leg["log_path"])) for leg in row["legs"] if leg.get("role") == role]

    return RunData(row, read(None), read("straight") or reused_oracle(row))


def reused_oracle(row: dict[str, Any]) -> list[LegEvents]:
    """A drill judged against an earlier run's straight-through leg (launcher.rungs.oracle): that
    leg's events, read as the drill read them (its check's leg and log); [] for any other run."""
    for c in find(row.get("checks", []), Kind.STRAIGHT_FINISHED):
        facts = c.get("facts") or {}
        if "reused_run" in facts and "disagreed" not in facts and isinstance(c.get("leg"), int):
            return [LegEvents.read(c["leg"], Path(str(facts.get("log"))))]
    return []


def run_exact(run: RunData, cfg: Config) -> bool:
    """Comparisons are exact (bit-identical): a CPU run of a deterministic trainer, or a GPU run
    whose legs' deterministic mode held (launcher.checks.determinism.check_determinism said so)."""
    checks = run.row.get("checks", [])
    on_cpu = not run.row["gpu_count"] and not find(checks, Kind.CPU_DETERMINISM)
    return cfg.trainer.deterministic and (on_cpu or (bool(run.row["gpu_count"]) and bool(find(checks, Kind.GPU_EXACT))))


def readback_of(run: RunData, leg: int) -> dict[str, Any] | None:
    """The launcher's own read of the store after leg `leg` (a ledger check), if it made one."""
    checks = run.row.get("checks", [])
    return next(iter(find(checks, Kind.READBACK, leg=leg) + find(checks, Kind.STORE_AFTER_KILL, leg=leg)), None)


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
    return [
        NoResume(run, ev, codes.get(ev.leg))
        for ev in run.legs[1:]
        if ev.first("resume") is None and not nothing_to_resume(run, ev.leg)
    ]


def nothing_to_resume(run: RunData, leg: int) -> bool:
    """The launcher read the store before leg `leg` and found no verified checkpoint there, and
    the leg rightly started fresh: no resume to judge, neither a failure nor a proof (a kill
    that came before the first checkpoint verified; under load, a slow push). From the rung's
    own check (RESUMED_NEWEST: expected and resumed_at both None)."""
    for c in find(run.row.get("checks", []), Kind.RESUMED_NEWEST, leg=leg, ok=True):
        facts = c.get("facts") or {}
        if "expected" in facts and facts["expected"] is None and facts.get("resumed_at") is None:
            return True
    return False


def resumes(run: RunData) -> list[Resume]:
    out = []
    for i, ev in enumerate(run.legs):
        resume = ev.first("resume")
        if i == 0 or resume is None:
            continue
        step = int(resume[1]["from_step"])
        before = next(
            (b for b in reversed(run.legs[:i]) if any(e["step"] == step for _, e in b.all("step"))), run.legs[i - 1]
        )
        verify = None
        for b in reversed(run.legs[:i]):
            found = [(n, e) for n, e in b.all("verify") if e.get("ok") and e.get("step") == step]
            if found:
                verify = (b.leg, found[-1])
                break
        out.append(Resume(run, before, ev, step, verify))
    return out


def all_resumes(runs: list[RunData]) -> list[Resume]:
    """Every resume in the runs of the rungs that resume."""
    return [p for run in runs if run.rung in RESUME_RUNGS for p in resumes(run)]


def never_resumed(runs: list[RunData]) -> list[NoResume]:
    """Every leg of a resuming rung that should have resumed and did not."""
    return [n for run in runs if run.rung in RESUME_RUNGS for n in failed_resumes(run)]


def crashed_legs(run: RunData) -> list[str]:
    """The legs of a run that exited non-zero outside a planned kill, each said in a line. A
    leg the rung itself judged finished (a torchrun leg exits 1 after the SIGTERM the launcher
    sent, its every rank having printed a verified `done`) is not one."""
    if run.rung not in RESUME_RUNGS and run.rung not in ("probe", "run"):
        return []
    finished = {c["leg"] for c in find(run.row.get("checks", []), Kind.LEG_FINISHED, ok=True)}
    out = []
    for leg in run.row["legs"]:
        code, n = leg.get("exit_code"), leg["leg"]
        if code in (0, None) or leg.get("killed") or n in finished:
            continue
        what = "the straight-through run" if leg.get("role") == "straight" else f"leg {n}"
        out.append(f"{run.rung} {run.id} {what} exited {code} ({leg.get('end_reason')})")
    return out

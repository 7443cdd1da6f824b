"""Checks with evidence: every claim points at an event line (leg + line number).

The host reads the legs' host-side logs (never the instance's disk, which is
gone) through the same parser the runtime's printer defines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from runtime.contract import exit_code_of
from runtime.events import DAMAGED, LOG, iter_events


@dataclass(frozen=True)
class Pointer:
    """Where a claim's evidence is: leg, log file, 1-based line, the line itself."""

    leg: int
    log: str
    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"leg": self.leg, "log": self.log, "line": self.line, "text": self.text}


class Kind(StrEnum):
    """What a check is: a stable id every check carries, which its readers (the report, the
    gate, status, a user's script over `--json`) match instead of its wording, which is free
    to change. Grouped by the module that makes them; `leg` and `facts` say where the check
    uses them. A new check needs a member (tests/unit/test_layout.py holds every `Check(` call in
    `launcher/` to a `kind=`, and every member to a check made with it)."""

    # launcher/checks/readback.py
    READBACK = "readback"
    """The launcher read back the checkpoint a leg's events call verified (`leg` set)."""
    # launcher/rungs/drill.py
    STORE_AFTER_KILL = "store_after_kill"
    """The store after a drill's kill or SIGTERM holds the newest verified checkpoint, read back (`leg`)."""
    RESUMED_NEWEST = "resumed_newest"
    """A leg resumed from the newest verified checkpoint the launcher read in the store before it
    (`leg`; facts: resumed_at, expected, and in a drill the state it trained from)."""
    KILL_MOMENT = "kill_moment"
    """A drill's leg reached the moment planned for its kill (`leg`)."""
    KILLS_FIT = "kills_fit"
    """The drill's planned kills fit between its first storage cycle and its last step."""
    KILLED = "killed"
    """A drill killed a leg at its moment (`leg`; facts: moment, expected)."""
    SIGTERM_FINAL = "sigterm_final"
    """A leg stopped by SIGTERM left its final checkpoint as the store's newest verified (`leg`)."""
    NOTHING_LEFT = "nothing_left"
    """No process of a killed leg outlived the kill (`leg`)."""
    # launcher/rungs/drill_preempt.py
    PREEMPT_NOTICE = "preempt_notice"
    """A preempted leg's final checkpoint verified inside its notice (`leg`; facts: the timeline)."""
    WORK_LOST = "work_lost"
    """The steps and seconds a preemption or a hang lost (`leg`; facts: steps, seconds, resumed_at)."""
    # launcher/checks/stragglers.py
    STRAGGLER = "straggler"
    """A statement: the rank whose own work the others wait for every step, or none (`leg`; facts:
    rank, own_s, others_s, excess_s, step_s)."""
    # launcher/checks/hours.py
    HOURS = "hours"
    """A run's billed time split into productive steps and each loss, summing to the bill (facts: goodput, off)."""
    # launcher/rungs/drill_hang.py
    HANG_FOUND = "hang_found"
    """The watchdog called the drill's stopped rank hung, with stacks (`leg`; facts: detected_s,
    p99_step_s, times_p99, limit_s, stacks)."""
    # launcher/rungs/resume_legs.py, launcher/rungs/run.py, launcher/checks/leg.py, launcher/up.py
    STOPPED_AS_ASKED = "stopped_as_asked"
    """A leg the launcher ended by SIGTERM or its deadline stopped on it (`leg`; facts: want, got)."""
    LEG_FINISHED = "leg_finished"
    """A leg ended on its own, every rank's `done` printed (`leg`)."""
    ON_ACCELERATOR = "on_accelerator"
    """A GPU rung's leg ran on CUDA (`leg`)."""
    RUN_LENGTH = "run_length"
    """The run's last leg finished at exactly the run's step count."""
    STRAIGHT_FINISHED = "straight_finished"
    """The straight-through reference leg (the oracle, no restart) finished (`leg`)."""
    CPU_DETERMINISM = "cpu_determinism"
    """Two straight-through runs of a CPU rung disagreed: the trainer does not reproduce itself."""
    LEG_ENDED = "leg_ended"
    """A leg of the run rung ended, and what the store held after it (`leg`)."""
    PROGRESS = "progress"
    """The run makes progress: no crash loop of legs leaving no newer verified checkpoint."""
    QUOTA_LEG = "quota_leg"
    """The quota allowed the run another leg."""
    LEG_CAP = "leg_cap"
    """The run ended within its cap on legs."""
    RECOVERIES = "recoveries"
    """Every recovery SkyPilot's managed job made became a leg in the ledger."""
    RAN_TO_END = "ran_to_end"
    """The rung ran to its end (a stop by the user or the launcher's own deadline says why not)."""
    # launcher/rungs/static.py
    HASHES = "hashes"
    """The files hash as the review recorded them."""
    COMMAND_LINE = "command_line"
    """The command line the legs run, recorded."""
    TRAINER_STATIC = "trainer_static"
    """A check the trainer's static check (runtime/programs/static_check.py) reported in its interpreter."""
    IMPORT_PARSE = "import_parse"
    """The static check itself ran and answered."""
    # launcher/checks/resume.py
    TIMELINE = "timeline"
    """The resumed timeline's steps match the straight-through run (loss, and the compared fields)."""
    REPEATABLE = "repeatable"
    """Two straight-through runs agree at every step."""
    DATA_POSITION = "data_position"
    """A resumed leg read the batches the straight-through run read at its steps (`leg`)."""
    NO_REPEAT = "no_repeat"
    """No batch was read twice across the surviving timeline."""
    RANK_DATA = "rank_data"
    """On several ranks: every rank resumed its own data position and no batch was read by two
    ranks or twice (facts: ranks, and the rank that failed)."""
    # launcher/checks/ranks.py
    RANK_SAMPLES = "rank_samples"
    """On several ranks: each rank's samples (row digests, else batch hashes) on the surviving timeline
    against the same rank's in the straight-through run: seen twice, never seen, out of order, and two
    ranks training one sample in a step (facts: ranks, unit, per_rank, across; rank, step, leg of the
    first difference)."""
    RANK_STATE = "rank_state"
    """On several ranks: each rank's RNG at its first resumed step and its optimizer steps since the
    resume against the same rank's in the straight-through run (`leg`; facts: rank, other)."""
    SAMPLE_INDEX = "sample_index"
    """The trainer's own sample index continues across the resumes."""
    LR = "lr"
    """A resumed leg ran with the schedule's LR (`leg`)."""
    LOSS_CONTINUITY = "loss_continuity"
    """The loss continues across a restart, exactly or within the band (`leg`)."""
    PUSHED = "pushed"
    """A leg pushed a checkpoint that verified (`leg`; facts: step)."""
    RESUMED = "resumed"
    """A leg resumed from the store rather than from scratch (`leg`)."""
    # launcher/checks/state.py
    FED_BATCH = "fed_batch"
    """The batch given to step() is the one the model was fed."""
    OPTIMIZER_IN_USE = "optimizer_in_use"
    """The tracked optimizer is the one stepping after a resume (`leg`)."""
    STATE_RESTORED = "state_restored"
    """Tracked objects loaded as saved, by their digests (`leg`; facts: kinds)."""
    STATE_STRAIGHT = "state_straight"
    """Tracked objects' digests equal the straight-through run's at each checkpoint (facts: kinds)."""
    FIELDS_STRAIGHT = "fields_straight"
    """The printed step fields equal the straight-through run's at every resumed step."""
    GPU_EXACT = "gpu_exact"
    """Every GPU leg held the deterministic mode: the re-run steps are compared exactly."""
    GPU_BAND = "gpu_band"
    """A GPU leg ran an op without a deterministic kernel (or without the mode): compared within the band."""
    # launcher/checks/accumulation.py
    ACCUMULATION = "accumulation"
    """Micro-batches per optimizer step (step events per `opt_steps`), and every resume at a
    window's end: one inside a window lost the gradients accumulated since (facts:
    micro_per_step, constant, inside)."""
    # launcher/checks/measure.py, launcher/efficiency.py
    SUSTAINED_RATE = "sustained_rate"
    """A leg's sustained tokens per second, with its standard error (`leg`)."""
    MEMORY_FLAT = "memory_flat"
    """A leg's memory stayed flat across its windows (`leg`)."""
    CADENCE = "cadence"
    """The checkpoint cadence costs under 1 % of step time (`leg`)."""
    STEP_BREAKDOWN = "step_breakdown"
    """Where a leg's step time goes (`leg`)."""
    MFU = "mfu"
    """A leg's FLOPs and MFU (`leg`)."""
    GPU_UTILISATION = "gpu_utilisation"
    """A leg's GPU utilisation and idle time (`leg`)."""
    # launcher/checks/memscore.py
    MEMORY_SCORED = "memory_scored"
    """A statement: a GPU rung's predicted peak memory beside its legs' measured one (facts:
    predicted, needed, allocated, reserved, error; allocated None where no leg measured a GPU)."""


@dataclass(frozen=True)
class Check:
    """One pass/fail answer with the numbers it rests on."""

    name: str
    ok: bool
    detail: str
    evidence: tuple[Pointer, ...] = ()
    missing: bool = False
    """Not answerable from what the leg printed (no batch hashes, say): never a pass."""
    kind: str = field(kw_only=True)
    """Its `Kind`: what its readers match; they never match `name` or `detail`."""
    leg: int | None = None
    """The leg the check is about, where it is about one."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Structured fields a reader uses (numbers, steps), so that none parses `detail`."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "evidence": [p.to_json() for p in self.evidence],
        }
        if self.missing:
            out["missing"] = True
        if self.kind:
            out["kind"] = str(self.kind)
        if self.leg is not None:
            out["leg"] = self.leg
        if self.facts:
            out["facts"] = self.facts
        return out


def find(
    checks: list[dict[str, Any]], kind: Kind, leg: int | None = None, ok: bool | None = None
) -> list[dict[str, Any]]:
    """The recorded checks (ledger rows, `Check.to_json`) of `kind`, of leg `leg` if given,
    passed or failed if `ok` is given: how the report and the gate select checks."""
    return [
        c
        for c in checks
        if c.get("kind") == kind and (leg is None or c.get("leg") == leg) and (ok is None or bool(c.get("ok")) == ok)
    ]


@dataclass
class LegEvents:
    """The events of one leg's log, in order, each with its line number."""

    leg: int
    log: Path
    items: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def read(cls, leg: int, log: Path) -> "LegEvents":
        if not log.is_file():
            return cls(leg, log)
        with log.open(encoding="utf-8", errors="replace") as fh:
            return cls(leg, log, list(iter_events(fh)))

    def all(self, name: str, rank: int | None = 0) -> list[tuple[int, dict[str, Any]]]:
        """Events called `name` printed by `rank` (None: every rank)."""
        return [(n, e) for n, e in self.items if e["event"] == name and (rank is None or e.get("rank", 0) == rank)]

    def first(self, name: str, rank: int | None = 0) -> tuple[int, dict[str, Any]] | None:
        found = self.all(name, rank)
        return found[0] if found else None

    def last(self, name: str, rank: int | None = 0) -> tuple[int, dict[str, Any]] | None:
        found = self.all(name, rank)
        return found[-1] if found else None

    def unverified(self) -> str:
        """Why this leg's newest refused read-back was refused (its `verify` event's first
        failure), as a clause to add to a check's detail; empty when none was refused."""
        failed = [e for _, e in self.all("verify") if not e.get("ok")]
        why = failed[-1].get("failures") if failed else None
        return f"; its verify of {failed[-1].get('name')} said: {why[0]}" if why else ""

    def damaged(self) -> list[dict[str, Any]]:
        """Lines that claimed to be events and were not usable ones: shown, never used as evidence."""
        return [
            {"leg": self.leg, "line": n, "reason": e["reason"], "kind": e.get("kind")}
            for n, e in self.items
            if e["event"] == DAMAGED
        ]

    def pointer(self, item: tuple[int, dict[str, Any]] | None) -> tuple[Pointer, ...]:
        if item is None:
            return ()
        lineno, event = item
        return (Pointer(self.leg, str(self.log), lineno, json.dumps(event)),)


def upto(ev: LegEvents, step: int) -> LegEvents:
    """The leg's events with its step events after `step` dropped: what survived a
    kill that lost everything after the checkpoint at `step`."""
    return LegEvents(ev.leg, ev.log, [(n, e) for n, e in ev.items if not (e["event"] == "step" and e["step"] > step)])


def surviving_timeline(legs: list[LegEvents]) -> list[LegEvents]:
    """Each leg's steps up to where the next leg resumed: the updates that survived
    (a leg the next one did not resume from keeps none; the last keeps all)."""
    out = []
    for ev, nxt in zip(legs, legs[1:] + [None]):
        if nxt is None:
            out.append(ev)
            continue
        resume = nxt.first("resume")
        out.append(upto(ev, int(resume[1]["from_step"]) if resume else 0))
    return out


NO_EVENTS = (
    "the trainer printed no preflight events: it does not speak the leg contract (README, "
    "'Bring your own trainer': runtime.session.Session, or the events listed there)"
)


def last_line(path: Path) -> str:
    """The last non-blank line of a leg's log (what it said before it ended)."""
    if not path.is_file():
        return "(no log)"
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(empty log)"


def silent(ev: LegEvents) -> bool:
    """The leg's log holds no event line (damaged ones count as events: they tried) but for the
    runtime's own `log` lines, which processes beside the trainer print (a sky leg's setup, the
    notice watcher): they are no sign that the trainer speaks the contract."""
    return all(e["event"] == LOG for _, e in ev.items)


def exit_code_from_events(events: LegEvents) -> int | None:
    """The leg's own verdict, read from its events (runtime.contract.exit_code_of): for
    backends whose transport reports something else (SkyPilot's tail_logs returns a JobExitCode)."""
    done, stop = events.last("done"), events.last("stop")
    return exit_code_of(done[1] if done else None, stop[1] if stop else None)

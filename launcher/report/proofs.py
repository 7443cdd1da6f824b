"""The eight proofs of docs/design.md, re-derived from the runs' ledger rows and leg logs
alone, and `PROOFS`: the one table of their numbers, titles and functions.

A proof with no number to state is MISSING, never PASS. Proofs 2-4 and 8 (what a
resume must bring back) are in launcher.report.proofs_resume; proofs 1, 6 and 7 (the
store) in launcher.report.proofs_store; proof 5 (the rate on the target GPU) here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from launcher.checks.measure import RATE_REL_ERR_MAX
from launcher.config.schema import Config
from launcher.report.proofs_resume import proof_2, proof_3, proof_4, proof_8
from launcher.report.proofs_store import proof_1, proof_6, proof_7
from launcher.report.runs import FAIL, MISSING, PASS, RESUME_RUNGS, Evidence, Proof, RunData, crashed_legs, rate_leg


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

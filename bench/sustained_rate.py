"""Throughput estimate error on synthetic step traces: runtime.metrics.sustained_rate vs naive estimators.

Each trace is drawn from a seeded generator with known parameters:

- constant tokens per step (--tokens-per-step);
- steady step time --step-s with Gaussian noise (--noise, relative);
- a warm-up transient: step i's compute (0-based i) takes 1 + (--warmup-x - 1) * exp(-i / --warmup-tau)
  times longer (allocator growth, kernel autotuning): tau 4 fades over ~15-20 steps,
  tau 0.5 is step 1 only (a compile);
- a checkpoint pause of --pause-s every --pause-every steps (phase drawn per
  trace, since a resumed run starts anywhere in the cycle);
- data stalls: with probability --stall-p a step waits U(--stall-lo, --stall-hi) s more.

Pauses and stalls are costs the run really pays, so the truth is the long-run
steady-state rate including them, from the generator's parameters:

    tokens_per_step / (step_s + pause_s / pause_every + stall_p * (stall_lo + stall_hi) / 2)

Estimators, each on the same traces (signed error: positive = optimistic):

- ours: sustained_rate (counter-based, skips the first 10 % / at least 5 steps);
- guide: mean of per-step tok/s over the 20 steps after step 1;
- mean of per-step tok/s over the whole trace;
- counter-based over the 20 steps after step 1;
- counter-based over the whole trace (ours without the warm-up skip);
- reference, not an estimator: ours' window with the warm-up factor taken out of
  the durations, i.e. what remains is the trace's own sampling noise (how many
  pauses and stalls this window happened to draw).

    .venv/bin/python bench/sustained_rate.py [--lengths 120 300 1000] [--seeds 50] [--warmup-tau 4 0.5]

Each warm-up scenario reuses the same seeds, so its traces differ only in the
transient (the reference row is therefore the same in both).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

from runtime.metrics import sustained_rate, warmup_steps  # noqa: E402

Trace = list[tuple[int, float, float]]


@dataclass(frozen=True)
class Gen:
    tokens_per_step: float
    step_s: float
    noise: float
    warmup_x: float
    warmup_tau: float
    pause_s: float
    pause_every: int
    stall_p: float
    stall_lo: float
    stall_hi: float

    @property
    def truth(self) -> float:
        mean_s = self.step_s + self.pause_s / self.pause_every + self.stall_p * (self.stall_lo + self.stall_hi) / 2
        return self.tokens_per_step / mean_s

    def durations(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(step durations, the same without the warm-up factor)."""
        compute = self.step_s * np.clip(1 + self.noise * rng.standard_normal(n), 0.1, None)
        warm = compute * (self.warmup_x - 1) * np.exp(-np.arange(n) / self.warmup_tau)  # extra compute time
        phase = int(rng.integers(0, self.pause_every))
        steady = compute + self.pause_s * ((np.arange(n) + phase) % self.pause_every == self.pause_every - 1)
        stalls = rng.random(n) < self.stall_p
        steady[stalls] += rng.uniform(self.stall_lo, self.stall_hi, size=int(stalls.sum()))
        return steady + warm, steady

    def trace(self, durations: np.ndarray) -> Trace:
        ends = np.cumsum(durations)
        return [(i + 1, (i + 1) * self.tokens_per_step, float(ends[i])) for i in range(len(durations))]


def per_step_rates(trace: Trace) -> np.ndarray:
    tokens = np.array([0.0] + [t[1] for t in trace])
    ends = np.array([0.0] + [t[2] for t in trace])
    return np.diff(tokens) / np.diff(ends)


def counter(trace: Trace, first: int, last: int) -> float:
    """Tokens / seconds between the ends of steps trace[first] and trace[last]."""
    return (trace[last][1] - trace[first][1]) / (trace[last][2] - trace[first][2])


def ours(trace: Trace) -> float:
    rate = sustained_rate(trace)
    assert rate is not None
    return rate.tok_s


ESTIMATORS: dict[str, Callable[[Trace], float]] = {
    "sustained_rate (ours)": ours,
    "guide: mean per-step tok/s, 20 steps after step 1": lambda t: float(per_step_rates(t)[1:21].mean()),
    "mean per-step tok/s, whole trace": lambda t: float(per_step_rates(t).mean()),
    "counter, 20 steps after step 1": lambda t: counter(t, 0, 20),
    "counter, whole trace (no warm-up skip)": lambda t: (t[-1][1]) / t[-1][2],
}


NOISE = "(reference) ours' window, warm-up removed: sampling noise"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[120, 300, 1000])
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--tokens-per-step", type=float, default=2 * 512 * 1024)
    p.add_argument("--step-s", type=float, default=0.30)
    p.add_argument("--noise", type=float, default=0.03)
    p.add_argument("--warmup-x", type=float, default=4.0, help="first step is this many times slower")
    p.add_argument(
        "--warmup-tau",
        type=float,
        nargs="+",
        default=[4.0, 0.5],
        help="decay constants of the transient, in steps: one table block each",
    )
    p.add_argument("--pause-s", type=float, default=1.5)
    p.add_argument("--pause-every", type=int, default=50)
    p.add_argument("--stall-p", type=float, default=0.02)
    p.add_argument("--stall-lo", type=float, default=0.2)
    p.add_argument("--stall-hi", type=float, default=1.0)
    ns = p.parse_args()
    gens = [
        Gen(
            ns.tokens_per_step,
            ns.step_s,
            ns.noise,
            ns.warmup_x,
            tau,
            ns.pause_s,
            ns.pause_every,
            ns.stall_p,
            ns.stall_lo,
            ns.stall_hi,
        )
        for tau in ns.warmup_tau
    ]
    g = gens[0]
    print(
        f"truth {g.truth:,.0f} tok/s ({g.tokens_per_step:,.0f} tok/step; steady {g.step_s} s +-{g.noise:.0%} "
        f"+ {g.pause_s} s every {g.pause_every} steps + stalls p={g.stall_p} x U({g.stall_lo}, {g.stall_hi}) s); "
        f"first step {g.warmup_x:g}x slower; {ns.seeds} seeds per cell"
    )
    print()
    print("| warm-up decay | estimator | " + " | ".join(f"{n} steps" for n in ns.lengths) + " |")
    print("|---|---|" + "---|" * len(ns.lengths))
    print("| | error % vs truth: mean signed / mean abs / worst (+ = optimistic) |" + " |" * len(ns.lengths))
    for gen in gens:
        cells: dict[str, list[str]] = {}
        for n in ns.lengths:
            errors: dict[str, list[float]] = {name: [] for name in [*ESTIMATORS, NOISE]}
            for seed in range(ns.seeds):
                durations, steady = gen.durations(n, np.random.default_rng([n, seed]))
                trace = gen.trace(durations)
                for name, estimate in ESTIMATORS.items():
                    errors[name].append(100 * (estimate(trace) / gen.truth - 1))
                errors[NOISE].append(100 * (counter(gen.trace(steady), warmup_steps(n), n - 1) / gen.truth - 1))
            for name, errs in errors.items():
                e = np.array(errs)
                cells.setdefault(name, []).append(
                    f"{e.mean():+.2f} / {np.abs(e).mean():.2f} / {e[np.abs(e).argmax()]:+.2f}"
                )
        for name, row in cells.items():
            print(f"| tau {gen.warmup_tau:g} steps | {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

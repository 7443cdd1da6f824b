"""What watching a leg costs the launcher: CPU per leg-hour, beside what it costs to pump the
leg's lines at all (docs/watchdog.md, "What it costs").

Every line a leg prints is pumped to its host-side log (launcher.backends.base.pump_lines); the
watchdog adds, per line, `LiveWatch.hear_line` (one JSON parse, one rank's rhythm updated), and
per second one `judge` over every rank. Both are timed here with the launcher's own code, on
lines shaped like the reference trainer's step events (about 560 bytes), for:

- 2 ranks at 10 steps a second (the suite's CPU legs), and 8 ranks at 1 and at 10;
- the judgment at a leg's start and after 1 h and 24 h of gaps (its state grows with the leg):
  the rank's p99 from `Gaps` (binned past 2,048 gaps) beside the sorted list it replaced;
- one second look (`py-spy dump` of a live Python process): paid only at a suspect.

    .venv/bin/python bench/watchdog_cost.py [--lines 200000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.backends.base import pump_lines  # noqa: E402
from launcher.backends.looks import look  # noqa: E402
from launcher.checks.watchdog import Gaps, LiveWatch, Policy, Rhythm, p99  # noqa: E402

T0 = 1_800_000_000.0


def step_line(rank: int, step: int, t: float) -> str:
    event = {
        "event": "step",
        "t": round(t, 3),
        "rank": rank,
        "step": step,
        "loss": 4.630435,
        "loss_local": 4.631613,
        "lr": 0.0024,
        "tokens": 8192 * step,
        "tok_s": 406.1,
        "step_s": 0.1,
        "mem_max_bytes": None,
        "phases": {"sync": 0.00136, "data": 0.0005, "compute": 0.08, "optimizer": 0.0018, "ckpt": 0.0},
        "batch_hash": "cf95637c33135b884926ed9c4a4e2a1b",
        "batch_first": 131072,
        "sample_index": 128 * step,
    }
    return json.dumps(event) + "\n"


def lines_for(ranks: int, steps: int, every: float) -> list[str]:
    return [step_line(r, s, T0 + s * every) for s in range(1, steps + 1) for r in range(ranks)]


def per_line(lines: list[str], watched: bool) -> float:
    """CPU seconds per line to pump the lines to a log (and hear them, where watched)."""
    live = LiveWatch(Policy())
    live.begin(T0)
    sink = (lambda line: live.hear_line(line, time.time())) if watched else (lambda line: None)
    with open(os.devnull, "w") as log:
        start = time.process_time()
        pump_lines(iter(lines), log, sink)
        return (time.process_time() - start) / len(lines)


def judge_cost(ranks: int, gaps_each: int, every: float) -> float:
    """CPU seconds of one judgment over `ranks` ranks that each printed `gaps_each` gaps, a new
    event heard between judgments (so each rank's p99 is recomputed, as in a live leg)."""
    live = LiveWatch(Policy())
    live.begin(T0)
    assert live.dog is not None
    for r in range(ranks):
        rhythm = live.dog.ranks.setdefault(r, Rhythm(r, T0))
        for i in range(gaps_each):
            rhythm.gaps.append(every * (1.0 + 0.3 * ((i * 7919) % 101) / 101))
        rhythm.phase, rhythm.last_t, rhythm.last_step, rhythm.last_event = "stepping", T0, 1, "step"
    rounds, spent = 200, 0.0
    for i in range(rounds):
        now = T0 + i + 0.5
        for r in range(ranks):
            live.dog.ranks[r].hear(now - 0.1, {"event": "step", "step": i + 2})
        start = time.process_time()
        live.judge(now)
        spent += time.process_time() - start
    return spent / rounds


def sorted_p99_cost(n: int) -> tuple[float, float]:
    """CPU seconds of one p99 over n gaps: the sorted list it used to be, and Gaps (binned)."""
    values = [0.1 * (1.0 + 0.3 * ((i * 7919) % 101) / 101) for i in range(n)]
    start = time.process_time()
    for _ in range(5):
        p99(values, 5)
    listed = (time.process_time() - start) / 5
    gaps = Gaps()
    for v in values:
        gaps.append(v)
    start = time.process_time()
    for i in range(200):
        gaps.append(0.1)
        gaps.p99(5)
    return listed, (time.process_time() - start) / 200


def one_look() -> tuple[float, float]:
    """(wall s, CPU s of py-spy) of one second look at a live Python process."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        time.sleep(0.5)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        [seen] = look([child.pid])
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert seen.stack or seen.note, seen
        return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    finally:
        child.kill()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args()
    lines = lines_for(8, args.lines // 8, 0.1)
    rounds = []
    for _ in range(3):  # interleaved: drift hits both
        rounds.append((per_line(lines, False), per_line(lines, True)))
    pump = sorted(r[0] for r in rounds)[1]
    watched = sorted(r[1] for r in rounds)[1]
    hear = watched - pump
    print(f"per line ({len(lines):,} lines, median of 3): pump {1e6 * pump:.2f} us, pump + hear {1e6 * watched:.2f} us")
    print("| leg | lines/s | pump CPU-s/leg-h | watchdog CPU-s/leg-h (hear + judge, at 1 h / 24 h) | % of a core |")
    print("|---|---|---|---|---|")
    for ranks, rate in ((2, 10.0), (8, 1.0), (8, 10.0)):
        per_s = ranks * rate
        hour = int(3600 * rate)
        judge_1h, judge_24h = judge_cost(ranks, hour, 1 / rate), judge_cost(ranks, 24 * hour, 1 / rate)
        cost_1h = 3600 * (per_s * hear + judge_1h)
        cost_24h = 3600 * (per_s * hear + judge_24h)
        print(
            f"| {ranks} ranks x {rate:g} steps/s | {per_s:g} | {3600 * per_s * pump:.2f} | "
            f"{cost_1h:.2f} / {cost_24h:.2f} | {100 * cost_24h / 3600:.3f} % |"
        )
    for n in (36_000, 864_000):
        listed, binned = sorted_p99_cost(n)
        print(f"one rank's p99 over {n:,} gaps: sorted list {1e3 * listed:.2f} ms, Gaps {1e6 * binned:.1f} us")
    wall, cpu = one_look()
    print(f"one second look (py-spy dump of one process): {wall:.3f} s wall, {cpu:.3f} CPU-s")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; {io.DEFAULT_BUFFER_SIZE} B buffers")


if __name__ == "__main__":
    main()

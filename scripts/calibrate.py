"""How fast is this machine at what the suite does most? One figure, printed by `make test`.

The suite is CPU-bound: it starts some 460 leg processes, and each pays a fixed start-up before
its first step: `import torch`, then `torch._dynamo`, which every torch optimizer imports when it
is built (`add_param_group` is wrapped by torch._compile._disable_dynamo), together about 4 s of
CPU here. This times exactly that, three times in a row, and prints the median, so a suite's wall
time can be read against the machine it ran on: on 2026-12-03 the same tree's suite took 32.5 min
on a machine where this printed 3.8 s of CPU (5.7 s wall), where earlier sessions' quiet runs took 14-16 min
(`make test-fast` 16-20 s then, 29-34 s that day). docs/benchmarks.md keeps the figures.

    python scripts/calibrate.py
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time

LEG_STARTUP = "import torch\nm = torch.nn.Linear(4, 4)\ntorch.optim.AdamW(m.parameters())\n"


def one() -> tuple[float, float]:
    """(wall, CPU) seconds of one leg's start-up in a fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", LEG_STARTUP], check=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    runs = [one() for _ in range(3)]
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    print(
        f"calibration: a leg's start-up (import torch, build an optimizer: torch._dynamo) "
        f"{wall:.2f} s wall, {cpu:.2f} s CPU (median of 3)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

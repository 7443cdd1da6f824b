"""Two CPU processes with gloo under torchrun: memory MAX across ranks, a barrier's timeout, the
world's close. Resume on both ranks at the same cursor, rank 0 alone pushing, and each window's memory
MAX, through the launcher: tests/legs/test_drill.py::test_the_resume_matrix_moments_on_two_ranks_resume_where_planned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parents[2]


def torchrun(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, list[dict]]:
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    full.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    events = []
    for line in proc.stdout.splitlines():
        start = line.find('{"event": ')
        if start >= 0:
            events.append(json.loads(line[start:]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.returncode, events


BALLAST = r"""
import json, sys, torch
from runtime.session.world import init_world
from runtime.measure.window import device_memory
world = init_world("cpu")
ballast = torch.ones(80_000_000, dtype=torch.float32) if world.rank == 1 else None  # ~320 MB on rank 1
_, _, peak = device_memory("cpu")
line = json.dumps({"event": "mem", "rank": world.rank, "peak": peak, "max": world.max(peak)})
sys.stdout.write(line + "\n")  # one write per line: two ranks share this pipe
sys.stdout.flush()
world.close()
"""


def test_memory_max_reflects_the_larger_rank(tmp_path: Path) -> None:
    (tmp_path / "ballast.py").write_text(BALLAST)
    code, events = torchrun(["ballast.py"], tmp_path, {})
    assert code == 0
    by_rank = {e["rank"]: e for e in events}
    assert by_rank[1]["peak"] > by_rank[0]["peak"] + 250_000_000
    assert by_rank[0]["max"] == by_rank[1]["max"] == by_rank[1]["peak"]  # rank 0 reports rank 1's peak


WAITER = r"""
import json, sys, time
from runtime.session.world import RankTimeout, init_world
world = init_world("cpu")
if world.rank == 0:
    time.sleep(4)  # rank 0 is busy (pushing, say) past rank 1's patience, by as much again
try:
    world.barrier("rank 0 finishing its pushes", timeout_s=2)
    outcome = "passed"
except RankTimeout as err:
    outcome = str(err)
sys.stdout.write(json.dumps({"event": "barrier", "rank": world.rank, "outcome": outcome}) + "\n")
sys.stdout.flush()
"""


def test_a_barrier_timeout_names_what_was_waited_for(tmp_path: Path) -> None:
    (tmp_path / "waiter.py").write_text(WAITER)
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "waiter.py"],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [json.loads(ln[ln.find('{"event": ') :]) for ln in proc.stdout.splitlines() if '{"event": ' in ln]
    rank1 = next(e for e in lines if e["rank"] == 1)
    assert rank1["outcome"].startswith("rank 1 waited 2 s for rank 0 finishing its pushes"), rank1


def test_closing_the_world_lets_go_of_its_process_group() -> None:
    """The group must die in close(), not at interpreter teardown (where gloo's destructor
    aborted a rank that had already exited cleanly: runtime.session.world.World.close)."""
    import gc

    from runtime.session.world import World

    world = World(rank=0, world_size=2, ctrl=object())
    try:
        world.close()
    finally:
        gc.unfreeze()  # close() freezes the collector for the leg's exit: not this test process's
    assert world.ctrl is None

"""Ranks that abort at exit: a count over many short distributed legs, in one run.

A gloo rank that dies of SIGABRT ("terminate called without an active exception") after
its checkpoint verified turns a good leg into a failed one, and the chance grows with the
rank count. This runs the reference trainer (runtime.reference.trainer) for a few steps, many times,
in two shapes, and counts the legs where any rank did not exit 0 (and, of those, the
SIGABRTs, from torchrun's own report of each rank's exit code):

- one node, two ranks: `torchrun --standalone --nproc_per_node=2` (what tests/legs/test_ddp.py runs);
- two nodes of two ranks on loopback: two torchruns, `--nnodes 2 --node_rank 0|1`, a static
  rendezvous at 127.0.0.1 on a free port (what `--backend local --nodes 2` starts);
- the control, `--held N`: plain torch, two ranks that all-reduce once, destroy the process
  group and exit while a reference to the gloo group is still held (what `World.ctrl` did
  before `World.close` let go of it): the loop must see aborts there, or it proves nothing;
- `--no-close N`: two ranks on `runtime.session.world` that never call `World.close` (a rank leaving on
  an exception): only the exit hook `init_world` registers leaves the world.

    .venv/bin/python bench/teardown_aborts.py [--single 60] [--multi 30] [--held 60] [--no-close 60]

Goal: 0 aborts in 60 single-node and 30 two-node legs, and in the no-close shape; some in the
control. Prints one line per shape; with --keep-failures the stderr of each failed leg is kept
under a temp folder. With core dumps on (`ulimit -c unlimited`), `gdb -batch -ex "thread apply
all bt" python core` on one names the aborting thread (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
ABORT = re.compile(r"exitcode\s*:\s*-6|Signal 6|SIGABRT|terminate called without an active exception")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def trainer_args() -> list[str]:
    return ["-m", "runtime.reference.trainer", "--ckpt-every", "2", "--data-tokens", "20000", "--metrics-every", "2"]


def env_for(work: Path, steps: int, run: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "LAUNCHER_RUN_ID": run,
        "LAUNCHER_STORE": (work / "store").as_uri(),
        "LAUNCHER_MAX_STEPS": str(steps),
    }
    env.pop("WORLD_SIZE", None)
    return env


def single(work: Path, steps: int, i: int) -> tuple[list[int], str]:
    """One leg on one node of two ranks: (torchrun's exit code), its stderr."""
    cwd = work / f"single-{i}"
    cwd.mkdir()
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", *trainer_args()],
        cwd=cwd,
        env=env_for(cwd, steps, f"s{i}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return [proc.returncode], proc.stderr


def multi(work: Path, steps: int, i: int) -> tuple[list[int], str]:
    """One leg on two nodes of two ranks each, on loopback: (each node's exit code), their stderr."""
    port, procs = free_port(), []
    store = work / f"multi-{i}-store"
    for rank in range(2):
        cwd = work / f"multi-{i}-node{rank}"
        cwd.mkdir()
        env = {**env_for(cwd, steps, f"m{i}"), "LAUNCHER_STORE": store.as_uri()}
        procs.append(
            subprocess.Popen(
                [
                    str(TORCHRUN),
                    "--nnodes=2",
                    f"--node_rank={rank}",
                    "--nproc_per_node=2",
                    "--master_addr=127.0.0.1",
                    f"--master_port={port}",
                    *trainer_args(),
                ],
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errs = [p.communicate(timeout=300)[1] for p in procs]
    return [p.returncode for p in procs], "\n".join(errs)


HELD = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
held = dist.group.WORLD  # a reference kept past destroy_process_group, as World.ctrl was
t = torch.ones(1)
dist.all_reduce(t, group=held)
dist.destroy_process_group()
"""
NO_CLOSE = """from runtime.session.world import init_world
world = init_world("cpu")
assert world.max(float(world.rank)) == world.world_size - 1
# no world.close(): a rank on its way out on an exception
"""


def script(name: str, text: str) -> Callable[[Path, int, int], tuple[list[int], str]]:
    """A leg of one node of two ranks running `text` (written once into the work folder)."""

    def run(work: Path, steps: int, i: int) -> tuple[list[int], str]:
        path = work / f"{name}.py"
        if not path.exists():
            path.write_text(text)
        cwd = work / f"{name}-{i}"
        cwd.mkdir()
        proc = subprocess.run(
            [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(path)],
            cwd=cwd,
            env=env_for(cwd, steps, f"{name}{i}"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        return [proc.returncode], proc.stderr

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--single", type=int, default=60)
    ap.add_argument("--multi", type=int, default=30)
    ap.add_argument("--held", type=int, default=0)
    ap.add_argument("--no-close", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--keep-failures", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="teardown-"))
    print(f"torch under {TORCHRUN}; legs of {a.steps} steps; work in {work}")
    shapes = (
        ("1 node x 2 ranks", a.single, single),
        ("2 nodes x 2 ranks", a.multi, multi),
        ("control: group held past destroy", a.held, script("held", HELD)),
        ("runtime.session.world, no close()", a.no_close, script("noclose", NO_CLOSE)),
    )
    for shape, count, run in shapes:
        if not count:
            continue
        failed = aborted = 0
        began = time.monotonic()
        for i in range(count):
            codes, err = run(work, a.steps, i)
            if any(codes):
                failed += 1
                aborted += bool(ABORT.search(err))
                if a.keep_failures:
                    (work / f"{re.sub(r'[^a-z0-9]+', '-', shape)}-{i}.stderr").write_text(err)
        print(f"{shape}: {count} legs in {time.monotonic() - began:.0f} s: {failed} failed, {aborted} by SIGABRT")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A script's peak memory per rank, predicted on fake tensors or measured for real (runtime.memory).

    python -m runtime.programs.memory predict [--world W --rank R] [--out F] -- python train.py ARGS
    torchrun --nproc-per-node W -m runtime.programs.memory measure [--out F] -- python train.py ARGS

The leg command after `--` is read as rung 0 reads it (runtime.programs.static_command: `python
script.py`, `python -m module`, `torchrun ...`, `accelerate launch ...`); its script runs as
`__main__` with its own arguments, in this process, until every optimizer that stepped has
stepped OPTIMIZER_STEPS times. The result is one JSON object, written to `--out` (`{rank}` in the
name is this rank) and printed as the last line:

    {"mode", "rank", "world_size", "device", "peak_bytes", "categories": {name: bytes at the peak},
     "optimizer_steps", "ended": "steps" | "script_ended" | "error", "error", "seconds", "torch",
     "ddp": whether the script wrapped a model in DistributedDataParallel}

`ended` is "steps" when the steps ran; "script_ended" when the script returned first (its peak
is what it reached); "error" with the script's exception as one line. Exit 0 in the first two
cases, 1 in the third, 2 for a command it cannot read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from runtime import contract
from runtime.memory import MEASURE, MODES, OPTIMIZER_STEPS, PREDICT, profiled_peak


class Steps:
    """Counts optimizer steps (a global post-hook: any loop, any framework) and calls `done` once
    every optimizer that has stepped has stepped `wanted` times."""

    def __init__(self, wanted: int, done: Callable[[str], None]) -> None:
        self.wanted, self.done = wanted, done
        self.counts: dict[int, int] = {}

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.counts[id(optimizer)] = self.counts.get(id(optimizer), 0) + 1
        if min(self.counts.values()) >= self.wanted:
            self.done("steps")

    @property
    def taken(self) -> int:
        return min(self.counts.values()) if self.counts else 0


def _result(mode: str, began: float, **facts: Any) -> dict[str, Any]:
    import torch

    from runtime.memory.fake import SEEN
    from runtime.memory.recompute import BACKWARDS, CALLS

    return {
        "mode": mode,
        "rank": int(os.environ.get("RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch": torch.__version__,
        "seconds": round(time.time() - began, 3),
        "ddp": "ddp" in SEEN,
        "checkpointed": CALLS[0],
        "backwards": BACKWARDS[0],
        **facts,
    }


def _write(out: str | None, result: dict[str, Any]) -> None:
    line = json.dumps(result, sort_keys=True)
    if out:
        path = Path(out.replace("{rank}", str(result["rank"])))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, path)
    stdout = sys.__stdout__ or sys.stdout
    stdout.write(line + "\n")
    stdout.flush()


def run(
    mode: str, command: list[str], out: str | None, world: int, rank: int, timeout_s: float, undo: bool = False
) -> int:
    """Run the command's script as `__main__` in `mode` until its steps are done (or it ends, or
    `timeout_s` passes); write the result and leave the process (os._exit: nothing of the script's
    teardown, no collective waiting on a peer, runs after the answer). `undo`: activation
    checkpointing runs plainly (runtime.memory.recompute)."""
    from runtime.memory.recompute import watch
    from runtime.programs.static_check import _run_as_main
    from runtime.programs.static_command import split_command

    kind, target, args = split_command(command)
    began = time.time()
    os.environ[contract.MEMORY] = mode
    watch(undo)
    import signal

    from torch.optim.optimizer import register_optimizer_step_post_hook

    collect: list[Callable[[], dict[str, Any]]] = []

    def finish(how: str, error: str | None = None) -> None:
        facts = collect[0]() if collect else {"device": "cpu", "peak_bytes": 0, "categories": {}}
        _write(out, _result(mode, began, ended=how, error=error, optimizer_steps=steps.taken, **facts))
        os._exit(1 if how == "error" else 0)

    steps = Steps(OPTIMIZER_STEPS, finish)
    register_optimizer_step_post_hook(steps)
    late = f"no {OPTIMIZER_STEPS} optimizer steps in {timeout_s:.0f} s"
    signal.signal(signal.SIGALRM, lambda *_: finish("error", late))
    signal.alarm(max(1, int(timeout_s)))
    try:
        with _predicting(rank, world, collect) if mode == PREDICT else _measuring(collect):
            _run_as_main(kind, target, args)
    except BaseException as err:  # noqa: BLE001 - the script's own failure, said in one line
        if not isinstance(err, SystemExit) or err.code not in (0, None):
            finish("error", _one_line(err))
    finish("script_ended")
    return 0


@contextlib.contextmanager
def _predicting(rank: int, world: int, collect: list[Callable[[], dict[str, Any]]]) -> Iterator[None]:
    """Fake tensors, a fake world, and the account of every storage the steps make."""
    from runtime.memory.account import Account
    from runtime.memory.fake import fake_world, valueless

    fake_world(rank, world)
    account = Account()

    def peak() -> dict[str, Any]:
        device, total, categories = account.peak()
        scaled = account.scaled_peaks(device)
        return {"device": device, "peak_bytes": total, "categories": categories, "scaled_peaks": scaled}

    collect.append(peak)
    with valueless(), account:
        yield


@contextlib.contextmanager
def _measuring(collect: list[Callable[[], dict[str, Any]]]) -> Iterator[None]:
    """Real tensors, and the profiler's record of every allocation and free."""
    from torch.profiler import ProfilerActivity, profile

    from runtime.memory import count_every_thread

    every_thread = count_every_thread()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def peak() -> dict[str, Any]:
        prof.stop()
        total, allocations = profiled_peak(prof)
        return {
            "device": "cpu",
            "peak_bytes": total,
            "categories": {},
            "allocations": allocations,
            "every_thread": every_thread,
        }

    collect.append(peak)
    prof.start()
    yield


def _one_line(err: BaseException) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{at}"[:400]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m runtime.programs.memory predict|measure [options] -- COMMAND", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="runtime.programs.memory")
    p.add_argument("mode", choices=MODES)
    p.add_argument("--world", type=int, default=1, help="predict: the world size this rank is predicted in")
    p.add_argument("--rank", type=int, default=0, help="predict: the rank")
    p.add_argument("--out", default=None, help="where the JSON result goes ({rank}: this rank)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before it gives up")
    p.add_argument("--no-checkpoint", action="store_true", help="run checkpointed blocks plainly (headroom)")
    ns = p.parse_args(argv[:cut])
    if ns.mode == MEASURE and ns.world != 1:
        print("measure: run it under torchrun for several ranks", file=sys.stderr)
        return 2
    if not 0 <= ns.rank < max(1, ns.world):
        print(f"--rank {ns.rank} is not a rank of a world of {ns.world}", file=sys.stderr)
        return 2
    try:
        return run(ns.mode, argv[cut + 1 :], ns.out, ns.world, ns.rank, ns.timeout, ns.no_checkpoint)
    except ValueError as err:
        print(f"cannot read the command: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

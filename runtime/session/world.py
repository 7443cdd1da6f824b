"""Distributed helpers: one process per rank under torchrun, or a world of one.

Collective decisions (resume from which checkpoint, stop now, final verdict)
are made once and shared, so ranks never disagree and deadlock. Waits name
what they wait for: a barrier that times out says which rank waited how long
for what, on every rank (the guide's E-044 survived seven attempts behind a
rank-0-only logger). Control traffic runs on a gloo group, so monitored
barriers with timeouts work under NCCL too.
"""

from __future__ import annotations

import atexit
import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

DEFAULT_WAIT_S = 1800.0


class RankTimeout(RuntimeError):
    """A rank waited longer than its timeout at a named barrier."""


@dataclass
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    ctrl: Any = None
    """The gloo process group for control messages (None in a world of one)."""
    closed: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self, what: str, timeout_s: float = DEFAULT_WAIT_S) -> None:
        """Wait for every rank; on timeout raise naming what was waited for."""
        if not self.distributed:
            return
        try:
            # An async barrier waited on with a timeout bounds every rank's wait;
            # monitored_barrier bounds only rank 0's.
            tdist.barrier(group=self.ctrl, async_op=True).wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise RankTimeout(f"rank {self.rank} waited {timeout_s:.0f} s for {what}: {err}") from err

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """`obj` from rank `src`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=src, group=self.ctrl)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def max(self, value: float) -> float:
        """The largest `value` across ranks, by an explicit all-reduce(MAX)."""
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=self.ctrl)
        return float(t.item())

    def mean(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=self.ctrl)
        return float(t.item()) / self.world_size

    def close(self) -> None:
        """Leave the world while the interpreter is whole (idempotent; `init_world` also runs it
        at exit). `destroy_process_group` only drops torch's own references: this World's `ctrl`
        kept the gloo group, and its worker threads, alive into interpreter teardown, where a
        worker that released a finished collective's tensors took the GIL, was ended by
        pthread_exit, and aborted the rank (SIGABRT, "terminate called without an active
        exception"; the gdb backtrace is in docs/benchmarks.md, "Load-dependent failures found"): 8 of 36 two-rank runs of a script
        that only all-reduces once and closes; 0 of 54 once the group dies here, and 0 in 60 + 30
        legs of bench/teardown_aborts.py)."""
        if self.closed:
            return
        self.closed = True
        if self.distributed:
            if tdist.is_initialized():
                tdist.destroy_process_group()
            self.ctrl = None
            gc.collect()  # the group's last reference may sit in a cycle: free it now, not at exit
        # The leg is over (close() is its last act: finish, a refusal, a rank timeout): what exists
        # now needs no more cyclic collection. Teardown of a torch process skips its final full
        # collection then: 0.9 s -> 0.2 s of interpreter exit with torch and an optimizer (dynamo)
        # loaded, measured on the 2-core machine; a leg ends sooner and bills less.
        gc.freeze()


def resolve_device(requested: str = "auto") -> str:
    """ "auto": cuda where torch sees a GPU, else cpu; any other name as given."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def place(requested: str, world: World | None = None) -> tuple[World, str]:
    """The process group (`world`, or the one torchrun's environment describes) and this rank's
    device: "cuda" becomes this rank's cuda:<local rank>, made current."""
    device = resolve_device(requested)
    world = world or init_world(device)
    if device == "cuda":
        device = f"cuda:{world.local_rank}"
        torch.cuda.set_device(device)
    return world, device


def init_world(device: str) -> World:
    """Join the torchrun world if there is one (WORLD_SIZE > 1)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return World()
    backend = "nccl" if device == "cuda" else "gloo"
    tdist.init_process_group(backend=backend)
    ctrl = tdist.new_group(backend="gloo") if backend != "gloo" else tdist.group.WORLD
    world = World(tdist.get_rank(), world_size, int(os.environ.get("LOCAL_RANK", "0")), ctrl)
    # A rank that leaves without close() (an exception on its way out) must still leave the world
    # while the interpreter is whole. Else a gloo worker thread (ProcessGroupGloo::runLoop) may
    # destroy a finished work's tensors after Py_FinalizeEx began: their decref takes the GIL,
    # a thread taking the GIL during finalization is ended by pthread_exit, its forced unwind
    # meets a noexcept destructor, std::terminate, SIGABRT ("terminate called without an active
    # exception": the gdb backtrace is in docs/benchmarks.md, "Load-dependent failures found"). atexit runs before that teardown.
    atexit.register(world.close)
    return world

"""The Session while a script's memory is predicted or measured (runtime.memory): it stands aside.

`Session(...)` returns a `MemorySession` when LAUNCHER_MEMORY is set. It keeps the Session's
surface (the world, the device, `track`, `resume`, `running`, `lap`, `step`, `finish`), so the
script runs unchanged, and does none of a leg's work: no store is opened, nothing resumes (the
step holds what a fresh start holds), no batch is hashed, nothing is saved, no event is printed.
A checkpoint's own memory (a snapshot in host RAM, DCP's staging) is not the step's peak on
the device: the probe measures a leg's memory with its saves.

A framework adapter's `Preflight(...)` returns `standing_aside(...)` likewise: an object of the
framework's callback class (its hooks do nothing) whose `resume()` starts fresh and whose `step()`
passes.

The world: on several ranks a prediction has joined torch's fake process group already
(runtime.memory.fake), and the control collectives a leg makes answer locally; a measurement joins
a real one (gloo) here, as the Session would, so the script's DDP or FSDP2 finds a process group
and its barriers wait.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as tdist

from runtime.memory import MEASURE
from runtime.memory import mode as memory_mode
from runtime.session.world import World, resolve_device


@dataclass
class PretendWorld(World):
    """This rank's place in the world, with the control collectives answered locally."""

    def barrier(self, what: str, timeout_s: float = 0.0) -> None:
        return None

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def gather(self, obj: Any) -> list[Any]:
        return [obj] * self.world_size

    def max(self, value: float) -> float:
        return value

    def mean(self, value: float) -> float:
        return value

    def close(self) -> None:
        self.closed = True


def pretend_world(device: str = "cpu") -> World:
    """This process's place in the world. A prediction's (torch's fake process group, joined
    already): the control collectives answered locally. A measurement's (under torchrun): a real
    process group joined here as the Session's `init_world` would, and real barriers, so a rank
    waits for local rank 0's files as it does on a leg."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size <= 1:
        return PretendWorld()
    if memory_mode() == MEASURE:
        if not tdist.is_initialized():
            tdist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        return World(tdist.get_rank(), world_size, local_rank, tdist.group.WORLD)
    return PretendWorld(tdist.get_rank(), world_size, local_rank)


class MemorySession:
    """The Session's surface, standing aside (see the module docstring)."""

    def __init__(self, *, workdir: str | Path = ".", device: str = "auto", **_: Any) -> None:
        self.work = Path(workdir).resolve()
        device = resolve_device(device)
        self.world = pretend_world(device)
        self.device = f"cuda:{self.world.local_rank}" if device == "cuda" else device
        self.tracked: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.step_count = self.tokens = 0
        self.exit_code: int | None = None
        self.flops_formula: float | None = None
        self.lr_schedule: Callable[[int], float] | None = None

    def track(self, **objects: Any) -> "MemorySession":
        self.tracked.update(objects)
        return self

    @property
    def params(self) -> int:
        model = self.tracked.get("model")
        return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0

    def resume(self, **_: Any) -> int:
        return 0  # a fresh start: what the step holds does not depend on where it resumed

    def running(self) -> bool:
        return True  # runtime.programs.memory ends the process after its optimizer steps

    def lap(self, phase: str) -> None:
        return None

    def step(self, loss: Any = None, **_: Any) -> None:
        self.step_count += 1

    def checkpoint(self) -> None:
        return None

    def current_lr(self) -> float | None:
        return None

    def finish(self) -> int:
        self.exit_code = 0
        return 0

    def rank_timeout(self, err: Exception) -> int:
        return 1


def standing_aside(base: type = object) -> Any:
    """A framework adapter that does nothing (see the module docstring); `base`: the framework's
    callback class, whose hooks all pass."""

    class StandAside(base):
        def resume(self) -> None:
            return None

        def step(self, loss: Any = None) -> None:
            return None

    return StandAside()

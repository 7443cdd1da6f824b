"""launcher.yaml `memory:`: what the memory guard (launcher.ops.memory, docs/memory.md) does with
its prediction."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import ConfigError

GUARD_MODES = ("refuse", "warn", "off")


@dataclass(frozen=True)
class MemoryConfig:
    """launcher.yaml `memory:`: what the memory guard does with its prediction."""

    guard: str = "refuse"
    """`refuse` (a GPU rung predicted not to fit is refused, exit 3); `warn` (it launches, the plan
    and the launch say it would not fit, and the run records that it went over the guard's figure:
    for a run that truly fits more tightly than the unmeasured allowance allows); `off` (nothing is
    predicted: for a script whose setup cannot run at plan time, a dataset download, say)."""

    def __post_init__(self) -> None:
        if not isinstance(self.guard, str) or self.guard not in GUARD_MODES:
            raise ConfigError("memory.guard", f"must be one of {', '.join(GUARD_MODES)}, got {self.guard!r}")

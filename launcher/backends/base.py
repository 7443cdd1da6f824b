"""The Backend interface every leg runner implements.

A leg is one instance's life: a fresh, empty disk; the reviewed files staged
onto it (the image's job on docker/sky); the DESIGN.md leg environment; stdout
streamed to the host log; an exit code. `kill` is what losing the instance
looks like: the process and its disk are gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping, Protocol

from launcher.config import GpuSpec

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class StagedFile:
    """A reviewed file placed on the leg's disk; its bytes must hash to sha256."""

    source: Path
    sha256: str


@dataclass(frozen=True)
class LegSpec:
    """Everything a backend needs to start one leg."""

    run_id: str
    leg: int
    rung: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    """The leg environment (LAUNCHER_*): recorded in the ledger."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Passed to the leg's environment; never recorded or logged."""
    files: Mapping[str, StagedFile] = field(default_factory=dict)
    """Relative path on the leg's disk -> reviewed file."""
    log_path: Path = Path("leg.log")
    gpus: GpuSpec | None = None


@dataclass
class LegHandle:
    """A started leg. `instance` names what holds it: a dir, container or cluster."""

    spec: LegSpec
    instance: str
    started_at: float
    command: tuple[str, ...]
    """The argv actually executed on the instance (what the ledger records)."""


@dataclass(frozen=True)
class LegResult:
    """How a leg ended."""

    exit_code: int | None
    """The leg's own exit code; negative for a signal (-9 after kill)."""
    started_at: float
    ended_at: float
    killed: bool
    """True when the launcher killed it (drill, budget overrun)."""
    end_reason: str
    billed_seconds: float | None = None
    """Instance-seconds the provider bills (nodes x rounded time) where it differs
    from the wall time of one machine; None: the wall time."""
    killed_processes: int | None = None
    """After a kill: how many processes of the leg the backend found and killed (None: not counted)."""
    survivors: int | None = None
    """After a kill: processes (or containers) of the leg still there once the kill returned (None: not counted)."""
    instance_hourly_usd: float | None = None
    """What one instance (node) cost per hour, host VM included, where the backend knows it
    (sky: SkyPilot's optimizer); None: the config's per-GPU prices."""
    cost_source: str | None = None
    placement: dict[str, str] | None = None
    """Where the leg ran (sky: cloud, region, zone, instance type)."""

    @property
    def wall_seconds(self) -> float:
        return self.ended_at - self.started_at


class Backend(Protocol):
    name: str

    def launch(self, spec: LegSpec, on_line: LineSink | None = None,
               on_instance: Callable[[LegHandle], None] | None = None) -> LegHandle:
        """Start the leg on a fresh instance; stream each output line to the host
        log and to `on_line`. `on_instance` is called with the handle once the
        instance is named and before anything is provisioned or billed (where the
        backend can: sky), else right after it started: the ledger records the leg there."""

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        """Block until the leg ends (None if `timeout` passed first)."""

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        """Kill the leg and destroy its disk, as a lost instance would."""


def billed_seconds(seconds: float, granularity_s: float) -> float:
    """What a provider bills one machine for `seconds` up: rounded up to its granularity,
    with one unit at least (per-second billing with a one-minute minimum: AWS, GCP, Azure)."""
    import math

    return max(1, math.ceil(seconds / granularity_s)) * granularity_s


def pump_lines(lines: Iterable[str], log: IO[str], on_line: LineSink | None) -> None:
    """Copy a leg's output to its host-side log (flushed per line: a killed leg
    keeps every line it printed) and to the live view."""
    for line in lines:
        log.write(line)
        log.flush()
        if on_line:
            on_line(line)

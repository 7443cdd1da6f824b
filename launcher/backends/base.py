"""The Backend interface every leg runner implements.

A leg is one instance's life: a fresh, empty disk; the reviewed files staged
onto it (the image's job on docker/sky); the docs/design.md leg environment; stdout
streamed to the host log; an exit code. `kill` is what losing the instance
looks like: the process and its disk are gone.

What a backend can do beyond launch / wait / kill is declared here, once, and
answered by each backend: `can_freeze` (freeze/thaw a leg at an instant: a drill
lands its kill on a line, a resume rung holds a leg at a step), `can_terminate`
(the trainer's graceful stop, SIGTERM), `can_lose_node` (one node of a leg of several dies
alone), `quote` (a provider's price for a leg),
and, for `launcher stop`, which ledger legs it can signal (`check_signal`),
how (`signal_leg`), and whether its SIGTERM deletes the machine at once
(`sigterm_deletes`). Callers read the attributes; they never probe for methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping, Protocol

from launcher.config.schema import GpuSpec
from launcher.errors import BadInput

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

    def ledger_fields(self) -> dict[str, Any]:
        """What the ledger's leg row records of this handle beyond its spec and argv: the
        task file's sha256, the leg's pid, one instance's hourly price and where that price
        came from; None where the backend has no such thing."""
        return {"task_sha256": None, "pid": None, "hourly_usd": None, "cost_source": None}

    def new_notes(self) -> dict[str, Any]:
        """What the leg learned since the ledger last asked (sky: its launch request's id), for
        `Ledger.note_leg`; each fact given once. Asked by the thread that owns the ledger."""
        return {}


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
    nodes: list[dict[str, Any]] | None = None
    """A leg of several nodes: each node's record (node, instance, pid, exit_code, log)."""

    @property
    def wall_seconds(self) -> float:
        return self.ended_at - self.started_at


class Quote(Protocol):
    """What a provider would charge for one leg (sky: SkyPilot's optimizer pick)."""

    hourly_usd: float
    """Every node of the leg, per hour, host VM included."""
    candidates: tuple[tuple[str, float], ...]
    """Where the provider tries resources one after another: each one's price (this quote is the dearest)."""


class CannotDo(RuntimeError):
    """A backend was asked for what it declares it cannot do (`can_freeze`, `can_terminate`, a
    leg at all for the host): the caller did not read the declaration, a bug (exit 70)."""


class Backend:
    """Where a leg runs. Each backend sets `name`, implements launch / wait / kill, and
    declares what else it can do; the base answers "cannot" for all of it."""

    name: str = ""
    can_freeze: bool = False
    """`freeze` / `thaw` work: every process of a leg stops at an instant, and goes on."""
    can_terminate: bool = False
    """`terminate` works: the leg gets the trainer's graceful stop (SIGTERM)."""
    can_lose_node: bool = False
    """`lose_node` works on a leg of several nodes: one node dies alone, as a lost machine does."""
    can_look: bool = False
    """`pids` reaches the leg's processes on this host (the watchdog's look, `drill hang`'s SIGSTOP)."""
    sigterm_deletes: bool = False
    """`signal_leg(SIGTERM)` deletes the leg's machine right after the signal, without waiting for the
    trainer's final push (sky: SkyPilot's graceful cancel): `launcher stop` first waits for a
    checkpoint verified after its request, and says so."""

    def launch(
        self, spec: LegSpec, on_line: LineSink | None = None, on_instance: Callable[[LegHandle], None] | None = None
    ) -> LegHandle:
        """Start the leg on a fresh instance; stream each output line to the host
        log and to `on_line`. `on_instance` is called with the handle once the
        instance is named and before anything is provisioned or billed (where the
        backend can: sky), else right after it started: the ledger records the leg there."""
        raise CannotDo(f"the {self.name} backend launches no leg")

    def wait(self, handle: LegHandle, timeout: float | None = None) -> LegResult | None:
        """Block until the leg ends (None if `timeout` passed first)."""
        raise CannotDo(f"the {self.name} backend runs no leg")

    def kill(self, handle: LegHandle, reason: str = "killed") -> LegResult:
        """Kill the leg and destroy its disk, as a lost instance would."""
        raise CannotDo(f"the {self.name} backend runs no leg")

    def freeze(self, handle: LegHandle) -> None:
        """Stop every process of the leg at this instant (only where `can_freeze`)."""
        raise CannotDo(f"the {self.name} backend cannot freeze a leg")

    def thaw(self, handle: LegHandle) -> None:
        """Let a frozen leg go on from where it stood (only where `can_freeze`)."""
        raise CannotDo(f"the {self.name} backend cannot thaw a leg")

    def terminate(self, handle: LegHandle) -> None:
        """The trainer's graceful stop: SIGTERM to the leg (only where `can_terminate`)."""
        raise CannotDo(f"the {self.name} backend cannot send a leg SIGTERM")

    def pids(self, handle: LegHandle) -> list[int]:
        """The leg's live processes on this host, for the watchdog's look at a suspect leg
        (launcher.backends.looks); [] where the backend cannot reach them (sky's machines)."""
        return []

    def lose_node(self, handle: LegHandle, node: int) -> None:
        """Kill node `node` of a leg of several, and only it (only where `can_lose_node`): the
        others go on until the cluster's job ends them, as when a machine of a cluster is lost."""
        raise CannotDo(f"the {self.name} backend cannot lose one node of a leg")

    def quote(self, rung: str, gpus: GpuSpec) -> Quote | None:
        """The provider's price for one leg of `rung`; None: the config's prices stand."""
        return None

    @classmethod
    def check_signal(cls, run: Mapping[str, Any], leg: Mapping[str, Any] | None) -> None:
        """`launcher stop`: refuse (bad input, before anything is recorded) a run whose live
        leg (None: between legs) this backend cannot signal. The base refuses every one."""
        raise BadInput(
            f"launcher stop: the {run['backend']} backend's {run['rung']} legs cannot be signalled by "
            "this version (local, docker and the sky run's managed job can)",
            hint="`sky cancel` then `sky down` the leg's cluster",
        )

    @classmethod
    def signal_leg(cls, leg: Mapping[str, Any], sig: int) -> None:
        """`launcher stop`: send the leg its ledger row names SIGTERM (graceful) or SIGKILL,
        from another process than the one that launched it (only after `check_signal`)."""
        raise CannotDo(f"the {cls.name} backend cannot signal a leg")


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

"""launcher.yaml -> frozen, validated dataclasses.

Every value is checked on load, before anything is launched or recorded: an
unknown key, a wrong type or an impossible value raises ConfigError naming the
key (exit 2). The schema is the dataclasses below; each field's docstring is
the documentation `launcher init` writes into the starter config. How a YAML
mapping is checked against them is `launcher.config.parse`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from launcher.cadence import SpotConfig
from launcher.config.hub import HubConfig
from launcher.config.memory import MemoryConfig
from launcher.config.places import local_folder, store_uri
from launcher.errors import ConfigError

CONFIG_NAME = "launcher.yaml"
STATE_DIR_NAME = ".launcher"
SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
GPU_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
# Bounds: a value outside them is a typo or an attack on a guard, never a plan.
MAX_GPUS_PER_NODE = 64
MAX_NODES = 64
MAX_STEPS = 100_000_000
MAX_BUDGET_MINUTES = 7 * 24 * 60
MIN_BUDGET_MINUTES = 0.01
MAX_GPU_HOURS = 1_000_000.0
MAX_USD = 1_000_000_000.0
MAX_PRICE = 10_000.0
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


@dataclass(frozen=True)
class GpuSpec:
    """An accelerator request as SkyPilot writes it: NAME or NAME:COUNT."""

    name: str
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


def parse_gpus(text: str, key: str = "--gpus") -> GpuSpec:
    """Parse 'T4:2' / 'A100-80GB:8' / 'T4'. Refuse 'T4:two', ':2', 'T4:0'."""
    name, sep, count_text = text.partition(":")  # no strip: "T4\n" is a typo, not T4
    if not name or not GPU_NAME.fullmatch(name):
        raise ConfigError(
            key, f"expected NAME[:COUNT] such as T4:2, got {text!r} (missing or bad GPU name)", source="flag"
        )
    if not sep:
        return GpuSpec(name, 1)
    if not re.fullmatch(r"[0-9]{1,6}", count_text):
        raise ConfigError(
            key,
            f"expected NAME[:COUNT] such as T4:2, got {text[:40]!r} (count must be a whole "
            f"number from 1 to {MAX_GPUS_PER_NODE})",
            source="flag",
        )
    count = int(count_text)
    if not 1 <= count <= MAX_GPUS_PER_NODE:
        raise ConfigError(key, f"GPU count must be 1 to {MAX_GPUS_PER_NODE} per node, got {text!r}", source="flag")
    return GpuSpec(name, count)


@dataclass(frozen=True)
class WatchdogConfig:
    """When a rank's silence makes it a suspect (launcher.checks.watchdog; docs/watchdog.md)."""

    multiple: float = 5.0
    """x the 99th percentile of the rank's own gaps between events in the leg (2 to 1000)."""
    floor_s: float = 15.0
    """Never sooner than this, in seconds, while the rank steps (1 to 86400)."""
    first_step_s: float = 900.0
    """Before the rank's first step, and until its second: start-up, the restore (1 to 86400)."""
    finish_s: float = 900.0
    """After its `stop` event: the final checkpoint and its storage cycle (1 to 86400)."""
    act: bool = True
    """End a leg whose look shows it hung: a process stopped, or every rank in a collective."""

    def __post_init__(self) -> None:
        for key, low, high in (
            ("multiple", 2, 1000),
            ("floor_s", 1, 86_400),
            ("first_step_s", 1, 86_400),
            ("finish_s", 1, 86_400),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ConfigError(f"trainer.watchdog.{key}", f"must be {low} to {high}, got {value!r}")
        if not isinstance(self.act, bool):
            raise ConfigError("trainer.watchdog.act", f"must be true or false, got {self.act!r}")


@dataclass(frozen=True)
class TrainerConfig:
    """How a leg starts the trainer."""

    command: list[str] = field(default_factory=lambda: ["python", "train.py"])
    """The leg's command line (a string is split like a shell would). The
    launcher adds the LAUNCHER_* environment; it never edits the arguments."""

    parser: str = "argv"
    """How rung 0 checks the command line. `argv` (default): run the entry with the leg's
    real arguments and stop it the moment its argparse parser has parsed them (a script
    that parses and trains at import time is checked without training), then list the
    modules it loaded. A function name (e.g. build_parser): import the entry and parse
    with the parser that function returns. `none`: the entry is configured otherwise
    (config files, globals): rung 0 compiles the reviewed files and imports `modules`."""

    modules: list[str] = field(default_factory=list)
    """Extra modules rung 0 imports (the entry script is always imported)."""

    events_grace_s: float = 180.0
    """A leg that has printed no preflight event this many seconds after launch is ended
    then (not at the budget kill): the trainer does not speak the leg contract."""

    deterministic: bool = True
    """Whether the trainer is bit-reproducible on a CPU (same seed, same steps -> the same
    losses). CPU rungs then require a resumed run to equal the straight-through run
    exactly; `false` compares within the loss band instead, and says so."""

    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """When a silent rank becomes a suspect (docs/watchdog.md)."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.events_grace_s, bool)
            or not isinstance(self.events_grace_s, (int, float))
            or not 1 <= self.events_grace_s <= 86_400
        ):
            raise ConfigError("trainer.events_grace_s", f"must be 1 to 86400 seconds, got {self.events_grace_s!r}")
        if not isinstance(self.deterministic, bool):
            raise ConfigError("trainer.deterministic", f"must be true or false, got {self.deterministic!r}")
        if not self.command:
            raise ConfigError("trainer.command", "must not be empty")
        if not self.parser.isidentifier():
            raise ConfigError("trainer.parser", f"must be argv, none or a function name, got {self.parser!r}")
        for i, module in enumerate(self.modules):
            if not all(part.isidentifier() for part in module.split(".")):
                raise ConfigError(f"trainer.modules[{i}]", f"must be a module name such as pkg.mod, got {module!r}")


@dataclass(frozen=True)
class RungConfig:
    """Budget of one rung."""

    steps: int = 20
    """Optimizer steps the rung trains in all (split across its legs)."""

    budget_minutes: float = 10.0
    """Wall-clock budget per leg; the leg gets LAUNCHER_DEADLINE from it and is
    killed if it overruns it by more than a grace period."""

    def __post_init__(self) -> None:
        if not 2 <= self.steps <= MAX_STEPS:
            raise ConfigError("steps", f"must be 2 to {MAX_STEPS:,}, got {self.steps}")
        if not MIN_BUDGET_MINUTES <= self.budget_minutes <= MAX_BUDGET_MINUTES:
            raise ConfigError(
                "budget_minutes",
                f"must be {MIN_BUDGET_MINUTES} (0.6 s) to {MAX_BUDGET_MINUTES} (a week), got {self.budget_minutes}",
            )


MAX_RESTARTS_ON_ERRORS = 100


@dataclass(frozen=True)
class RunConfig(RungConfig):
    """Rung 4, the run: carried leg after leg to `steps`, each leg on a fresh instance."""

    max_restarts_on_errors: int = 3
    """The run stops (exit 1, a crash loop) once this many legs in a row ended without a
    newer verified checkpoint in the store (0 counts as 1). A preempted leg that made no
    progress counts too: nothing here can tell a lost instance from one its trainer
    brought down. On sky this is also the managed job's `job_recovery.max_restarts_on_errors`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            isinstance(self.max_restarts_on_errors, bool)
            or not isinstance(self.max_restarts_on_errors, int)
            or not 0 <= self.max_restarts_on_errors <= MAX_RESTARTS_ON_ERRORS
        ):
            raise ConfigError(
                "rungs.run.max_restarts_on_errors",
                f"must be a whole number 0 to {MAX_RESTARTS_ON_ERRORS}, got {self.max_restarts_on_errors!r}",
            )


@dataclass(frozen=True)
class DrillConfig(RungConfig):
    """`launcher drill cold-resume`: steps the run trains in all, budget per leg."""

    fresh_oracle: bool = False
    """A CPU drill runs its own straight-through leg even where the ledger holds one that is
    provably the same run (launcher.rungs.oracle: the rehearsal's, when the drill's steps are
    the rehearsal's), which it otherwise reuses as its oracle."""


@dataclass(frozen=True)
class RungsConfig:
    """Per-rung budgets. `static` needs none: it runs on the host in seconds."""

    rehearsal: RungConfig = field(default_factory=lambda: RungConfig(steps=20, budget_minutes=5))
    smoke: RungConfig = field(default_factory=lambda: RungConfig(steps=30, budget_minutes=10))
    probe: RungConfig = field(default_factory=lambda: RungConfig(steps=2000, budget_minutes=90))
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=100_000, budget_minutes=24 * 60))
    """The run: `steps` in all; `budget_minutes` per leg (and `quota.session_hours`)."""
    drill: DrillConfig = field(default_factory=lambda: DrillConfig(steps=40, budget_minutes=10))
    """`launcher drill cold-resume`: steps the run trains in all, budget per leg."""


@dataclass(frozen=True)
class QuotaConfig:
    """What the launcher may spend."""

    gpu_hours: float | None = None
    """GPU-hours allowed per period (null: no GPU-hour quota)."""

    period: str = "week"
    """week | month | none."""

    reset_weekday: str = "monday"
    """Day a weekly period starts (UTC)."""

    budget_usd: float | None = None
    """USD budget per period (null: none)."""

    session_hours: float | None = None
    """Longest a single leg may run, e.g. 9 for Kaggle's sessions (null: none);
    legs get LAUNCHER_DEADLINE no later than this."""

    def __post_init__(self) -> None:
        if self.gpu_hours is not None and not 0 <= self.gpu_hours <= MAX_GPU_HOURS:
            raise ConfigError("quota.gpu_hours", f"must be 0 to {MAX_GPU_HOURS:g}, got {self.gpu_hours}")
        if self.period not in ("week", "month", "none"):
            raise ConfigError("quota.period", f"must be week, month or none, got {self.period!r}")
        if self.reset_weekday not in WEEKDAYS:
            raise ConfigError("quota.reset_weekday", f"must be a weekday name, got {self.reset_weekday!r}")
        if self.budget_usd is not None and not 0 <= self.budget_usd <= MAX_USD:
            raise ConfigError("quota.budget_usd", f"must be 0 to {MAX_USD:g}, got {self.budget_usd}")
        if (
            self.session_hours is not None
            and not MIN_BUDGET_MINUTES / 60 <= self.session_hours <= MAX_BUDGET_MINUTES / 60
        ):
            raise ConfigError(
                "quota.session_hours",
                f"must be {MIN_BUDGET_MINUTES / 60:g} (0.6 s) to {MAX_BUDGET_MINUTES // 60}, got {self.session_hours}",
            )


@dataclass(frozen=True)
class ImageConfig:
    """The leg image (`launcher image build|push`)."""

    base: str | None = None
    """Base image for `image build` (default: the digest-pinned Debian Python base,
    or the CUDA torch base with --gpu)."""

    repository: str | None = None
    """Registry repository `image push` pushes to, e.g. ghcr.io/you/trainer."""

    def __post_init__(self) -> None:
        if self.repository is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]*[a-z0-9]", self.repository):
            raise ConfigError("image.repository", f"not a repository name: {self.repository!r}")


@dataclass(frozen=True)
class Config:
    """A project's launcher.yaml."""

    project: str
    """Project name, used in run ids and cluster names."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """How legs start the trainer."""

    reviewed: list[str] = field(default_factory=lambda: ["train.py"])
    """Files (globs, relative to the project dir) whose sha256 `launcher review`
    records. Legs run exactly these bytes: they are staged into each leg."""

    store: str | None = None
    """Checkpoint store URI: file:///abs/dir or a path relative to the project
    dir. Default: file://<state_dir>/store."""

    state_dir: str = STATE_DIR_NAME
    """Where the ledger, leg logs and the default store live (relative to the
    project dir unless absolute)."""

    rungs: RungsConfig = field(default_factory=RungsConfig)
    """Per-rung steps and budgets."""

    quota: QuotaConfig = field(default_factory=QuotaConfig)
    """GPU-hour and USD limits."""

    hub: HubConfig = field(default_factory=HubConfig)
    """The Hugging Face Hub's limits an hf:// store keeps to: file size, files per commit, commits per hour."""

    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """What the memory guard does with its prediction (docs/memory.md)."""

    spot: SpotConfig = field(default_factory=SpotConfig)
    """What the report's checkpoint-cadence arithmetic assumes about interruptions."""

    prices: dict[str, float] = field(default_factory=dict)
    """USD per GPU-hour by accelerator name, used when no catalog price is known."""

    image: ImageConfig = field(default_factory=ImageConfig)
    """The leg image for the docker and sky backends."""

    leg_env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every leg, e.g. HF_HUB_DISABLE_XET: "1". Not for
    secrets: these values are recorded in the ledger. LAUNCHER_* is reserved."""

    secrets: list[str] = field(default_factory=lambda: ["HF_TOKEN"])
    """Environment variable names passed to legs as secrets: never written to
    the ledger, a log, a YAML or a report."""

    root: Path = field(default=Path("."), metadata={"internal": True})

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,38}", self.project):
            raise ConfigError("project", f"must be 1-39 lowercase letters, digits or '-', got {self.project!r}")
        if not self.reviewed:
            raise ConfigError("reviewed", "must list at least one file")
        for i, pattern in enumerate(self.reviewed):
            if not pattern.strip() or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
                raise ConfigError(f"reviewed[{i}]", f"{pattern!r} must be a path or glob inside the project dir")
        if not self.state_dir.strip():
            raise ConfigError("state_dir", "must not be empty")
        for gpu, price in self.prices.items():
            if not GPU_NAME.fullmatch(gpu):
                raise ConfigError(f"prices.{gpu}", "is not a GPU name")
            if not 0 <= price <= MAX_PRICE:
                raise ConfigError(f"prices.{gpu}", f"must be 0 to {MAX_PRICE:g} USD per GPU-hour, got {price}")
        for name in self.secrets:
            if not SECRET_NAME.fullmatch(name):
                raise ConfigError("secrets", f"{name!r} is not an environment variable name")
        for name in self.leg_env:
            if not SECRET_NAME.fullmatch(name):
                raise ConfigError(f"leg_env.{name}", "is not an environment variable name")
            if name.startswith("LAUNCHER_") or name in self.secrets:
                raise ConfigError(f"leg_env.{name}", "is reserved (LAUNCHER_*) or a secret; secrets go in `secrets`")
        store_uri(self, on_disk=False)  # validates the scheme

    @property
    def state_path(self) -> Path:
        path = Path(self.state_dir)
        return path if path.is_absolute() else (self.root / path)

    def check_paths(self) -> None:
        """What the files on disk make impossible: a state_dir or a store that is not a folder the
        launcher may write (one rule for both: launcher.config.places.local_folder)."""
        local_folder(self.state_path, "state_dir")
        store_uri(self)

    def rung(self, name: str) -> RungConfig:
        return getattr(self.rungs, name)

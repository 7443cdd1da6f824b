"""launcher.yaml -> frozen, validated dataclasses.

Every value is checked on load, before anything is launched or recorded: an
unknown key, a wrong type or an impossible value raises ConfigError naming the
key (exit 2). The schema is the dataclasses below; each field's docstring is
the documentation `launcher init` writes into the starter config.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from launcher.errors import BadInput, ConfigError

CONFIG_NAME = "launcher.yaml"
STATE_DIR_NAME = ".launcher"
SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
HF_URI = re.compile(r"^hf://[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
GPU_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
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
    raw = text.strip()
    name, sep, count_text = raw.partition(":")
    if not name or not GPU_NAME.match(name):
        raise ConfigError(key, f"expected NAME[:COUNT] such as T4:2, got {text!r} (missing or bad GPU name)", source="flag")
    if not sep:
        return GpuSpec(name, 1)
    if not re.fullmatch(r"[0-9]+", count_text):
        raise ConfigError(key, f"expected NAME[:COUNT] such as T4:2, got {text!r} (count must be a whole number)", source="flag")
    count = int(count_text)
    if count < 1:
        raise ConfigError(key, f"GPU count must be at least 1, got {text!r}", source="flag")
    return GpuSpec(name, count)


@dataclass(frozen=True)
class TrainerConfig:
    """How a leg starts the trainer."""

    command: list[str] = field(default_factory=lambda: ["python", "train.py"])
    """The leg's command line (a string is split like a shell would). The
    launcher adds the LAUNCHER_* environment; it never edits the arguments."""

    parser: str = "build_parser"
    """Function in the entry script/module returning its argparse parser; rung 0
    parses the command line with it, so a flag typo fails on the host."""

    modules: list[str] = field(default_factory=list)
    """Extra modules rung 0 imports (the entry script is always imported)."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("trainer.command", "must not be empty")
        if not self.parser.isidentifier():
            raise ConfigError("trainer.parser", f"must be a function name, got {self.parser!r}")


@dataclass(frozen=True)
class RungConfig:
    """Budget of one rung."""

    steps: int = 20
    """Optimizer steps the rung trains in all (split across its legs)."""

    budget_minutes: float = 10.0
    """Wall-clock budget per leg; the leg gets LAUNCHER_DEADLINE from it and is
    killed if it overruns it by more than a grace period."""

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise ConfigError("steps", f"must be at least 2, got {self.steps}")
        if not self.budget_minutes > 0:
            raise ConfigError("budget_minutes", f"must be positive, got {self.budget_minutes}")


@dataclass(frozen=True)
class RungsConfig:
    """Per-rung budgets. `static` needs none: it runs on the host in seconds."""

    rehearsal: RungConfig = field(default_factory=lambda: RungConfig(steps=20, budget_minutes=5))
    smoke: RungConfig = field(default_factory=lambda: RungConfig(steps=30, budget_minutes=10))
    probe: RungConfig = field(default_factory=lambda: RungConfig(steps=2000, budget_minutes=90))
    run: RungConfig = field(default_factory=lambda: RungConfig(steps=100_000, budget_minutes=24 * 60))
    drill: RungConfig = field(default_factory=lambda: RungConfig(steps=40, budget_minutes=10))
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
        if self.gpu_hours is not None and self.gpu_hours < 0:
            raise ConfigError("quota.gpu_hours", f"must be >= 0, got {self.gpu_hours}")
        if self.period not in ("week", "month", "none"):
            raise ConfigError("quota.period", f"must be week, month or none, got {self.period!r}")
        if self.reset_weekday not in WEEKDAYS:
            raise ConfigError("quota.reset_weekday", f"must be a weekday name, got {self.reset_weekday!r}")
        if self.budget_usd is not None and self.budget_usd < 0:
            raise ConfigError("quota.budget_usd", f"must be >= 0, got {self.budget_usd}")
        if self.session_hours is not None and not self.session_hours > 0:
            raise ConfigError("quota.session_hours", f"must be positive, got {self.session_hours}")


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
        for gpu, price in self.prices.items():
            if not GPU_NAME.match(gpu):
                raise ConfigError(f"prices.{gpu}", "is not a GPU name")
            if price < 0:
                raise ConfigError(f"prices.{gpu}", f"must be >= 0, got {price}")
        for name in self.secrets:
            if not SECRET_NAME.match(name):
                raise ConfigError("secrets", f"{name!r} is not an environment variable name")
        for name in self.leg_env:
            if not SECRET_NAME.match(name):
                raise ConfigError(f"leg_env.{name}", "is not an environment variable name")
            if name.startswith("LAUNCHER_") or name in self.secrets:
                raise ConfigError(f"leg_env.{name}", "is reserved (LAUNCHER_*) or a secret; secrets go in `secrets`")
        store_uri(self)  # validates the scheme

    @property
    def state_path(self) -> Path:
        path = Path(self.state_dir)
        return path if path.is_absolute() else (self.root / path)

    def rung(self, name: str) -> RungConfig:
        return getattr(self.rungs, name)


def store_uri(cfg: Config) -> str:
    """The store URI as legs see it (absolute, with a scheme)."""
    if cfg.store is None:
        return (cfg.state_path / "store").resolve().as_uri()
    if cfg.store.startswith("file://"):
        path = Path(cfg.store[len("file://"):])
        if not path.is_absolute():
            raise ConfigError("store", f"file:// URIs must be absolute, got {cfg.store!r}")
        return path.as_uri()
    if cfg.store.startswith("hf://"):
        if not HF_URI.match(cfg.store):
            raise ConfigError("store", f"expected hf://owner/repo[@revision], got {cfg.store!r}")
        return cfg.store
    if "://" in cfg.store:
        raise ConfigError("store", f"unknown scheme in {cfg.store!r} (expected file:// or a path)")
    return (cfg.root / cfg.store).resolve().as_uri()


# --- loading ---------------------------------------------------------------

def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is list:
        return "a list of " + _type_name(get_args(tp)[0]) + "s"
    if origin is dict:
        return "a mapping"
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return the typed value."""
    args = get_args(tp)
    if type(None) in args:  # Optional[X]
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    origin = get_origin(tp)
    if origin is list:
        if tp == list[str] and isinstance(value, str) and key.endswith("command"):
            value = shlex.split(value)
        if not isinstance(value, list):
            raise ConfigError(key, f"must be {_type_name(tp)}, got {type(value).__name__}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {type(value).__name__}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"must be a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r}")  # a schema bug, not user input


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix or "(top level)", f"must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        where = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(where, f"unknown key (known: {', '.join(fields)})")
    kwargs = {}
    for name in fields:
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        if prefix and not err.key.startswith(prefix):
            raise ConfigError(f"{prefix}.{err.key}", err.detail) from None
        raise
    except TypeError as err:  # a required field is missing
        missing = re.search(r"argument: '(\w+)'", str(err))
        name = missing.group(1) if missing else "?"
        raise ConfigError(f"{prefix}.{name}" if prefix else name, "is required") from None


def load_config(path: str | Path | None = None) -> Config:
    """Load and validate launcher.yaml (default: ./launcher.yaml)."""
    import yaml  # deferred: keeps `launcher --help` lean

    cfg_path = Path(path) if path is not None else Path(CONFIG_NAME)
    if not cfg_path.is_file():
        raise BadInput(f"no config at {cfg_path}", hint="run `launcher init` to write a starter launcher.yaml")
    try:
        data = yaml.safe_load(cfg_path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(where, f"not valid YAML ({getattr(err, 'problem', err)})", source=str(cfg_path)) from None
    try:
        cfg = _build(Config, data, "")
    except ConfigError as err:
        raise ConfigError(err.key, err.detail, source=str(cfg_path)) from None
    return dataclasses.replace(cfg, root=cfg_path.resolve().parent)

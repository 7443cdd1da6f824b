"""launcher.yaml read: parsed with a strict loader (no duplicate keys, no tags), built into the
frozen dataclasses of launcher.config.schema, every value checked, before anything is launched.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.config.parse import StrictLoader, build, read_text
from launcher.config.schema import CONFIG_NAME, Config
from launcher.errors import BadInput, ConfigError


def load_config(path: str | Path | None = None) -> Config:
    """Load and validate launcher.yaml (default: ./launcher.yaml)."""
    import yaml  # deferred: keeps `launcher --help` lean

    cfg_path = Path(path) if path is not None else Path(CONFIG_NAME)
    try:
        is_file = cfg_path.is_file()
    except OSError as err:  # a name too long, a loop of links
        raise BadInput(f"cannot use --config {str(cfg_path)[:200]!r}: {err.strerror or err}") from None
    if not is_file:
        if cfg_path.exists():
            raise BadInput(f"{cfg_path} is not a file", hint="--config takes the path of a launcher.yaml")
        raise BadInput(f"no config at {cfg_path}", hint="run `launcher init` to write a starter launcher.yaml")
    text = read_text(cfg_path)
    try:
        data = yaml.load(text, Loader=StrictLoader.make())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(where, f"not valid YAML ({getattr(err, 'problem', err)})", source=str(cfg_path)) from None
    except RecursionError:
        raise ConfigError("(file)", "nested too deeply to be a launcher.yaml", source=str(cfg_path)) from None
    try:
        cfg = build(Config, data, "")
        cfg = dataclasses.replace(cfg, root=cfg_path.resolve().parent)
        cfg.check_paths()
    except ConfigError as err:
        raise ConfigError(err.key, err.detail, source=str(cfg_path)) from None
    except RecursionError:
        raise ConfigError("(file)", "nested too deeply to be a launcher.yaml", source=str(cfg_path)) from None
    return cfg

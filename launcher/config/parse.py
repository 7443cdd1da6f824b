"""A YAML mapping -> a frozen dataclass, checked against the field annotations.

The schema-independent half of loading launcher.yaml: the strict YAML loader
(a key given twice is an error), the bounded file read, and the walk that
checks each value against its field's type and names the key it came from
(`launcher.config.schema` holds the schema itself and `load_config`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from launcher.errors import BadInput, ConfigError

MAX_CONFIG_BYTES = 1 << 20
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
"""A whole number as launcher.yaml and every integer flag take it: ASCII digits, a sign, no
leading zero. One spelling, because every other one means something else to some reader:
Python's int() (so click's) takes '٣' (Arabic-Indic 3), '1_000' and ' 3 '; YAML 1.1 (PyYAML)
reads 017 as octal 15 where YAML 1.2 and people read 17, 0b11 and 1_000 as numbers where YAML
1.2 reads strings, 1:20 as 80 (base 60!); 0x10 is 16 to both, but a hex step count is a paste,
not a plan; bash reads 010 as 8. (0o17 stays the string '0o17' in PyYAML: "must be an integer".)
`[0-9]`, not `\\d`: `\\d` matches the digits of every script."""
PLAIN_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
"""A number as the float flags take it: the same ASCII digits, a point, an exponent."""


def plain_int(text: str) -> int:
    """`text` as a whole number, if it is spelled PLAIN_INT; ValueError naming it otherwise."""
    if not PLAIN_INT.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a whole number in plain decimal digits 0-9 (such as 16)")
    if len(text) > 100:  # int() refuses over 4300 digits, with a message of its own
        raise ValueError(f"{text[:20]!r}... has {len(text)} digits: out of any range")
    return int(text)


def plain_float(text: str) -> float:
    """`text` as a number, if it is spelled PLAIN_FLOAT; ValueError naming it otherwise."""
    if not PLAIN_FLOAT.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a number in plain decimal digits 0-9 (such as 2.5)")
    return float(text)


@dataclasses.dataclass(frozen=True)
class Unplain:
    """A number YAML 1.1 resolved from a spelling other than plain decimal (0x10, 0b11, 017,
    1_000, 1:20, 1_0.5): kept as its text so `coerce` refuses it naming the key."""

    text: str
    value: int | float

    def __repr__(self) -> str:
        return self.text

    def error(self, key: str) -> ConfigError:
        return ConfigError(
            key,
            f"{self.text} is not plain decimal: YAML 1.1 reads it as {self.value}, other readers differently; "
            "write digits 0-9 with no leading 0, '_' or ':'",
        )


def type_name(tp: Any) -> str:
    """How an error message names the type a key wants."""
    origin = get_origin(tp)
    if origin is list:
        return "a list of " + type_name(get_args(tp)[0]) + "s"
    if origin is dict:
        return "a mapping"
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    return getattr(tp, "__name__", str(tp))


def show(value: Any) -> str:
    """A value as an error message quotes it (at most 60 characters)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return the typed value."""
    if isinstance(value, Unplain):
        raise value.error(key)
    args = get_args(tp)
    if type(None) in args:  # Optional[X]
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
    if dataclasses.is_dataclass(tp):
        if value is None:  # `rehearsal:` with nothing after it: a section left half-written, not "the defaults"
            raise ConfigError(key, "must be a mapping, got null (leave the key out for its defaults)")
        return build(tp, value, key)
    origin = get_origin(tp)
    if origin is list:
        if tp == list[str] and isinstance(value, str) and key.endswith("command"):
            if "\0" in value:
                raise ConfigError(key, f"must not contain control characters, got {show(value)}")
            try:
                value = shlex.split(value)
            except ValueError as err:
                raise ConfigError(key, f"is not a command line ({err}): {show(value)}") from None
        if not isinstance(value, list):
            raise ConfigError(key, f"must be {type_name(tp)}, got {type(value).__name__}")
        if len(value) > 1000:
            raise ConfigError(key, f"lists {len(value)} items (at most 1000)")
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {type(value).__name__}")
        if len(value) > 1000:
            raise ConfigError(key, f"has {len(value)} keys (at most 1000)")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or CONTROL.search(k):
                raise ConfigError(key, f"key {show(k)} is not a plain string")
            out[k] = coerce(v, args[1], f"{key}.{k}")
        return out
    return scalar(value, tp, key)


def scalar(value: Any, tp: Any, key: str) -> Any:
    """`value` checked against a scalar annotation (bool, float, int, str)."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"must be a number, got {show(value)}")
        if isinstance(value, int) and abs(value) > 10**15 or not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {show(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, got {show(value)}")
        if abs(value) > 10**15:
            raise ConfigError(key, f"must be a reasonable integer, got {show(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {show(value)}")
        allowed_newline = key.startswith("leg_env.")
        if "\0" in value or (not allowed_newline and CONTROL.search(value)):
            raise ConfigError(key, f"must not contain control characters, got {show(value)}")
        if len(value) > 4096:
            raise ConfigError(key, f"is longer than 4096 characters ({len(value)})")
        return value
    raise TypeError(f"unsupported config type {tp!r}")  # a schema bug, not user input


def build(cls: type, data: Any, prefix: str) -> Any:
    """The dataclass `cls` from a mapping: unknown keys refused, each value coerced to its field's type."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix or "(top level)", f"must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted({show(k) if not isinstance(k, str) else k[:60] for k in data} - set(fields))
    if unknown:
        where = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(where, f"unknown key (known: {', '.join(fields)})")
    kwargs = {}
    for name in fields:
        if name in data:
            kwargs[name] = coerce(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
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


class StrictLoader:
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML's
    last-wins would silently drop the first value), and marks a number not written
    in plain decimal (`Unplain`, refused by `coerce` naming its key)."""

    @staticmethod
    def make() -> type:
        import yaml

        class Loader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN202, FBT002
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                        seen.add(key)
                    except TypeError:  # an unhashable key: the schema refuses it later
                        continue
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {show(key)} is given twice", key_node.start_mark
                        )
                return super().construct_mapping(node, deep=deep)

            def construct_int(self, node):  # noqa: ANN001, ANN202
                value = self.construct_yaml_int(node)
                return value if PLAIN_INT.fullmatch(node.value) else Unplain(node.value, value)

            def construct_float(self, node):  # noqa: ANN001, ANN202
                # `_` and base 60 are YAML 1.1's alone; .inf and .nan pass to the finiteness check.
                value = self.construct_yaml_float(node)
                return Unplain(node.value, value) if re.search(r"[_:]", node.value) else value

        Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_int)
        Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_float)
        return Loader


def read_text(cfg_path: Path) -> str:
    """The config file's text: at most MAX_CONFIG_BYTES of UTF-8 without a NUL."""
    try:
        with cfg_path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise BadInput(f"cannot read {str(cfg_path)[:200]}: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("(file)", f"larger than {MAX_CONFIG_BYTES} bytes", source=str(cfg_path))
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(
            "(file)", f"not UTF-8 text (byte {err.start}); save it as UTF-8", source=str(cfg_path)
        ) from None
    if "\0" in text:
        raise ConfigError("(file)", "holds a NUL byte: not a text file", source=str(cfg_path))
    return text

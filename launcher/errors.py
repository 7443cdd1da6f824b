"""Error types the CLI maps to exit codes (DESIGN.md: 0 ok, 1 the rung said no,
2 bad input, 3 refused by a guard).

Each error carries one line for the user and, where there is one, the command
to run next. Tracebacks are shown only with LAUNCHER_DEBUG=1.
"""

from __future__ import annotations


class LauncherError(Exception):
    """Base: a failure the user can act on, rendered as one line."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadInput(LauncherError):
    """Usage, config, unknown rung, bad --gpus: nothing was launched or recorded."""

    exit_code = 2


class ConfigError(BadInput):
    """launcher.yaml (or a flag standing in for one of its keys) is invalid."""

    def __init__(self, key: str, detail: str, source: str = "launcher.yaml") -> None:
        super().__init__(f"{source}: {key}: {detail}")
        self.key = key
        self.detail = detail
        self.source = source


class Refused(LauncherError):
    """A guard refused: hash mismatch, quota, dirty tree."""

    exit_code = 3


class RungFailed(LauncherError):
    """The rung ran and its answer is 'no'."""

    exit_code = 1

"""The deterministic mode of the rungs that compare runs (LAUNCHER_DETERMINISTIC=1).

Rehearsal, smoke and the drill re-run steps a kill threw away and compare them with what was
run before: exact only if the arithmetic is. With the mode on, the session turns on
`torch.use_deterministic_algorithms(True, warn_only=True)`, cudnn's deterministic mode (no
benchmark autotuning), and no TF32 in matmuls or convolutions; the leg's environment carries
CUBLAS_WORKSPACE_CONFIG (runtime.contract.leg_env), which cuBLAS reads when CUDA starts.

Warn-only, not raise: an op with no deterministic kernel (`put_`, `max_unpool`, on a GPU
`index_add_`, `scatter_add_`, ...) must not kill a leg that is otherwise sound. torch warns
once per op; the session puts each name on the step event that ran it (`nondeterministic`),
and the launcher says that a comparison resting on it falls back to the band. The `start`
event's `deterministic` says what was set (null: the mode was off)."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Mapping

from runtime import contract

_ALERT = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


class Determinism:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        environ: Mapping[str, str] = os.environ if env is None else env
        self._ops: list[str] = []
        self._seen: set[str] = set()
        on = environ.get(contract.DETERMINISTIC) == "1"
        self.settings: dict[str, Any] | None = self._apply(environ) if on else None
        """What the mode set (the `start` event's `deterministic`); None: the mode is off."""

    def _apply(self, env: Mapping[str, str]) -> dict[str, Any]:
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        warnings.filterwarnings("always", message=r".* does not have a deterministic implementation")
        shown = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            found = _ALERT.match(str(message))
            if found is None:
                shown(message, category, filename, lineno, file, line)
                return
            op = found.group("op")
            if op not in self._seen:  # once per op, here and in the events
                self._seen.add(op)
                self._ops.append(op)
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return {
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": True,
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32),
            "cublas_workspace": env.get("CUBLAS_WORKSPACE_CONFIG"),
        }

    def take(self) -> list[str]:
        """The ops without a deterministic kernel first run since the last call."""
        ops, self._ops = self._ops, []
        return ops

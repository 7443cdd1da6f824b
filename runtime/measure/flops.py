"""FLOPs per token, two ways: counted on one real step, and the decoder formula.

Counted: PyTorch's own `FlopCounterMode` (a dispatch mode: it sees every aten op
the step really ran, forward and backward, whatever the model) on the leg's first
step. It counts matrix products (mm, addmm, bmm, convolutions, attention kernels)
and nothing elementwise -- the same convention as the formula and as the vendors'
peak figures. Two additions here: the CPU flash-attention kernel, which its
registry leaves out (without it a CPU count misses every attention product, 12.5 %
of the reference model), and the dtype each product ran in, so the MFU's
denominator is the peak of the units the step really used (bf16 under autocast,
fp32 without it) rather than what a config claims.

Formula (decoder transformers; Kaplan et al. 2020, PaLM's appendix B):
    6 N + 12 L d T  per token, training (forward + backward)
N: the parameters that multiply activations (not the position table); L layers,
d model width, T context length. Causal attention is counted whole, as the
kernels' own FLOP counters do.

Counting costs one step's worth of Python per op, once per leg, on a step the
sustained rate leaves out anyway (the warm-up).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch

DTYPE_KEYS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def transformer_flops_per_token(params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token of a decoder transformer: 6N + 12 L d T."""
    return 6.0 * params + 12.0 * n_layer * d_model * seq_len


def matmul_dtype(dtype_key: str, device: str) -> str:
    """The peak table's key for the units a product of this dtype runs on: fp32
    products use TF32 tensor cores only when PyTorch is told it may
    (`torch.set_float32_matmul_precision('high')`), on a GPU that has them."""
    if dtype_key != "fp32" or not device.startswith("cuda"):
        return dtype_key
    if torch.get_float32_matmul_precision() != "highest" and torch.cuda.get_device_capability(device)[0] >= 8:
        return "tf32"
    return "fp32"


def _cpu_attention_formulas() -> dict[Any, Any]:
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    extra = {}
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", fc.sdpa_flop),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", fc.sdpa_backward_flop),
    ):
        op = getattr(aten, name, None)
        if op is not None and op not in fc.flop_registry:
            extra[op] = formula
    return extra


class StepFlops:
    """`with StepFlops() as c: <one forward + backward + optimizer step>` -> c.total, c.by_dtype.

    Never raises into the step it watches: a formula that fails is recorded in
    `errors` and the count says it is incomplete."""

    def __init__(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        outer = self
        self.by_dtype: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []

        class _Counter(FlopCounterMode):
            def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
                formula = self.flop_registry.get(func_packet)
                if formula is not None:
                    try:
                        n = int(formula(*args, **kwargs, out_val=out))
                    except Exception as err:  # noqa: BLE001 - the step must go on
                        outer.errors.append(f"{func_packet}: {type(err).__name__}")
                        return out
                    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), None)
                    outer.by_dtype[DTYPE_KEYS.get(dtype, str(dtype))] += n
                return out

        self._mode = _Counter(display=False)
        # per-module totals are not needed: no global module hooks (they make torch.compile warn)
        self._mode.mod_tracker = contextlib.nullcontext()
        # the registry's own entries are already shape-wrapped: added as they are
        self._mode.flop_registry.update(_cpu_attention_formulas())

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())

    def dominant_dtype(self) -> str | None:
        return max(self.by_dtype, key=self.by_dtype.get) if self.by_dtype else None  # type: ignore[arg-type]

    def __enter__(self) -> "StepFlops":
        # The counted step runs eagerly: a compiled model met under a dispatch mode is
        # never compiled afterwards (its frames are skipped for good); eager, it compiles
        # on the next step as it would have. The count is the same either way.
        stance = getattr(torch.compiler, "set_stance", None)
        self._stance = stance("force_eager") if stance is not None else None
        if self._stance is not None:
            self._stance.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        if self._stance is not None:
            self._stance.__exit__(*exc)


def compiled_graphs() -> int:
    """How many graphs torch.compile has built in this process (0: the model runs eagerly)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))

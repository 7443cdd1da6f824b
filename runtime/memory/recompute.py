"""Activation checkpointing counted and, on request, undone, and backward passes counted: the
headroom statements.

A script that checkpoints activations (`torch.utils.checkpoint.checkpoint`, directly, through
`checkpoint_sequential`, or through a framework's switch such as Hugging Face's
`gradient_checkpointing_enable`, which call it) buys memory with compute: each checkpointed
block's forward runs again in the backward. Where the prediction says the run would fit without
it, that compute is spent on memory nobody needed (the field guide's run: 5.99 GB used of a
15.4 GB card, checkpointing off bought ~30 % throughput). `watch` replaces the function before the
script imports it: it counts the calls, and with `undo` runs the block plainly, so the same
prediction says what the step would hold without checkpointing.
"""

from __future__ import annotations

from typing import Any

CALLS = [0]
"""Checkpointed calls the script made before the prediction ended."""
BACKWARDS = [0]
"""Backward passes (`torch.autograd.backward`, which `loss.backward()` calls) before it ended: more
than one per optimizer step is gradient accumulation, the micro-batch headroom's question."""

_OWN = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop")
"""checkpoint()'s own keyword arguments, dropped when the block runs plainly."""


def watch(undo: bool) -> None:
    """Count every checkpointed call from here on; with `undo`, run each block without checkpointing."""
    import torch.utils.checkpoint as cp

    real = cp.checkpoint

    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        if undo:
            return function(*args, **{k: v for k, v in kwargs.items() if k not in _OWN})
        return real(function, *args, **kwargs)

    cp.checkpoint = checkpoint  # checkpoint_sequential looks the name up here at each call

    import torch.autograd

    backward = torch.autograd.backward

    def counted(*args: Any, **kwargs: Any) -> Any:
        BACKWARDS[0] += 1
        return backward(*args, **kwargs)

    torch.autograd.backward = counted  # Tensor.backward looks it up at each call

"""The trainer's API: `Session`, the one object a trainer creates, and what it is made of.

`from runtime.session import Session` is the way in (`EpochLoader` too: a loader whose order
is f(seed, epoch) and which seeks on resume). Inside: the Session (`core`), its resume
(`resume`: the frozen `Resumed` it starts from), its saves (`saver`, the part the framework
adapters share), its sharded path (`sharded`), the leg contract's rules (`rules`: the stop, the
stale-code refusal, `LegEnd`), what a step read (`batches`) and the evidence of each step
(`step_evidence`), RNG state per rank (`rng`), the deterministic mode (`determinism`), the
process group (`world`) and loader workers under the leg's stop (`workers`). Imports torch.
"""

from runtime.session.batches import EpochLoader
from runtime.session.core import Session
from runtime.session.world import resolve_device

__all__ = ["EpochLoader", "Session", "resolve_device"]

"""preflight launcher, host side.

Walks a training run up the preflight ladder (static -> rehearsal -> smoke ->
probe -> run) and records every leg in a SQLite ledger. This package never
imports torch; skypilot and docker are imported lazily, inside the backends
that need them.
"""

__version__ = "0.1.0"

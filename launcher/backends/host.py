"""The host "backend": rung 0 (static) runs its checks on this machine and launches
no leg. It exists so that run is recorded like every other (backend 'host') and so
that `launcher stop` has an answer for it: it cannot be signalled (the base's refusal)."""

from __future__ import annotations

from launcher.backends.base import Backend


class HostBackend(Backend):
    """Runs nothing: launch / wait / kill and the rest are the base's "cannot"."""

    name = "host"

"""Where a leg runs. One interface (`base.Backend`), three implementations:
local (the embedded default), docker and sky. Backends other than local import
their SDKs lazily, inside the backend."""

from __future__ import annotations

from launcher.backends.base import Backend, LegHandle, LegResult, LegSpec
from launcher.errors import BadInput

BACKENDS = ("local", "docker", "sky")

__all__ = ["BACKENDS", "Backend", "LegHandle", "LegResult", "LegSpec", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`; unknown or unavailable names are bad input."""
    if name == "local":
        from launcher.backends.local import LocalBackend

        return LocalBackend(**options)  # type: ignore[arg-type]
    if name == "docker":
        from launcher.backends.docker import DockerBackend

        return DockerBackend(**options)  # type: ignore[arg-type]
    if name == "sky":
        from launcher.backends.sky import SkyBackend

        return SkyBackend(**options)  # type: ignore[arg-type]
    raise BadInput(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")

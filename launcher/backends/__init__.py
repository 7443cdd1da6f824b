"""Where a leg runs. One interface (`base.Backend`), three implementations:
local (the embedded default), docker and sky; and the host, where rung 0 runs
without a leg. Backends other than local import their SDKs lazily, inside the
backend. `make_backend` builds one for `up`; `backend_class` names the class
behind a ledger row's backend, for what is asked of it without an instance
(`launcher stop`'s signalling, whether it can send SIGTERM)."""

from __future__ import annotations

from launcher.backends.base import Backend, LegHandle, LegResult, LegSpec
from launcher.config.schema import Config
from launcher.errors import BadInput

BACKENDS = ("local", "docker", "sky")
HOST = "host"

__all__ = ["BACKENDS", "HOST", "Backend", "LegHandle", "LegResult", "LegSpec", "backend_class", "make_backend"]


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called `name` (a ledger row's `backend`); the base, which
    can do nothing but be named, for one this version does not know."""
    if name == "local":
        from launcher.backends.local import LocalBackend

        return LocalBackend
    if name == "docker":
        from launcher.backends.docker import DockerBackend

        return DockerBackend
    if name == "sky":
        from launcher.backends.sky.backend import SkyBackend

        return SkyBackend
    if name == HOST:
        from launcher.backends.host import HostBackend

        return HostBackend
    return Backend


def make_backend(
    name: str, cfg: Config | None = None, image: str | None = None, nodes: int = 1, retry_until_up: bool = False
) -> Backend:
    """The backend called `name`, built with what it needs: local, the config and the node count
    (a leg of several nodes runs the rung's `run:` script on each); docker, the `image` its legs run;
    sky, the config, the pushed `image`, the node count and whether to wait for capacity;
    the host (rung 0), nothing. An unknown name is bad input."""
    if name == "local":
        from launcher.backends.local import LocalBackend

        return LocalBackend(cfg=cfg, nodes=nodes)
    if name == "docker":
        from launcher.backends.docker import DockerBackend

        return DockerBackend(image=image, cfg=cfg, nodes=nodes)  # type: ignore[arg-type] # _image_for gave one
    if name == "sky":
        from launcher.backends.sky.backend import SkyBackend

        return SkyBackend(
            cfg=cfg,
            image_ref=image,
            nodes=nodes,  # type: ignore[arg-type]
            retry_until_up=retry_until_up,
        )
    if name == HOST:
        from launcher.backends.host import HostBackend

        return HostBackend()
    raise BadInput(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")

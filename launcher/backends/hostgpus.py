"""The GPUs this host can give a leg, read the way the leg would see them, and the plan's
guard that a `--gpus NAME:COUNT` request on the local or docker backend meets them.

A leg on these backends runs on this machine: a request for GPUs it does not have would
train on the CPU and be billed as GPU time. So the plan refuses it before anything runs
(exit 3), naming what the host has and the two ways on (`--cpu`, `--backend sky`).

The inventory is NVIDIA's management library (NVML, through nvidia-ml-py: pure Python,
no torch), the library the CUDA driver ships beside itself: no driver library, no CUDA
GPU. A local leg inherits this process's CUDA_VISIBLE_DEVICES, so the inventory keeps
only the devices it names, as CUDA would (indices, or `GPU-` UUID prefixes); a docker
leg is given every device (`docker run --gpus all`), so its inventory is all of them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from launcher.config.schema import GpuSpec
from launcher.errors import Refused


@dataclass(frozen=True)
class HostGpus:
    """What the host's driver reports: the visible devices' names, or why there are none."""

    names: tuple[str, ...]
    why_none: str | None = None
    """Why NVML gave no device (no driver library, a failed init), for the refusal's line."""

    def describe(self) -> str:
        if not self.names:
            return f"no CUDA GPU ({self.why_none})" if self.why_none else "no CUDA GPU"
        counts: dict[str, int] = {}
        for name in self.names:
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} x {name}" for name, n in counts.items())


def read_host_gpus(honour_visible: bool = True) -> HostGpus:
    """The host's CUDA GPUs by NVML, in NVML's order, filtered by CUDA_VISIBLE_DEVICES when
    `honour_visible` (a local leg inherits it). Never raises: a host without the driver
    library, or whose driver does not answer, has none, and says why."""
    try:
        import pynvml
    except ImportError:
        return HostGpus((), "nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return HostGpus((), f"NVML: {_nvml_words(err)}")
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            devices.append((index, _text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetName(handle))))
    except pynvml.NVMLError as err:
        return HostGpus((), f"NVML could not list the devices: {_nvml_words(err)}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if honour_visible else None
    names = tuple(name for _, _, name in _visible(devices, visible))
    if not names and devices:
        return HostGpus((), f"CUDA_VISIBLE_DEVICES={visible!r} hides all {len(devices)}")
    return HostGpus(names)


def _visible(devices: list[tuple[int, str, str]], visible: str | None) -> list[tuple[int, str, str]]:
    """The devices CUDA_VISIBLE_DEVICES leaves, in its order. As CUDA reads it: entries are
    indices or UUID prefixes, and the list ends at the first entry that names no device."""
    if visible is None:
        return devices
    kept: list[tuple[int, str, str]] = []
    for entry in (e.strip() for e in visible.split(",")):
        match = None
        if re.fullmatch(r"[0-9]+", entry):
            match = next((d for d in devices if d[0] == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [d for d in devices if d[1].startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in kept:
            break
        kept.append(match)
    return kept


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml_words(err: Exception) -> str:
    text = str(err)
    if "Library Not Found" in text or "LIBRARY_NOT_FOUND" in text:
        return "no NVIDIA driver library (libnvidia-ml.so.1) on this host"
    return text


def name_matches(requested: str, device: str) -> bool:
    """Whether a device NVML names `device` (e.g. 'Tesla T4', 'NVIDIA A100-SXM4-80GB') is the
    accelerator SkyPilot calls `requested` (e.g. 'T4', 'A100-80GB'): each of the request's
    parts is a whole word of the device's name, case aside, so T4 is not T40 and A10 is not
    A100. A name written joined in one and spaced in the other (RTX4090 against 'GeForce RTX
    4090') matches: two neighbouring words of the device's name count as one too."""
    tokens = [t for t in re.split(r"[^A-Z0-9]+", device.upper()) if t]
    words = set(tokens) | {a + b for a, b in zip(tokens, tokens[1:])}  # "RTX 4090" is also RTX4090
    parts = [p for p in re.split(r"[^A-Z0-9]+", requested.upper()) if p]
    return bool(parts) and all(p in words for p in parts)


def check_request(gpus: GpuSpec, nodes: int, backend: str, host: HostGpus) -> None:
    """The gpus guard: the host must have `gpus.count` x `nodes` devices that are `gpus.name`
    (every node of a local or docker leg runs on this machine); else Refused, exit 3."""
    want = gpus.count * nodes
    have = sum(1 for name in host.names if name_matches(gpus.name, name))
    if have >= want:
        return
    shape = f"--gpus {gpus}" + (f" x {nodes} nodes" if nodes > 1 else "")
    raise Refused(
        f"{shape} needs {want} {gpus.name} on this host for the {backend} backend, and it has {host.describe()}",
        hint=f"add --cpu (drop --gpus) for a dress rehearsal of the rung on this machine's CPU, "
        f"or --backend sky to rent {gpus} on a cloud",
    )


def guard_host(gpus: GpuSpec, nodes: int, backend: str) -> None:
    """The plan's gpus guard: this host's GPUs as the backend's leg sees them (a local leg
    inherits CUDA_VISIBLE_DEVICES; a docker leg is given every device) meet the request."""
    check_request(gpus, nodes, backend, read_host_gpus(honour_visible=backend == "local"))

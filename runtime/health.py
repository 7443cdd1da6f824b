"""`health` events: the instance's headroom, read on the instance itself.

Disk free under the leg's working dir, RAM available (/proc/meminfo), and GPU
memory per process (nvidia-smi's compute apps where it exists; the driver's
free/total for this device otherwise). `launcher status` shows the newest one
with its age, on every backend, because it reads them from the leg's log.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from runtime import events


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def gpu_processes(timeout: float = 5.0) -> list[dict[str, Any]] | None:
    """[{pid, name, used_bytes}] from nvidia-smi, or None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    procs = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            procs.append({"pid": int(parts[0]) if parts[0].isdigit() else parts[0], "name": parts[1],
                          "used_bytes": int(parts[2]) << 20})
    return procs


class Health:
    """Emits a `health` event at most every `every` seconds (and on the first call)."""

    def __init__(self, workdir: Path, device: str, every: float) -> None:
        self.workdir, self.device, self.every = workdir, device, every
        self.last = -float("inf")

    def maybe_emit(self, step: int) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        disk = shutil.disk_usage(self.workdir)
        mem = meminfo()
        fields: dict[str, Any] = {"disk_free_bytes": disk.free, "disk_total_bytes": disk.total,
                                  "ram_available_bytes": mem.get("MemAvailable"),
                                  "ram_total_bytes": mem.get("MemTotal")}
        if self.device.startswith("cuda"):
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            fields.update(gpu_free_bytes=free, gpu_total_bytes=total, gpu_processes=gpu_processes())
        else:
            fields.update(gpu=None)
        events.emit("health", step=step, **fields)

"""`health` events: the instance's headroom, read on the instance itself.

Disk free under the leg's working dir, RAM available (/proc/meminfo), GPU
memory per process (nvidia-smi's compute apps where it exists; the driver's
free/total for this device otherwise), and GPU utilisation: the share of time a
kernel was running on each of the node's GPUs, sampled on a background thread
through NVML (nvidia-ml-py, once a second) or, where that is missing,
nvidia-smi (every 5 s: each sample is a process), and averaged over the
interval since the previous `health` event. `launcher status` shows the newest
one with its age, on every backend, because it reads them from the leg's log.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

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
        out = subprocess.run(
            [exe, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    procs = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            procs.append(
                {
                    "pid": int(parts[0]) if parts[0].isdigit() else parts[0],
                    "name": parts[1],
                    "used_bytes": int(parts[2]) << 20,
                }
            )
    return procs


def _nvml_reader(count: int) -> Callable[[], list[float]] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [_nvml_handle(pynvml, i) for i in range(count)]
    except Exception:  # noqa: BLE001 - no driver library, no device: the fallback answers
        return None
    return lambda: [float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles]


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """The NVML handle of torch's device `index` (NVML ignores CUDA_VISIBLE_DEVICES: match by UUID)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def smi_utilisation(ids: list[str], timeout: float = 5.0) -> list[float] | None:
    """nvidia-smi's utilization.gpu (percent) for each device id, or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None or not ids:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", ",".join(ids)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or len(values) != len(ids) or not all(v.isdigit() for v in values):
        return None
    return [float(v) for v in values]


def _smi_ids(count: int) -> list[str]:
    import torch

    ids = []
    for i in range(count):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        ids.append(f"GPU-{uuid}" if uuid is not None else str(i))
    return ids


class Utilisation:
    """Samples GPU utilisation every `period` seconds on a daemon thread; `take()`
    is the summary since the previous take (None before any sample)."""

    def __init__(self, read: Callable[[], list[float] | None], source: str, period: float = 1.0) -> None:
        self.read, self.source, self.period = read, source, period
        self.samples: list[list[float]] = []
        self.since = time.time()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="gpu-util", daemon=True)
        self._thread.start()

    @classmethod
    def for_node(cls, count: int) -> "Utilisation | None":
        read = _nvml_reader(count)
        if read is not None:
            return cls(read, "nvml")
        ids = _smi_ids(count)
        if smi_utilisation(ids) is not None:
            return cls(lambda: smi_utilisation(ids), "nvidia-smi", period=5.0)  # a process per sample
        return None

    def _loop(self) -> None:
        while True:
            try:
                value = self.read()
            except Exception:  # noqa: BLE001 - a failed read is a missing sample
                value = None
            if value:
                with self._lock:
                    self.samples.append(value)
            time.sleep(self.period)

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            samples, self.samples = self.samples, []
        began, self.since = self.since, time.time()
        if not samples:
            return None
        per_gpu = [sum(col) / len(col) for col in zip(*samples)]
        flat = [v for row in samples for v in row]
        return {
            "mean": round(sum(flat) / len(flat), 2),
            "min": min(flat),
            "max": max(flat),
            "per_gpu": [round(v, 2) for v in per_gpu],
            "samples": len(samples),
            "source": self.source,
            "seconds": round(self.since - began, 1),
        }


class Health:
    """Emits a `health` event at most every `every` seconds (and on the first call)."""

    def __init__(self, workdir: Path, device: str, every: float) -> None:
        self.workdir, self.device, self.every = workdir, device, every
        self.last = -float("inf")
        self.util: Utilisation | None = None
        if device.startswith("cuda"):
            import torch

            self.util = Utilisation.for_node(torch.cuda.device_count())

    def maybe_emit(self, step: int) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        disk = shutil.disk_usage(self.workdir)
        mem = meminfo()
        fields: dict[str, Any] = {
            "disk_free_bytes": disk.free,
            "disk_total_bytes": disk.total,
            "ram_available_bytes": mem.get("MemAvailable"),
            "ram_total_bytes": mem.get("MemTotal"),
        }
        if self.device.startswith("cuda"):
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            fields.update(
                gpu_free_bytes=free,
                gpu_total_bytes=total,
                gpu_processes=gpu_processes(),
                gpu_util=self.util.take() if self.util else None,
            )
        else:
            fields.update(gpu=None)
        events.emit("health", step=step, **fields)

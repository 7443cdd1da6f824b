"""A host with GPUs, for the tests on a machine without one: the stand-in NVML library
(tests/fakes/nvml/fake_nvml.c) built once with the system's C compiler and put first on
LD_LIBRARY_PATH, so the launcher's guard (launcher.backends.hostgpus) reads it through the
real nvidia-ml-py exactly as it reads a driver's. The legs still train on the CPU: what
these tests check is the plan, the quota and the ledger, never a GPU's numbers."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "fakes" / "nvml" / "fake_nvml.c"


def has_real_driver() -> bool:
    """Whether this machine has NVIDIA's own driver library (a GPU machine): a test of a host with
    no driver then has nothing to stand for, and says so."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def fake_nvml_dir() -> Path:
    """A folder holding libnvidia-ml.so.1 built from SOURCE (once per source: xdist's workers
    share it; each builds to a name of its own and renames, so none reads half a file)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"preflight-fake-nvml-{digest}"
    lib = folder / "libnvidia-ml.so.1"
    if lib.exists():
        return folder
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler to build the stand-in NVML library: `make test` installs gcc")
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".libnvidia-ml.so.1.{os.getpid()}"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(part), str(SOURCE)], check=True)
    part.replace(lib)
    return folder


def gpu_host_env(*names: str) -> dict[str, str]:
    """The environment under which this machine's NVML reports `names` (none: a driver with
    no device), for run_cli's `env` or a monkeypatch."""
    old = os.environ.get("LD_LIBRARY_PATH")
    path = str(fake_nvml_dir()) + (f":{old}" if old else "")
    return {"LD_LIBRARY_PATH": path, "FAKE_NVML_GPUS": ";".join(names)}


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """`gpu_host("Tesla T4", 2)`: from here on, this test's launcher runs on a host with two T4s."""

    def make(name: str, count: int) -> dict[str, str]:
        env = gpu_host_env(*([name] * count))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return env

    return make

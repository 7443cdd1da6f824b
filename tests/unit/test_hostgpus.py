"""The gpus guard's parts (launcher.backends.hostgpus): a request's name against the names a
driver gives, CUDA_VISIBLE_DEVICES read as CUDA reads it, and the inventory through the real
nvidia-ml-py against the stand-in driver library (tests/gpuhost.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launcher.backends.hostgpus import HostGpus, _visible, check_request, name_matches
from launcher.config.schema import parse_gpus
from launcher.errors import Refused
from tests.gpuhost import gpu_host_env, has_real_driver

# (SkyPilot's accelerator name, a name NVML gives, the same GPU?)
NAMES = [
    ("T4", "Tesla T4", True),
    ("T4", "NVIDIA T400", False),
    ("L4", "NVIDIA L4", True),
    ("L4", "NVIDIA L40S", False),
    ("L40S", "NVIDIA L40S", True),
    ("A10", "NVIDIA A10", True),
    ("A10", "NVIDIA A100-SXM4-40GB", False),
    ("A10G", "NVIDIA A10G", True),
    ("A100", "NVIDIA A100-SXM4-40GB", True),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
    ("A100-80GB", "NVIDIA A100-SXM4-40GB", False),
    ("H100", "NVIDIA H100 80GB HBM3", True),
    ("H100", "NVIDIA H200", False),
    ("h100", "NVIDIA H100 PCIe", True),
    ("V100", "Tesla V100-SXM2-16GB", True),
    ("RTX4090", "NVIDIA GeForce RTX 4090", True),
    ("RTX4090", "NVIDIA GeForce RTX 4080", False),
]


@pytest.mark.parametrize(("requested", "device", "same"), NAMES)
def test_a_request_names_the_device_a_driver_names(requested: str, device: str, same: bool) -> None:
    assert name_matches(requested, device) is same


DEVICES = [(0, "GPU-aaaa-0", "Tesla T4"), (1, "GPU-bbbb-1", "Tesla T4"), (2, "GPU-cccc-2", "NVIDIA A10G")]


@pytest.mark.parametrize(
    ("visible", "kept"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first entry naming no device
        ("0,0", [0]),  # and a device named twice is not two
        ("GPU-bbbb", [1]),
        ("GPU-", []),  # a UUID prefix naming several names none
        ("-1", []),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str | None, kept: list[int]) -> None:
    assert [d[0] for d in _visible(DEVICES, visible)] == kept


def test_the_guard_counts_every_node_and_names_the_ways_on() -> None:
    two_t4 = HostGpus(("Tesla T4", "Tesla T4", "NVIDIA A10G"))
    check_request(parse_gpus("T4:2"), 1, "local", two_t4)
    check_request(parse_gpus("T4:1"), 2, "docker", two_t4)
    with pytest.raises(Refused) as err:
        check_request(parse_gpus("T4:2"), 2, "local", two_t4)  # every node of a local leg is on this host
    assert err.value.exit_code == 3
    assert (
        "--gpus T4:2 x 2 nodes needs 4 T4" in err.value.message and "2 x Tesla T4, 1 x NVIDIA A10G" in err.value.message
    )
    assert "--cpu" in err.value.hint and "--backend sky" in err.value.hint
    with pytest.raises(Refused, match="has no CUDA GPU \\(NVML: Driver Not Loaded\\)"):
        check_request(parse_gpus("A10G:1"), 1, "local", HostGpus((), "NVML: Driver Not Loaded"))


READ = "import json; from launcher.backends.hostgpus import read_host_gpus as r; h = r({}); print(json.dumps([h.names, h.why_none]))"


def _read(env: dict[str, str], honour_visible: bool = True) -> list:
    full = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")} | env
    out = subprocess.run(
        [sys.executable, "-c", READ.format(honour_visible)], env=full, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_the_inventory_is_the_drivers_as_a_leg_sees_it() -> None:
    """Through the real nvidia-ml-py: no driver library, a driver that fails, one that lists devices
    (a local leg's view under CUDA_VISIBLE_DEVICES; a docker leg's, every device)."""
    if not has_real_driver():
        names, why = _read({})
        assert names == [] and "libnvidia-ml.so.1" in why
    names, why = _read(gpu_host_env("Tesla T4") | {"FAKE_NVML_INIT_ERROR": "9"})
    assert names == [] and why == "NVML: Driver Not Loaded"
    host = gpu_host_env("Tesla T4", "NVIDIA A10G", "Tesla T4")
    assert _read(host) == [["Tesla T4", "NVIDIA A10G", "Tesla T4"], None]
    assert _read(host | {"CUDA_VISIBLE_DEVICES": "2,1"}) == [["Tesla T4", "NVIDIA A10G"], None]
    names, why = _read(host | {"CUDA_VISIBLE_DEVICES": ""})
    assert names == [] and "hides all 3" in why
    assert _read(host | {"CUDA_VISIBLE_DEVICES": ""}, honour_visible=False)[0] == [
        "Tesla T4",
        "NVIDIA A10G",
        "Tesla T4",
    ]

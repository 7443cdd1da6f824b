"""Where the GPU-hours go: FLOPs per token (counted vs the formula), MFU against the
vendors' dense peaks, GPU utilisation and why the GPU idles, and what efficiency
would buy. Synthetic events where the arithmetic is checked by hand; the real
counter on the reference model."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from launcher.checks.evidence import LegEvents
from launcher.efficiency import (
    REACHABLE_MFU,
    check_efficiency,
    efficiency,
    idle_breakdown,
    levers,
    utilisation,
    what_if,
)
from runtime.contract import check_event
from runtime.measure.flops import StepFlops, transformer_flops_per_token
from runtime.measure.health import smi_utilisation
from runtime.peaks import gpu_of_device_name, peak_flops
from runtime.reference.model import GPT, GPTConfig

TPS = 16 * 1024  # tokens per step


def leg(
    tmp_path: Path, *, flops: dict | None, tok_s: float, gpu_phases: bool = False, util: float | None = None
) -> LegEvents:
    """A leg of 60 steps at `tok_s` with a sustained-rate event over steps 21..60."""
    ev: list[dict] = []
    if flops is not None:
        ev.append({"event": "flops", "step": 1, **flops})
    step_s = TPS / tok_s
    for s in range(1, 61):
        e = {
            "event": "step",
            "step": s,
            "loss": 3.0,
            "lr": 1e-3,
            "tokens": s * TPS,
            "step_s": step_s,
            "phases": {
                "data": 0.1 * step_s,
                "compute": 0.001,
                "optimizer": 0.001,
                "sync": 0.0,
                "drain": 0.8 * step_s,
                "ckpt": 0.0,
            },
        }
        if gpu_phases:
            # the device was busy 70 % of the step: 60 % forward/backward, 10 % optimizer
            e["gpu_phases"] = {"data": 0.1 * step_s, "compute": 0.6 * step_s, "optimizer": 0.1 * step_s}
        ev.append(e)
        if util is not None and s % 15 == 0:
            ev.append({"event": "health", "step": s, "gpu_util": {"mean": util, "samples": 10, "source": "nvml"}})
    ev.append(
        {
            "event": "rate",
            "step": 60,
            "tok_s": tok_s,
            "window_first": 21,
            "window_last": 60,
            "seconds": 40 * step_s,
            "rel_err": 0.01,
        }
    )
    log = tmp_path / f"leg-{len(list(tmp_path.iterdir()))}.log"
    log.write_text("".join(json.dumps(dict(e, rank=0)) + "\n" for e in ev))
    return LegEvents.read(0, log)


def test_mfu_on_t4_and_h100_is_the_hand_computed_figure(tmp_path: Path) -> None:
    # T4:2, fp16 products: 100 M FLOP/token x 200,000 tok/s = 20 TFLOP/s; peak 65 TFLOP/s each -> 20 / 130
    t4 = efficiency(
        leg(tmp_path, flops={"flops_per_token": 1e8, "dtype": "fp16", "device_name": "Tesla T4"}, tok_s=200_000),
        "T4",
        2,
    )
    assert t4["flop_s"] == pytest.approx(2e13) and t4["peak_flop_s"] == pytest.approx(65e12)
    assert t4["mfu"] == pytest.approx(20 / 130)
    # H100:8 bf16: 1.2 G FLOP/token x 1.0 M tok/s = 1.2 PFLOP/s over 8 x 989.5 TFLOP/s
    h100 = efficiency(
        leg(
            tmp_path,
            flops={"flops_per_token": 1.2e9, "dtype": "bf16", "device_name": "NVIDIA H100 80GB HBM3"},
            tok_s=1e6,
        ),
        "H100",
        8,
    )
    assert h100["mfu"] == pytest.approx(1.2e15 / (8 * 989.5e12))
    check = check_efficiency(leg(tmp_path, flops={"flops_per_token": 1e8, "dtype": "fp16"}, tok_s=200_000), "T4", 2)
    assert check.ok and "MFU 15.4 % of 2 x T4's dense fp16 peak (65 TFLOP/s each" in check.detail


def test_no_peak_known_says_so_instead_of_a_number(tmp_path: Path) -> None:
    cpu = efficiency(
        leg(tmp_path, flops={"flops_per_token": 8e5, "dtype": "fp32", "device_name": "cpu"}, tok_s=20_000), None, 0
    )
    assert cpu["mfu"] is None and cpu["mfu_note"] == "no peak is known for a CPU"
    assert cpu["flop_s"] == pytest.approx(1.6e10)
    check = check_efficiency(leg(tmp_path, flops={"flops_per_token": 8e5, "dtype": "fp32"}, tok_s=20_000), None, 0)
    assert "16 GFLOP/s at the sustained rate; no MFU: no peak is known for a CPU" in check.detail
    assert peak_flops("T4", "bf16") == (None, "a T4 has no bf16 tensor cores")
    assert peak_flops("V100", "fp16")[0] is None and "V100" in peak_flops("V100", "fp16")[1]
    # the device's own name wins over the ledger's, and a PCIe part is not priced as an SXM one
    pcie = efficiency(
        leg(tmp_path, flops={"flops_per_token": 1e8, "dtype": "bf16", "device_name": "NVIDIA H100 PCIe"}, tok_s=1e5),
        "H100",
        1,
    )
    assert pcie["mfu"] is None and "NVIDIA H100 PCIe" in pcie["gpu_note"]
    assert gpu_of_device_name("NVIDIA A100-SXM4-80GB") == "A100" and gpu_of_device_name("NVIDIA A10") is None


def test_the_flop_counter_agrees_with_the_formula_on_the_reference_model() -> None:
    for cfg in (GPTConfig(), GPTConfig(256, 128, 4, 4, 128)):
        model, batch = GPT(cfg), 4
        x = torch.randint(0, cfg.vocab, (batch, cfg.block))
        opt = torch.optim.AdamW(model.parameters())
        with StepFlops() as counted:
            model(x, x).backward()
            opt.step()
        per_token = counted.total / (batch * cfg.block)
        n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
        formula = transformer_flops_per_token(n, cfg.n_layer, cfg.n_embd, cfg.block)
        assert abs(per_token / formula - 1) < 0.10, (cfg, per_token, formula)
        assert counted.by_dtype.keys() == {"fp32"} and not counted.errors
    # attention is counted on a CPU too (PyTorch's registry leaves the CPU kernel out)
    with StepFlops() as bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x, x).backward()
    assert bf16.dominant_dtype() == "bf16" and bf16.total == counted.total  # the optimizer adds no products


def test_gpu_idle_share_and_its_causes(tmp_path: Path) -> None:
    ev = leg(
        tmp_path,
        flops={"flops_per_token": 1e8, "dtype": "fp32", "device_name": "Tesla T4"},
        tok_s=10_000,
        gpu_phases=True,
        util=70.0,
    )
    idle = idle_breakdown(ev)
    # NVML said 70 % busy; off the GPU: 10 % data wait, the rest of the wall time host overhead
    assert idle["idle"] == pytest.approx(0.30) and idle["busy_source"] == "nvml"
    assert idle["causes"]["data"] == pytest.approx(0.10) and idle["causes"]["host"] == pytest.approx(0.20)
    assert utilisation(ev)["samples"] == 30  # the first health interval (build, warm-up) is left out
    e = efficiency(ev, "T4", 1)
    named = " | ".join(levers(e, ev, {"overhead": 0.08}))
    assert "fp16 autocast" in named and "8.0x its fp32 peak" in named
    assert (
        "data wait is 10 %" in named and "host overhead is 20 %" in named and "saves cost 8.0 % of step time" in named
    )
    assert "async checkpointing takes the write off it" in named
    # without NVML the CUDA events bound the busy share from above
    no_util = idle_breakdown(leg(tmp_path, flops=None, tok_s=10_000, gpu_phases=True))
    assert no_util["idle"] == pytest.approx(0.30) and "cuda events" in no_util["busy_source"]
    # a CPU leg has no device phases: nothing to say about GPU idle
    assert idle_breakdown(leg(tmp_path, flops=None, tok_s=10_000)) is None


def test_what_efficiency_would_buy(tmp_path: Path) -> None:
    e = efficiency(
        leg(tmp_path, flops={"flops_per_token": 1e8, "dtype": "fp32", "device_name": "Tesla T4"}, tok_s=20_000), "T4", 2
    )
    w = what_if(e, run_steps=100_000, tokens_per_step=TPS, eta_hours=100_000 * TPS / 20_000 / 3600, gpu_count=2)
    run_flops = 100_000 * TPS * 1e8
    assert w["run_flops"] == pytest.approx(run_flops)
    assert w["measured_mfu"] == pytest.approx(2e12 / (2 * 8.1e12))
    r = w["reachable"]
    assert r["dtype"] == "fp16" and r["mfu"] == REACHABLE_MFU
    assert r["eta_hours"] == pytest.approx(run_flops / (0.40 * 65e12 * 2) / 3600)
    assert r["gpu_hours"] == pytest.approx(2 * r["eta_hours"])
    cpu = what_if(
        efficiency(leg(tmp_path, flops={"flops_per_token": 1e8, "dtype": "fp32"}, tok_s=20_000), None, 0),
        100,
        TPS,
        None,
        0,
    )
    assert cpu["reachable"] is None and "CPU" in cpu["reachable_note"]


def test_nvidia_smi_utilisation_is_parsed_and_refused_when_malformed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0,1 prints one number per line
    smi.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\nprintf "87\\n 12\\n"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert smi_utilisation(["0", "1"]) == [87.0, 12.0]
    assert (tmp_path / "argv").read_text().split() == [
        "--query-gpu=utilization.gpu",
        "--format=csv,noheader,nounits",
        "-i",
        "0,1",
    ]
    smi.write_text('#!/bin/sh\nprintf "[N/A]\\n"\n')
    assert smi_utilisation(["0"]) is None
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert smi_utilisation(["0"]) is None


def test_efficiency_fields_are_checked_like_every_event() -> None:
    assert check_event({"event": "flops", "step": 1, "flops_per_token": 8e5}) is None
    assert check_event({"event": "flops", "step": 1, "flops_per_token": None, "note": "no tokens"}) is None
    assert "flops_per_token" in check_event({"event": "flops", "step": 1, "flops_per_token": "1e9"})
    assert "gpu_phases" in check_event(
        {"event": "step", "step": 1, "loss": 1.0, "lr": 0.1, "gpu_phases": {"compute": -1}}
    )
    assert "gpu_util" in check_event({"event": "health", "gpu_util": {"mean": 180}})
    assert "mfu" in check_event(
        {
            "event": "rate",
            "step": 1,
            "tok_s": 1.0,
            "window_first": 0,
            "window_last": 1,
            "seconds": 1.0,
            "rel_err": None,
            "mfu": "high",
        }
    )


def test_a_compiled_model_still_compiles_after_its_step_was_counted() -> None:
    from torch._dynamo.utils import counters

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    fast = torch.compile(model, backend="eager")  # dynamo's capture without inductor's C++ build
    x = torch.randn(4, 8)
    with StepFlops() as counted:
        fast(x).sum().backward()
    assert counted.total == 6 * 4 * (8 * 8 + 8 * 1) - 2 * 4 * 8 * 8  # no grad for the input: one product fewer
    before = counters["stats"].get("unique_graphs", 0)
    fast(x).sum().backward()
    assert counters["stats"].get("unique_graphs", 0) > before  # dynamo captured it: the count did not disable it

"""Where the GPU-hours go: FLOPs, MFU, GPU utilisation, and what efficiency would buy.

Read from a leg's events, re-derived here rather than taken from the trainer's
own `mfu` field: FLOPs per token from the `flops` event (counted by the leg API
on the leg's first step, runtime.measure.flops), the sustained rate from the `rate`
event, the GPU type from the device's own name (checked against the ledger's),
and the dense peak from runtime.peaks. MFU = tok/s x FLOPs/token / (peak per GPU
x GPUs). Where no peak is known (a CPU, an unlisted GPU, a dtype the GPU has no
unit for) it says so instead of printing a number.
"""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents
from launcher.checks.measure import step_breakdown, sustained
from runtime.peaks import PEAKS, gpu_of_device_name, peak_flops

REACHABLE_MFU = 0.40
REACHABLE_WHY = (
    "40 % of the bf16 dense peak: what well-tuned decoder-transformer training reports "
    "(PaLM 540B 46.2 %, Chowdhery et al. 2022; Llama 3 405B 38-43 %, Dubey et al. 2024); "
    "models under ~1B parameters rarely get there (their kernels are too small to fill the GPU)"
)
FORMULA_TOLERANCE = 0.10
"""The count and the 6N + 12LdT formula must agree within 10 % to call the formula a cross-check."""


def flops_of(ev: LegEvents) -> dict[str, Any] | None:
    item = ev.last("flops")
    if item is None or not item[1].get("flops_per_token"):
        return None
    return {**item[1], "evidence": ev.pointer(item)}


def gpu_type(ev: LegEvents, ledger_gpu: str | None) -> tuple[str | None, str | None]:
    """(the peak table's GPU key, a note when the device and the ledger disagree).
    The device's own name wins: it was read on the instance."""
    f = ev.last("flops")
    name = f[1].get("device_name") if f else None
    if not ledger_gpu:
        return None, None
    if not name or name == "cpu":
        return ledger_gpu.upper(), None
    found = gpu_of_device_name(str(name))
    if found is None:
        return None, f"the device reports {name!r}, which the peak table does not list"
    asked = PEAKS.get(ledger_gpu.upper())
    if asked is None or asked is not PEAKS.get(found):
        return found, f"the device reports {name!r} ({found}), not the {ledger_gpu} the ledger asked for"
    return found, None


def efficiency(ev: LegEvents, ledger_gpu: str | None, gpus: int) -> dict[str, Any] | None:
    """FLOPs per token, FLOP/s at the sustained rate, MFU (or why none)."""
    f, s = flops_of(ev), sustained(ev)
    if f is None:
        return None
    fpt = float(f["flops_per_token"])
    out: dict[str, Any] = {
        "flops_per_token": fpt,
        "method": f.get("method", "counted"),
        "dtype": f.get("dtype") or "fp32",
        "by_dtype": f.get("by_dtype"),
        "formula_flops_per_token": f.get("formula_flops_per_token"),
        "device_name": f.get("device_name"),
        "evidence": f["evidence"],
    }
    formula = f.get("formula_flops_per_token")
    if formula:
        out["formula_ratio"] = fpt / float(formula)
    gpu, note = gpu_type(ev, ledger_gpu)
    out.update(gpu=gpu, gpus=gpus, gpu_note=note)
    if gpus and gpu:
        peak, why = peak_flops(gpu, out["dtype"])
    else:
        peak, why = None, (note if gpus else "no peak is known for a CPU")
    out.update(peak_flop_s=peak, mfu_note=None if peak else why)
    last_rate = ev.last("rate")
    out["compiled"] = bool(last_rate[1].get("compiled")) if last_rate else None
    if s is not None:
        out["flop_s"] = s["tok_s"] * fpt
        out["mfu"] = out["flop_s"] / (peak * gpus) if peak else None
        out["evidence"] = out["evidence"] + s["evidence"]
    return out


def tflops(x: float) -> str:
    return f"{x / 1e12:,.3g} TFLOP/s" if x >= 1e11 else f"{x / 1e9:,.3g} GFLOP/s"


def describe(e: dict[str, Any]) -> str:
    text = f"{e['flops_per_token'] / 1e6:,.2f} MFLOP/token ({e['method']} on one step"
    if e.get("formula_ratio"):
        text += f"; 6N + 12LdT gives {e['formula_flops_per_token'] / 1e6:,.2f}, {100 * (e['formula_ratio'] - 1):+.1f} %"
    text += f"), {e['dtype']} products"
    if "flop_s" in e:
        text += f"; {tflops(e['flop_s'])} at the sustained rate"
    if e.get("mfu") is not None:
        text += (
            f" = MFU {100 * e['mfu']:.1f} % of {e['gpus']} x {e['gpu']}'s dense {e['dtype']} peak "
            f"({tflops(e['peak_flop_s'])} each, runtime/peaks.py)"
        )
    else:
        text += f"; no MFU: {e['mfu_note']}"
    if e.get("gpu_note"):
        text += f" ({e['gpu_note']})"
    return text


def check_efficiency(ev: LegEvents, ledger_gpu: str | None, gpus: int, run_steps: int | None = None) -> Check | None:
    e = efficiency(ev, ledger_gpu, gpus)
    if e is None:
        return None  # a trainer without the leg API's count: nothing to say, nothing to fail
    detail = describe(e)
    s = sustained(ev)
    if run_steps and gpus and s and s["tokens_per_step"] and e.get("mfu") is not None:
        w = what_if(e, run_steps, s["tokens_per_step"], run_steps * s["tokens_per_step"] / s["tok_s"] / 3600, gpus)
        detail += "; " + describe_what_if(w)
    return Check(f"leg {ev.leg}: FLOPs and MFU", True, detail, e["evidence"], kind=Kind.MFU, leg=ev.leg)


def describe_what_if(w: dict[str, Any]) -> str:
    text = (
        f"the run's {w['run_flops']:.3g} FLOPs take {w['eta_hours']:,.2f} h = {w['gpu_hours']:,.2f} GPU-h at this MFU"
    )
    r = w.get("reachable")
    if r:
        text += (
            f", {r['eta_hours']:,.2f} h = {r['gpu_hours']:,.2f} GPU-h at a reachable {100 * r['mfu']:.0f} % "
            f"of the {r['dtype']} peak"
        )
    return text


# --- GPU utilisation and why the GPU idles -------------------------------------------

IDLE_CAUSES = {"data": "data wait", "host": "host overhead", "sync": "sync", "ckpt": "checkpoint"}


def utilisation(ev: LegEvents) -> dict[str, Any] | None:
    """Mean GPU utilisation over the `health` events' samples (every rank's node), past the first."""
    found = [(n, e) for n, e in ev.all("health", rank=None) if isinstance(e.get("gpu_util"), dict)]
    if len(found) > 1:
        found = found[1:]  # the first interval is the build and the warm-up
    samples = sum(int(e["gpu_util"].get("samples", 1)) for _, e in found)
    if not found or not samples:
        return None
    mean = sum(float(e["gpu_util"]["mean"]) * int(e["gpu_util"].get("samples", 1)) for _, e in found) / samples
    return {
        "busy": mean / 100.0,
        "samples": samples,
        "source": found[-1][1]["gpu_util"].get("source"),
        "evidence": ev.pointer(found[0]) + ev.pointer(found[-1]),
    }


def idle_breakdown(ev: LegEvents) -> dict[str, Any] | None:
    """On a GPU: the share of wall time the device idled, and why (from the step breakdown)."""
    b = step_breakdown(ev)
    if b is None or not b.get("device"):
        return None
    shares = b["shares"]
    causes = {
        "data": shares.get("data", 0.0),
        "host": shares.get("host", 0.0),
        "sync": shares.get("sync", 0.0),
        "ckpt": shares.get("ckpt", 0.0),
    }
    util = utilisation(ev)
    busy = util["busy"] if util else b["device_busy"]
    return {
        "idle": max(0.0, 1.0 - busy),
        "busy_source": util["source"] if util else "cuda events (an upper bound)",
        "samples": util["samples"] if util else None,
        "causes": causes,
        "evidence": b["evidence"] + (util["evidence"] if util else ()),
    }


def describe_idle(i: dict[str, Any]) -> str:
    why = ", ".join(f"{IDLE_CAUSES[k]} {100 * v:.1f} %" for k, v in sorted(i["causes"].items(), key=lambda kv: -kv[1]))
    src = f"{i['busy_source']}, {i['samples']} samples" if i["samples"] else i["busy_source"]
    return f"GPU idle {100 * i['idle']:.0f} % of wall time ({src}); step time off the GPU: {why}"


def check_utilisation(ev: LegEvents) -> Check | None:
    i = idle_breakdown(ev)
    if i is None:
        return None
    return Check(
        f"leg {ev.leg}: GPU utilisation", True, describe_idle(i), i["evidence"], kind=Kind.GPU_UTILISATION, leg=ev.leg
    )


# --- what efficiency would buy ---------------------------------------------------------


def best_dtype(gpu: str | None) -> str | None:
    for dtype in ("bf16", "fp16"):
        if peak_flops(gpu, dtype)[0]:
            return dtype
    return None


def levers(e: dict[str, Any], ev: LegEvents, checkpoint: dict[str, Any] | None) -> list[str]:
    """What the probe measured that a change would improve, largest first by what it says."""
    out = []
    best = best_dtype(e.get("gpu"))
    if best and e["dtype"] in ("fp32", "tf32"):
        ratio = (peak_flops(e["gpu"], best)[0] or 0) / (peak_flops(e["gpu"], e["dtype"])[0] or 1)
        out.append(
            f"{best} autocast: the products ran in {e['dtype']}; the {e['gpu']}'s {best} peak is "
            f"{ratio:,.1f}x its {e['dtype']} peak"
        )
    if e.get("compiled") is False:
        out.append("torch.compile: the model ran eagerly (no compiled graph in the leg)")
    b = step_breakdown(ev)
    if b:
        shares = b["shares"]
        if shares.get("data", 0) > 0.05:
            out.append(
                f"the input pipeline: data wait is {100 * shares['data']:.0f} % of step time "
                "(prefetch in a DataLoader with workers, pin memory)"
            )
        if shares.get("host", 0) > 0.10:
            out.append(
                f"batch size: host overhead is {100 * shares['host']:.0f} % of step time, so each step's "
                "kernels are too small to keep the GPU busy"
            )
    cost = (checkpoint or {}).get("overhead") or (b["shares"].get("ckpt", 0.0) if b else 0.0)
    if cost > 0.02:
        save = ev.last("save")
        already = bool(save and save[1].get("async_save"))
        out.append(
            f"checkpointing: saves cost {100 * cost:.1f} % of step time on the critical path at this cadence "
            + (
                "(already asynchronous: save less often)"
                if already
                else "(async checkpointing takes the write off it; or save less often)"
            )
        )
    return out


def what_if(
    e: dict[str, Any], run_steps: int, tokens_per_step: int, eta_hours: float | None, gpu_count: int
) -> dict[str, Any]:
    """ETA and GPU-hours at the measured MFU and at REACHABLE_MFU of the GPU's best peak."""
    total = run_steps * tokens_per_step * e["flops_per_token"]
    out: dict[str, Any] = {
        "run_flops": total,
        "measured_mfu": e.get("mfu"),
        "eta_hours": eta_hours,
        "gpu_hours": eta_hours * gpu_count if eta_hours is not None else None,
    }
    best = best_dtype(e.get("gpu"))
    peak = peak_flops(e.get("gpu"), best)[0] if best else None
    if peak:
        hours = total / (REACHABLE_MFU * peak * gpu_count) / 3600.0
        out["reachable"] = {
            "mfu": REACHABLE_MFU,
            "dtype": best,
            "peak_flop_s": peak,
            "eta_hours": hours,
            "gpu_hours": hours * gpu_count,
            "why": REACHABLE_WHY,
        }
    else:
        out["reachable"] = None
        out["reachable_note"] = e.get("mfu_note") or "no peak is known for this GPU"
    return out

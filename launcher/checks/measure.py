"""The probe's measurements, read from a leg's events: sustained rate, memory
trend, checkpoint-cycle cost. The probe rung checks them; the report re-reads
them from the logs (never trusting a number it cannot point at).

Each function returns a plain dict of numbers plus the event lines they rest
on, or None when the leg printed too little to say anything.
"""

from __future__ import annotations

import statistics
from typing import Any

from launcher.checks.evidence import NO_EVENTS, Check, Kind, LegEvents, Pointer

RATE_REL_ERR_MAX = 0.02
"""The sustained rate must be known to within 2 % (one block standard error)."""
MEMORY_TOLERANCE_FRACTION = 0.02
MEMORY_TOLERANCE_BYTES = 4 << 20
"""Growth between the early and late window below max(2 % of the early value,
4 MiB) reads as flat: host RSS moves by that much without a leak."""
CADENCE_OVERHEAD_MAX = 0.05
"""Checkpoint work on the training loop's critical path, per step, at the
configured cadence: at most 5 % of step time."""


def tokens_per_step(ev: LegEvents) -> int | None:
    for _, e in ev.all("step"):
        if e.get("step") and e.get("tokens"):
            return int(e["tokens"]) // int(e["step"])
    return None


def sustained(ev: LegEvents) -> dict[str, Any] | None:
    """The leg's last `rate` event: the runtime's sustained window (warm-up excluded)."""
    item = ev.last("rate")
    if item is None:
        return None
    e = item[1]
    return {
        "tok_s": float(e["tok_s"]),
        "rel_err": e.get("rel_err"),
        "window_first": int(e["window_first"]),
        "window_last": int(e["window_last"]),
        "window_steps": int(e["window_last"]) - int(e["window_first"]) + 1,
        "seconds": float(e["seconds"]),
        "tokens_per_step": tokens_per_step(ev),
        "evidence": ev.pointer(item),
    }


def check_sustained(ev: LegEvents) -> Check:
    name = f"leg {ev.leg}: sustained rate measured"
    s = sustained(ev)
    if s is None:
        if not ev.all("step"):
            return Check(
                name,
                False,
                NO_EVENTS if not ev.items else "the leg printed no `step` event",
                kind=Kind.SUSTAINED_RATE,
                leg=ev.leg,
            )
        return Check(
            name,
            False,
            "no `rate` event: the leg ran too few steps past the warm-up to measure",
            kind=Kind.SUSTAINED_RATE,
            leg=ev.leg,
        )
    rel = s["rel_err"]
    ok = rel is not None and rel <= RATE_REL_ERR_MAX
    err = "unknown (window too short for block errors)" if rel is None else f"+-{100 * rel:.2f} %"
    return Check(
        name,
        ok,
        f"{s['tok_s']:,.1f} tok/s over steps {s['window_first']}..{s['window_last']} "
        f"({s['window_steps']} steps, {s['seconds']:.1f} s), standard error {err} "
        f"(needs <= {100 * RATE_REL_ERR_MAX:.0f} %)",
        s["evidence"],
        kind=Kind.SUSTAINED_RATE,
        leg=ev.leg,
    )


def memory_trend(ev: LegEvents) -> dict[str, Any] | None:
    """Peak of the cross-rank MAX series, and its growth between an early window
    (a quarter into the leg, past the allocator's warm-up) and the last one."""
    items = ev.all("memory")
    if len(items) < 2:
        return None
    early, late = items[max(1, len(items) // 4)] if len(items) > 2 else items[0], items[-1]
    e0, e1 = early[1], late[1]
    growth = int(e1["peak_max"]) - int(e0["peak_max"])
    steps = int(e1["step"]) - int(e0["step"])
    tolerance = max(MEMORY_TOLERANCE_FRACTION * int(e0["peak_max"]), MEMORY_TOLERANCE_BYTES)
    return {
        "kind": e1.get("kind", "unknown"),
        "peak_bytes": max(int(e["peak_max"]) for _, e in items),
        # the allocator's reserved peak (older legs' events carry only the window's end)
        "reserved_bytes": max(int(e.get("peak_reserved_max", e.get("reserved_max", 0))) for _, e in items),
        "early_step": int(e0["step"]),
        "early_bytes": int(e0["peak_max"]),
        "late_step": int(e1["step"]),
        "late_bytes": int(e1["peak_max"]),
        "growth_bytes": growth,
        "slope_bytes_per_step": growth / steps if steps else 0.0,
        "tolerance_bytes": int(tolerance),
        "flat": growth <= tolerance,
        "series": [(int(e["step"]), int(e["peak_max"])) for _, e in items],
        "evidence": ev.pointer(early) + ev.pointer(late),
    }


def check_memory(ev: LegEvents, run_steps: int) -> Check:
    name = f"leg {ev.leg}: memory flat"
    m = memory_trend(ev)
    if m is None:
        return Check(name, False, "fewer than two `memory` windows", kind=Kind.MEMORY_FLAT, leg=ev.leg)
    what = {"cuda": "GPU memory (peak allocated, max across ranks)", "host_rss": "host RSS (max across ranks)"}.get(
        m["kind"], "memory (peak, max across ranks)"
    )
    detail = (
        f"{what}: {mib(m['early_bytes'])} at step {m['early_step']} -> {mib(m['late_bytes'])} at step "
        f"{m['late_step']} ({m['growth_bytes'] / 2**20:+.1f} MiB; flat within {mib(m['tolerance_bytes'])})"
    )
    if not m["flat"]:
        projected = m["slope_bytes_per_step"] * run_steps
        detail += (
            f"; leaking {m['slope_bytes_per_step'] * 1000 / 2**20:.2f} MiB per 1000 steps: "
            f"+{projected / 2**30:.2f} GiB over the run's {run_steps:,} steps"
        )
    return Check(name, m["flat"], detail, m["evidence"], kind=Kind.MEMORY_FLAT, leg=ev.leg)


def cycle_cost(ev: LegEvents) -> dict[str, Any] | None:
    """Seconds per checkpoint on the critical path (save) and off it (serialise, push,
    verify), the cadence they ran at, and what cadence the numbers allow.

    `save` seconds are the critical path whichever way the leg saved: with the state
    serialised in the background they are the snapshot (+ any wait for the pusher),
    and the `serialized` events carry the serialisation; the checkpoint's bytes are
    the pushed ones (a background `save` only knows the state's tensor bytes)."""
    saves = ev.all("save")
    pushes = ev.all("push")
    serialized = ev.all("serialized")
    verifies = [(n, e) for n, e in ev.all("verify") if e.get("ok")]
    step_s = [float(e["step_s"]) for _, e in ev.all("step") if e.get("step_s")]
    if not saves or not pushes or not verifies or len(step_s) < 2:
        return None
    save_steps = [int(e["step"]) for _, e in saves]
    last_step = max((int(e["step"]) for _, e in ev.all("step")), default=None)
    if len(save_steps) >= 3 and save_steps[-1] == last_step:
        save_steps = save_steps[:-1]  # the leg's final save comes at its end, not at the cadence
    interval = min((b - a for a, b in zip(save_steps, save_steps[1:])), default=None)
    step_time = statistics.median(step_s)
    save_s = statistics.mean(float(e["seconds"]) for _, e in saves)
    push_s = statistics.mean(float(e["seconds"]) for _, e in pushes)
    verify_s = statistics.mean(float(e["seconds"]) for _, e in verifies)
    serialize_s = statistics.mean(float(e["seconds"]) for _, e in serialized) if serialized else 0.0
    waits = ev.all("push_wait")
    overhead = save_s / (interval * step_time) if interval else None
    return {
        "checkpoints": len(saves),
        "bytes": int(pushes[-1][1]["bytes"]),
        "save_s": save_s,
        "push_s": push_s,
        "verify_s": verify_s,
        "serialize_s": serialize_s,
        "background_save": bool(serialized),
        "bytes_read": int(verifies[-1][1]["bytes_read"]),
        "step_s": step_time,
        "interval_steps": interval,
        "overhead": overhead,
        "push_waits": len(waits),
        "wait_s": sum(float(e["seconds"]) for _, e in waits),
        # the cadence that keeps critical-path cost <= 1 %, and the one an upload needs to finish in time
        "min_interval_1pct": max(1, int(-(-save_s // (0.01 * step_time)))) if step_time else None,
        "min_interval_upload": (max(1, int(-(-(serialize_s + push_s + verify_s) // step_time))) if step_time else None),
        "evidence": ev.pointer(saves[-1]) + ev.pointer(pushes[-1]) + ev.pointer(verifies[-1]),
    }


def check_cadence(ev: LegEvents) -> Check:
    name = f"leg {ev.leg}: checkpoint cadence affordable"
    c = cycle_cost(ev)
    if c is None:
        return Check(name, False, "no complete save -> push -> verify cycle to measure", kind=Kind.CADENCE, leg=ev.leg)
    if c["interval_steps"] is None:
        return Check(
            name,
            False,
            f"one checkpoint only ({c['save_s']:.3f} s on the critical path): no cadence to "
            f"measure; under 1 % of step time needs a checkpoint every {c['min_interval_1pct']} steps or more",
            c["evidence"],
            kind=Kind.CADENCE,
            leg=ev.leg,
        )
    ok = c["overhead"] <= CADENCE_OVERHEAD_MAX and c["push_waits"] == 0
    detail = (
        f"every {c['interval_steps']} steps: save {c['save_s']:.3f} s on the critical path = "
        f"{100 * c['overhead']:.2f} % of {c['interval_steps']} x {c['step_s']:.4f} s steps "
        f"(needs <= {100 * CADENCE_OVERHEAD_MAX:.0f} %); "
        + (f"write {c['serialize_s']:.3f} s + " if c["background_save"] else "")
        + f"push {c['push_s']:.3f} s + verify {c['verify_s']:.3f} s "
        f"off it; {c['push_waits']} push waits"
    )
    return Check(name, ok, detail, c["evidence"], kind=Kind.CADENCE, leg=ev.leg)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def pointers_json(pointers: tuple[Pointer, ...]) -> list[dict[str, Any]]:
    return [p.to_json() for p in pointers]


PHASES = {
    "data": ("data wait", "the input pipeline is the bottleneck"),
    "compute": ("forward/backward", "compute-bound: the model's arithmetic is the bottleneck"),
    "optimizer": ("optimizer step", "the optimizer step is the bottleneck"),
    "sync": ("cross-rank sync", "communication between ranks is the bottleneck"),
    "ckpt": (
        "checkpoint saves",
        "checkpoint work on the critical path is the bottleneck: save less often or asynchronously",
    ),
    "drain": ("waiting for the device", "the device's queued work is the bottleneck"),
    "session": ("batch hashing", "the leg API's own per-step cost is the bottleneck"),
    "other": ("untimed trainer code", "the trainer's code outside its timed phases is the bottleneck"),
    "host": (
        "host overhead",
        "the host cannot queue work fast enough to keep the GPU busy: larger batches or torch.compile",
    ),
}
HOST_SIDE = ("data", "sync", "ckpt", "session")


def _device_phases(e: dict[str, Any]) -> dict[str, float]:
    """A GPU step: device seconds for the lapped work (CUDA events), host seconds for the rest,
    and `host` = the wall time neither accounts for (the GPU waited on the host)."""
    host, gpu = e["phases"], e["gpu_phases"]
    out = {k: float(gpu.get(k, 0.0)) for k in ("compute", "optimizer")}
    out.update({k: float(host.get(k, 0.0)) for k in HOST_SIDE})
    wall = float(e.get("step_s") or 0.0) + out["ckpt"]
    out["host"] = max(0.0, wall - sum(out.values()))
    return out


def step_breakdown(ev: LegEvents) -> dict[str, Any] | None:
    """Where step time went over the sustained window (or every step past the
    warm-up when no rate was measured), by phase; background pushes apart. On a GPU
    the lapped phases are the device's own seconds (runtime.measure.steptime)."""
    rate = sustained(ev)
    steps = [(n, e) for n, e in ev.all("step") if isinstance(e.get("phases"), dict)]
    if not steps:
        return None
    if rate is not None:
        lo, hi = rate["window_first"], rate["window_last"]
    else:  # no sustained window: skip the warm-up steps where there are enough, else only the first
        lo, hi = (steps[20 if len(steps) > 25 else min(1, len(steps) - 1)][1]["step"], steps[-1][1]["step"])
    window = [(n, e) for n, e in steps if lo <= e["step"] <= hi] or steps
    device = sum(isinstance(e.get("gpu_phases"), dict) for _, e in window) > len(window) // 2
    if device:
        window = [(n, e) for n, e in window if isinstance(e.get("gpu_phases"), dict)]
    per = [
        _device_phases(e) if device else {k: float(v) for k, v in e["phases"].items() if k in PHASES} for _, e in window
    ]
    totals = {k: sum(p.get(k, 0.0) for p in per) for k in PHASES}
    totals = {k: v for k, v in totals.items() if v > 0 or k in ("data", "compute", "optimizer", "sync", "ckpt")}
    total = sum(totals.values())
    if total <= 0:
        return None
    shares = {k: v / total for k, v in totals.items()}
    top = max(shares, key=shares.get)  # type: ignore[arg-type]
    label, meaning = PHASES[top]
    background = [e for _, e in ev.all("push")] + [e for _, e in ev.all("verify")]
    out = {
        "steps": len(window),
        "from_step": window[0][1]["step"],
        "to_step": window[-1][1]["step"],
        "seconds": totals,
        "shares": shares,
        "largest": top,
        "per_step_s": total / len(window),
        "verdict": f"{label} {100 * shares[top]:.0f} % of step time: {meaning}",
        "background_s": sum(float(e.get("seconds", 0.0)) for e in background),
        "background_events": len(background),
        "device": device,
        "evidence": ev.pointer(window[0]) + ev.pointer(window[-1]),
    }
    if device:
        out["device_busy"] = (totals.get("compute", 0.0) + totals.get("optimizer", 0.0)) / total
    return out


def describe_breakdown(b: dict[str, Any]) -> str:
    shown = [k for k in sorted(b["shares"], key=b["shares"].get, reverse=True) if b["shares"][k] >= 0.0005]
    parts = ", ".join(f"{PHASES[k][0]} {100 * b['shares'][k]:.1f} %" for k in shown)
    how = "; forward/backward and optimizer in the GPU's own time (CUDA events)" if b.get("device") else ""
    return (
        f"steps {b['from_step']}..{b['to_step']} ({b['per_step_s'] * 1000:.1f} ms/step{how}): {parts}. "
        f"{b['verdict']}. Off the critical path: {b['background_events']} push/verify events, "
        f"{b['background_s']:.2f} s (not counted as step time)"
    )


def check_breakdown(ev: LegEvents) -> Check | None:
    b = step_breakdown(ev)
    if b is None:
        return None  # a trainer that does not time its phases: nothing to say, nothing to fail
    return Check(
        f"leg {ev.leg}: where step time goes",
        True,
        describe_breakdown(b),
        b["evidence"],
        kind=Kind.STEP_BREAKDOWN,
        leg=ev.leg,
    )

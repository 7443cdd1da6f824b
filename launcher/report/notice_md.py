"""preflight.md's preemption lines: the final checkpoint against each provider's notice, the
cadence against interruptions, the preemption drills (the numbers: launcher.report.notice)."""

from __future__ import annotations

from typing import Any


def notice_lines(p: dict[str, Any]) -> list[str]:
    lines = _fits(p.get("notice")) + _cadence(p.get("cadence"))
    for d in p.get("drills", []):
        lines.append(f"- **Preemption drill** ({d['run']}): {d['notice']}; work lost: {d['lost']}.")
    for h in p.get("hangs", []):
        verdict = "" if h["ok"] else "**FAIL**: "
        lines.append(f"- **Hang drill** ({h['run']}): {verdict}{h['found']}; work lost: {h['lost']}.")
        if h["stacks"]:
            lines.append(f"  - evidence (every process's stacks at the call): `{h['stacks']}`")
    return lines


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _fits(n: dict[str, Any] | None) -> list[str]:
    if not n:
        return []
    parts = n["parts"]
    per = []
    for f in n["per_provider"]:
        if f["notice_s"] == 0:
            per.append(f"{f['label']}: no notice reaches the trainer (SkyPilot 0.14.1), so it never fits")
        elif f["fits"]:
            per.append(f"fits {f['label']}'s notice ({f['notice_s']:g} s) with a margin of {f['margin_s']:.1f} s")
        else:
            per.append(f"**does not fit {f['label']}'s notice** ({f['notice_s']:g} s) by {-f['margin_s']:.1f} s")
    lost = (
        ""
        if n["lost_steps_max"] is None
        else f" Where it does not fit, a preemption loses the work since the previous verified checkpoint: up to "
        f"{n['lost_steps_max']:,} steps ({n['lost_steps_max'] * n['step_s']:,.1f} s) at the current cadence "
        f"(every {n['interval_steps']} steps)."
    )
    out = [
        f"- **Does the final checkpoint fit a preemption notice?** ({n['run']} leg {n['leg']}, {n['on']}, "
        f"{n['bytes']:,} B) Its last checkpoint (step {n['step']}) was verified {n['seconds']:.2f} s after that "
        f"step ended (save {_seconds(parts['save'])}, write {_seconds(parts['write'])}, push "
        f"{_seconds(parts['push'])}, verify {_seconds(parts['verify'])}, and any earlier push still queued); "
        f"with up to one step ({n['step_s']:.3f} s) before the trainer sees a SIGTERM, it needs "
        f"**{n['needed_s']:.2f} s**: " + "; ".join(per) + "." + lost
    ]
    return out + [f"  - evidence: `{e['log']}` line {e['line']}" for e in n["evidence"]]


def _cadence(c: dict[str, Any] | None) -> list[str]:
    if not c:
        return []
    if "missing" in c:
        return [f"- **Checkpoint cadence against interruptions**: not computed: {c['missing']}."]
    usd = "" if c["usd"] is None else f" = {c['usd']:,.2f} USD"
    unit = "GPU-h" if c["gpus"] else "instance-h (a CPU leg: no GPUs)"
    line = (
        f"- **Checkpoint cadence against interruptions**: C = {c['c_s']:.3f} s per checkpoint on the critical "
        f"path; R = {c['r_s']:.2f} s from relaunch to first step ({c['r_from']}; a cloud adds its provisioning); "
        f"M = {c['m_hours_instance']:g} h per instance ({c['m_source']}) / {c['instances']} instance(s) = "
        f"{c['m_s']:,.0f} s; L = {c['lag_s']:.2f} s from a checkpoint's step to verified. Young's interval "
        f"sqrt(2 C M) = sqrt(2 x {c['c_s']:.3f} x {c['m_s']:,.0f}) = **{c['tau_young_s']:,.1f} s** (about "
        f"{c['young_steps']:,} steps; Daly's {c['tau_daly_s']:,.1f} s); the current cadence is every "
        f"{c['interval_steps']} steps = {c['tau_now_s']:,.2f} s. Goodput (1 - C/tau - (tau/2 + L + R)/M): "
        f"**{100 * c['goodput_now']:.2f} % now, {100 * c['goodput_young']:.2f} % at Young's interval** (Daly's "
        f"model, no L: {100 * c['goodput_exact_now']:.2f} % and {100 * c['goodput_exact_young']:.2f} %). For the "
        f"run's {c['kept_hours']:,.2f} h of training ({c['kept_from']}) that bills {c['billed_now']:,.2f} "
        f"{unit} now and {c['billed_young']:,.2f} at Young's interval: **{c['difference']:+,.2f} {unit}**{usd}."
    )
    ev = [f"  - evidence ({what}): `{e['log']}` line {e['line']}" for what, es in c["evidence"].items() for e in es]
    return [line] + ev

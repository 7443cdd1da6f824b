"""The report's plots, as SVG (launcher.report.svg: matplotlib's import and font set-up were
most of a `launcher report`'s CPU).

Each plot must read on its own, without the markdown beside it: a title that
says what ran where, axes with units, a legend naming every line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.report.runs import RunData, rate_leg
from launcher.report.svg import Chart, Line, Panel

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def draw_all(runs: list[RunData], report: dict[str, Any], folder: Path) -> list[str]:
    """Draw every plot the runs allow into `folder`; returns the file names written."""
    written = []
    leg = rate_leg(runs, gpu=True) or rate_leg(runs, gpu=False)
    if leg is not None:
        written.append(_throughput(*leg, folder))
        mem = _memory(leg[0], leg[1], folder)
        if mem:
            written.append(mem)
    for run in runs:
        if len(run.legs) > 1 and any(ev.all("step") for ev in run.legs):
            written.append(_loss_lr(run, folder))
    return written


def _where(run: RunData) -> str:
    if run.on_gpu:
        return f"{run.rung} run {run.id} on {run.gpus}"
    asked = "" if run.gpus == "CPU" else f" ({run.gpus} asked, legs ran on the CPU)"
    return f"{run.rung} run {run.id} on the CPU{asked}: not the target hardware"


def _throughput(run: RunData, ev: Any, s: dict[str, Any], folder: Path) -> str:
    steps = [(e["step"], e["tok_s"]) for _, e in ev.all("step") if e.get("tok_s")]
    panel = Panel(ylabel="throughput (tokens/s, all ranks)", y_from_zero=True)
    panel.lines.append(Line([a for a, _ in steps], [b for _, b in steps], COLORS[0], "per-step rate", width=0.8))
    panel.spans.append(
        (
            s["window_first"],
            s["window_last"],
            COLORS[2],
            f"sustained window: steps {s['window_first']}..{s['window_last']} (warm-up excluded)",
        )
    )
    err = "" if s["rel_err"] is None else f" +- {100 * s['rel_err']:.2f} %"
    panel.hlines.append(
        Line(
            [],
            [s["tok_s"]],
            COLORS[3],
            f"sustained: {s['tok_s']:,.0f} tokens/s{err}\n(tokens / wall time, checkpoint saves included)",
            width=1.5,
            style="--",
        )
    )
    saves = ev.all("save")
    for i, (_, e) in enumerate(saves):
        label = f"checkpoint save, between steps ({len(saves)}; e.g. {e['seconds']:.2f} s)" if i == 0 else None
        panel.vlines.append(Line([e["step"]], [], COLORS[4], label, width=0.8, style=":"))
    chart = Chart(f"Training throughput per step, leg {ev.leg}\n{_where(run)}", "optimizer step", [panel])
    return _save(chart, folder, "throughput.svg")


def _memory(run: RunData, ev: Any, folder: Path) -> str | None:
    from launcher.checks.measure import memory_trend

    m = memory_trend(ev)
    if m is None:
        return None
    kind = {"cuda": "GPU memory: peak allocated per window", "host_rss": "host RSS per window"}.get(
        m["kind"], "memory per window"
    )
    xs, ys = zip(*m["series"])
    mib = [y / 2**20 for y in ys]
    panel = Panel(ylabel="memory (MiB)", y_from_zero=True, y_top=max(mib) * 1.25)
    panel.lines.append(Line(list(xs), mib, COLORS[0], f"{kind}, max across ranks", marker=True))
    panel.lines.append(
        Line(
            [m["early_step"], m["late_step"]],
            [m["early_bytes"] / 2**20, m["late_bytes"] / 2**20],
            COLORS[3],
            f"slope early -> late: {m['slope_bytes_per_step'] * 1000 / 2**20:+.2f} MiB "
            f"per 1000 steps ({'flat' if m['flat'] else 'LEAKING'})",
            style="--",
        )
    )
    chart = Chart(f"Memory over the leg (leg {ev.leg})\n{_where(run)}", "optimizer step", [panel])
    return _save(chart, folder, "memory.svg")


def _loss_lr(run: RunData, folder: Path) -> str:
    legs = {leg["leg"]: leg for leg in run.row["legs"]}
    top = Panel(ylabel="training loss (nats/token)", legend="upper right")
    bottom = Panel(ylabel="learning rate", legend="upper right")
    for ev in run.legs:
        steps = [e for _, e in ev.all("step")]
        if not steps:
            continue
        color = COLORS[ev.leg % len(COLORS)]
        row = legs.get(ev.leg, {})
        how = (
            " (killed: " + str(row.get("end_reason", "")).split(" at ")[0].removeprefix("drill kill ") + ")"
            if row.get("killed")
            else ""
        )
        xs = [e["step"] for e in steps]
        top.lines.append(Line(xs, [e["loss"] for e in steps], color, f"leg {ev.leg}{how}"))
        bottom.lines.append(Line(xs, [e["lr"] for e in steps], color, f"leg {ev.leg}{how}"))
        resume = ev.first("resume")
        if resume:
            s = resume[1]["from_step"]
            for panel in (top, bottom):
                panel.vlines.append(Line([s], [], color, None, width=1.2, style=":"))
            top.notes.append((s, f"leg {ev.leg} resumes at {s}", color))
    if any(legs[k].get("killed") for k in legs):
        top.lines.append(
            Line(
                [],
                [],
                "gray",
                "a killed leg's steps past the resume point are the\n"
                "uninterrupted reference the resumed leg must retrace",
            )
        )
    chart = Chart(
        f"Loss and learning rate across legs (dotted: resume points)\n{_where(run)}",
        "optimizer step",
        [top, bottom],
        panel_height=300,
        integer_x=True,
    )
    return _save(chart, folder, f"loss_lr-{run.rung}.svg")


def _save(chart: Chart, folder: Path, name: str) -> str:
    (folder / name).write_text(chart.render())
    return name

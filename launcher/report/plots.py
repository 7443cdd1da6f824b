"""The report's PNG plots (matplotlib's object API on its Agg canvas, no pyplot: pyplot's
import and backend set-up were a third of a `launcher report`'s CPU; imported only by
`launcher report`).

Each plot must read on its own, without the markdown beside it: a title that
says what ran where, axes with units, a legend naming every line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.report.runs import RunData, rate_leg

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
    fig, ax = _figure((10, 5.5))
    ax.plot([a for a, _ in steps], [b for _, b in steps], lw=0.8, color=COLORS[0], label="per-step rate")
    ax.axvspan(s["window_first"], s["window_last"], color=COLORS[2], alpha=0.12,
               label=f"sustained window: steps {s['window_first']}..{s['window_last']} (warm-up excluded)")
    err = "" if s["rel_err"] is None else f" +- {100 * s['rel_err']:.2f} %"
    ax.axhline(s["tok_s"], color=COLORS[3], lw=1.5, ls="--",
               label=f"sustained: {s['tok_s']:,.0f} tokens/s{err}\n(tokens / wall time, checkpoint saves included)")
    saves = ev.all("save")
    for i, (_, e) in enumerate(saves):
        ax.axvline(e["step"], color=COLORS[4], lw=0.8, ls=":",
                   label=f"checkpoint save, between steps ({len(saves)}; e.g. {e['seconds']:.2f} s)" if i == 0 else None)
    ax.set_title(f"Training throughput per step, leg {ev.leg}\n{_where(run)}", fontsize=11)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("throughput (tokens/s, all ranks)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    return _save(fig, folder, "throughput.png")


def _memory(run: RunData, ev: Any, folder: Path) -> str | None:
    from launcher.measure import memory_trend

    m = memory_trend(ev)
    if m is None:
        return None
    kind = {"cuda": "GPU memory: peak allocated per window", "host_rss": "host RSS per window"}.get(
        m["kind"], "memory per window")
    fig, ax = _figure((10, 5.5))
    xs, ys = zip(*m["series"])
    ax.plot(xs, [y / 2**20 for y in ys], marker="o", ms=3, lw=1, color=COLORS[0], label=f"{kind}, max across ranks")
    ax.plot([m["early_step"], m["late_step"]], [m["early_bytes"] / 2**20, m["late_bytes"] / 2**20], ls="--",
            color=COLORS[3], label=f"slope early -> late: {m['slope_bytes_per_step'] * 1000 / 2**20:+.2f} MiB "
                                   f"per 1000 steps ({'flat' if m['flat'] else 'LEAKING'})")
    ax.set_title(f"Memory over the leg (leg {ev.leg})\n{_where(run)}", fontsize=11)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("memory (MiB)")
    ax.set_ylim(bottom=0, top=max(ys) / 2**20 * 1.25)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    return _save(fig, folder, "memory.png")


def _loss_lr(run: RunData, folder: Path) -> str:
    legs = {leg["leg"]: leg for leg in run.row["legs"]}
    fig, (top, bottom) = _figure((10, 7.5), rows=2)
    for ev in run.legs:
        steps = [e for _, e in ev.all("step")]
        if not steps:
            continue
        color = COLORS[ev.leg % len(COLORS)]
        row = legs.get(ev.leg, {})
        how = " (killed: " + str(row.get("end_reason", "")).split(" at ")[0].removeprefix("drill kill ") + ")" \
            if row.get("killed") else ""
        xs = [e["step"] for e in steps]
        top.plot(xs, [e["loss"] for e in steps], lw=1, color=color, label=f"leg {ev.leg}{how}")
        bottom.plot(xs, [e["lr"] for e in steps], lw=1, color=color, label=f"leg {ev.leg}{how}")
        resume = ev.first("resume")
        if resume:
            s = resume[1]["from_step"]
            for ax in (top, bottom):
                ax.axvline(s, color=color, ls=":", lw=1.2)
            top.annotate(f"leg {ev.leg} resumes at {s}", (s, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=8, color=color)
    if any(legs[k].get("killed") for k in legs):
        top.plot([], [], color="gray", lw=1, label="a killed leg's steps past the resume point are the\n"
                                                   "uninterrupted reference the resumed leg must retrace")
    top.set_title(f"Loss and learning rate across legs (dotted: resume points)\n{_where(run)}", fontsize=11)
    top.set_ylabel("training loss (nats/token)")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("optimizer step")
    from matplotlib.ticker import MaxNLocator

    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    return _save(fig, folder, f"loss_lr-{run.rung}.png")


def _figure(size: tuple[float, float], rows: int = 1) -> tuple[Any, Any]:
    """A figure on its own Agg canvas (nothing global, nothing to close) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(fig)
    return fig, (fig.subplots(rows, 1, sharex=True) if rows > 1 else fig.subplots())


def _save(fig: Any, folder: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(folder / name)
    return name

"""The live view of a rung's legs: what a person watching `launcher up` needs, no more.

Default: a progress bar per leg on a terminal (step of the leg's steps, loss,
tok/s, the ETA), and one readable line for what matters while it runs: the
leg's start, its resume (from where, at which sample, with which LR), a
checkpoint skipped or failed, a push the loop had to wait for, a warning or
traceback the trainer printed, and how the leg ended. `-v` prints one line for
every event as well (saves, pushes, verifies, prunes, memory, rate, health), and
the runtime's own `log` lines of level info (a line that says nothing is wrong,
such as a leg's notice watcher with no cloud to watch). The leg's log keeps every
line either way; `launcher status` reads it.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runtime.events import DAMAGED, parse_line

QUIET = {
    "session",
    "step",
    "save",
    "serialized",
    "state_digest",
    "trains_from",
    "flops",
    "push",
    "verify",
    "delete_local",
    "prune",
    "memory",
    "rate",
    "health",
}
PUSH_WAIT_SHOWN_S = 0.5


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


def _gib(n: float | None) -> str:
    return "?" if not n else f"{n / 2**30:,.1f} GiB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def _step(e: dict[str, Any]) -> str:
    return f"step {e['step']:>5}  loss {e['loss']:.4f}  lr {e['lr']:.2e}  {e.get('tok_s', 0):,.0f} tok/s"


def _resume(e: dict[str, Any]) -> str:
    parts = [
        f"sample {e['sample_index']}" if "sample_index" in e else None,
        f"batch {e['batch_hash'][:12]}" if "batch_hash" in e else None,
        f"lr {e['lr']:.3e}" if "lr" in e else None,
        f"schedule says {e['lr_expected']:.3e}" if "lr_expected" in e else None,
    ]
    return f"resumed from {e.get('checkpoint', '?')} at step {e['from_step']}: " + ", ".join(p for p in parts if p)


def _resume_skip(e: dict[str, Any]) -> str:
    return f"skipped {e['name']} (never resumed from): {e['reason']}"


def _save(e: dict[str, Any]) -> str:
    return f"saved step {e['step']}: {_mb(e['bytes'])} in {e['seconds']:.2f} s on the critical path"


def _serialized(e: dict[str, Any]) -> str:
    return f"wrote {e.get('name', e['step'])} in the background: {_mb(e.get('bytes'))} in {e.get('seconds', 0):.2f} s"


def _flops(e: dict[str, Any]) -> str:
    if not e.get("flops_per_token"):
        return f"FLOPs not counted: {e.get('note', 'no count')}"
    formula = (
        f"; 6N + 12LdT gives {e['formula_flops_per_token'] / 1e6:,.2f}" if e.get("formula_flops_per_token") else ""
    )
    return (
        f"counted {e['flops_per_token'] / 1e6:,.2f} MFLOP/token on step {e['step']} "
        f"({e.get('dtype', '?')} products on {e.get('device_name', '?')}{formula})"
    )


def _state_digest(e: dict[str, Any]) -> str:
    digests = e.get("digests") or {}
    head = "trains from step" if e["event"] == "trains_from" else "step"
    return f"{head} {e['step']} state digests: " + ", ".join(f"{k} {str(v)[:8]}" for k, v in sorted(digests.items()))


def _push(e: dict[str, Any]) -> str:
    return f"pushed {e['name']}: {_mb(e['bytes'])} in {e['seconds']:.2f} s"


def _verify(e: dict[str, Any]) -> str:
    state = "verified" if e["ok"] else "verification FAILED: " + "; ".join(e.get("failures", []))
    return f"{e['name']} {state} ({e['windows']} windows, {_mb(e['bytes_read'])} read back, {e['seconds']:.2f} s)"


def _delete_local(e: dict[str, Any]) -> str:
    return f"deleted the local {e['name']}: {_mb(e['bytes_freed'])} freed, {_mb(e['free_bytes'])} free"


def _prune(e: dict[str, Any]) -> str:
    return f"pruned {', '.join(e['deleted']) or 'nothing'}; the store keeps {', '.join(e['kept'])}"


def _start(e: dict[str, Any]) -> str:
    return (
        f"started on {e.get('device')}: {e.get('params', 0):,} params, {e.get('world_size', 1)} rank(s), "
        f"to step {e.get('max_steps')}"
    )


def _memory(e: dict[str, Any]) -> str:
    what = "GPU peak" if e.get("kind") == "cuda" else "host RSS"
    return f"memory at step {e['step']}: {what} {_mb(e['peak_max'])} (max across ranks)"


def _rate(e: dict[str, Any]) -> str:
    err = "" if e.get("rel_err") is None else f" +-{100 * e['rel_err']:.1f} %"
    mfu = (
        f"; MFU {100 * e['mfu']:.1f} %"
        if e.get("mfu") is not None
        else f"; {e['flop_s'] / 1e12:,.3g} TFLOP/s"
        if e.get("flop_s")
        else ""
    )
    return (
        f"rate {e['tok_s']:,.0f} tok/s{err} over steps {e['window_first']}..{e['window_last']}{mfu}; "
        f"ETA to step {e.get('total_steps', '?')}: {_duration(e.get('eta_s'))}"
    )


def _health(e: dict[str, Any]) -> str:
    gpu = (
        f", GPU {_gib(e.get('gpu_free_bytes'))} of {_gib(e.get('gpu_total_bytes'))} free"
        if e.get("gpu_total_bytes")
        else ""
    )
    util = e.get("gpu_util")
    if isinstance(util, dict) and util.get("mean") is not None:
        gpu += f", GPU busy {util['mean']:.0f} % ({util.get('source', '?')})"
    return (
        f"instance: disk {_gib(e.get('disk_free_bytes'))} of {_gib(e.get('disk_total_bytes'))} free, "
        f"RAM {_gib(e.get('ram_available_bytes'))} of {_gib(e.get('ram_total_bytes'))} available{gpu}"
    )


def _push_wait(e: dict[str, Any]) -> str:
    return f"the loop waited {e['seconds']:.2f} s at step {e['step']} for the pusher ({e.get('reason', '')})"


def _push_failed(e: dict[str, Any]) -> str:
    return f"push of step {e['step']} FAILED: {e['error']}"


def _stop(e: dict[str, Any]) -> str:
    detail = f": {e['error']}" if e.get("error") else ""
    return f"stopping at step {e.get('step', '?')} ({e['reason']}){detail}"


def _done(e: dict[str, Any]) -> str:
    ok = "verified" if e.get("final_checkpoint_verified", True) else "NOT verified"
    return f"done at step {e['step']}; final checkpoint {ok}"


def _damaged(e: dict[str, Any]) -> str:
    return f"a damaged event line ({e.get('kind') or 'unknown kind'}): {e['reason']}"


def _hold(e: dict[str, Any]) -> str:
    if e.get("until") == "sigterm":
        return f"holds at step {e['step']} for the launcher's SIGTERM"
    return f"holds at step {e['step']} for {e['seconds']:.1f} s, until its deadline is due"


def _notice(e: dict[str, Any]) -> str:
    return f"spot notice from the {e['cloud']} metadata service ({e['detail']}): SIGTERM to the leg"


def _tracked_late(e: dict[str, Any]) -> str:
    state = "its saved state NEVER loaded" if e["saved"] != e["live"] else "loaded as saved by the trainer"
    return f"{e['name']} ({e['kind']}) tracked after the resume from {e['checkpoint']}: {state}"


def _log(e: dict[str, Any]) -> str:
    node = f"(node {e['node']}) " if "node" in e else ""
    return f"{node}{e.get('source') or 'runtime'}: {e['message']}"


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "log": _log,
    "notice": _notice,
    "hold": _hold,
    "step": _step,
    "resume": _resume,
    "resume_skip": _resume_skip,
    "tracked_late": _tracked_late,
    "save": _save,
    "serialized": _serialized,
    "state_digest": _state_digest,
    "trains_from": _state_digest,
    "flops": _flops,
    "push": _push,
    "verify": _verify,
    "delete_local": _delete_local,
    "prune": _prune,
    "start": _start,
    "memory": _memory,
    "rate": _rate,
    "health": _health,
    "push_wait": _push_wait,
    "push_failed": _push_failed,
    "stop": _stop,
    "done": _done,
    DAMAGED: _damaged,
}
"""One readable line per event kind (the log keeps the full JSON line)."""


def event_summary(e: dict[str, Any]) -> str:
    """One readable line for an event: its kind's summary, else its fields."""
    summary = SUMMARIES.get(e["event"])
    if summary is not None:
        return summary(e)
    rest = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("event", "t", "rank"))
    return f"{e['event']}: {rest}"[:300]


class LegView:
    """Receives every output line of every leg (from the backends' pump threads)."""

    def __init__(self, out: Console, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self.progress: Progress | None = None
        self.tasks: dict[int, Any] = {}
        if out.is_terminal and not verbose:
            self.progress = Progress(
                TextColumn("[cyan]leg {task.fields[leg]}[/cyan]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                console=out,
                transient=True,
            )

    def __enter__(self) -> "LegView":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, leg: int, line: str) -> None:
        if leg < 0:  # the launch's own line (a plan warning), no leg's
            self._say(f"[yellow]{escape(line)}[/yellow]")
            return
        event = parse_line(line)
        if event is None:
            if line.strip():
                self._say(f"[dim]leg{leg} |[/dim] {escape(line.rstrip())}")
            return
        if event.get("rank", 0) != 0 and event["event"] not in ("stop", DAMAGED) and not self.verbose:
            return  # every rank prints; one is enough on a console
        self._track(leg, event)
        if self.verbose or self._matters(event):
            self._say(f"[cyan]leg{leg}[/cyan] {escape(event_summary(event))}")

    @staticmethod
    def _matters(e: dict[str, Any]) -> bool:
        """Worth a line without -v: not routine progress, a wait a person would notice, a failure."""
        kind = e["event"]
        if kind == "verify":
            return not e["ok"]
        if kind == "push_wait":
            return e["seconds"] >= PUSH_WAIT_SHOWN_S
        if kind == "stop":
            return e["reason"] != "max_steps"  # `done` says where a routine leg ended
        if kind == "hold":  # a hold for the SIGTERM lasts as long as the launcher takes to read a line
            return e.get("until") != "sigterm"
        if kind == "log":  # info says nothing is wrong (once a line per node per leg, it hid what mattered)
            return e["level"] != "info"
        return kind not in QUIET

    def _say(self, text: str) -> None:
        (self.progress.console if self.progress is not None else self.out).print(text)

    def _track(self, leg: int, e: dict[str, Any]) -> None:
        if self.progress is None:
            return
        kind = e["event"]
        if kind == "start" and leg not in self.tasks:
            for old in self.tasks.values():  # legs run one after another: an earlier one was killed
                self.progress.remove_task(old)
            self.tasks.clear()
            self.tasks[leg] = self.progress.add_task("", total=e.get("max_steps") or None, leg=leg, stats="")
        elif kind == "resume" and leg in self.tasks:
            self.progress.update(self.tasks[leg], completed=e["from_step"])
        elif kind == "step" and leg in self.tasks:
            self.progress.update(
                self.tasks[leg], completed=e["step"], stats=f"loss {e['loss']:.4f}  {e.get('tok_s', 0):,.0f} tok/s"
            )
        elif kind in ("done", "stop") and leg in self.tasks:
            self.progress.remove_task(self.tasks.pop(leg))

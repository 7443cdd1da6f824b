"""What every rung checks of one leg it launched: that it ended on its own (every rank's
`done`, its final checkpoint verified), and that it ran where it should (the accelerator).
The resume checks are launcher.checks.resume."""

from __future__ import annotations

from launcher.backends.local import no_torch_hint
from launcher.checks.evidence import NO_EVENTS, Check, Kind, last_line, silent
from launcher.legs import LegOutcome


def check_leg_exit(out: LegOutcome, sigterm: bool = False) -> Check:
    """The leg ended on its own, with every rank's `done`. After a SIGTERM the launcher sent,
    torchrun itself exits 1 (it re-raises the signal once its workers are done): such a leg
    is judged by its ranks' `done` events, which must all say the final checkpoint verified."""
    ev = out.events
    done = ev.last("done")
    ok = out.result.exit_code == 0 and done is not None and not out.result.killed
    stop = ev.last("stop")
    detail = (
        f"leg {ev.leg} exited {out.result.exit_code} ({out.result.end_reason}) after "
        f"{out.result.wall_seconds:.1f} s" + (f", last step {done[1]['step']}" if done else ", no `done` event")
    )
    if sigterm and not ok and done is not None and not out.result.killed:
        ranks = ev.all("done", rank=None)
        start = ev.first("start")
        world = int(start[1].get("world_size", 1)) if start else 1
        ok = len(ranks) >= world and all(e.get("final_checkpoint_verified") for _, e in ranks)
        detail += f"; every rank of {world} printed `done` with its final checkpoint verified" if ok else ""
    if stop and stop[1].get("error"):
        detail += f"; stopped: {stop[1]['reason']}: {stop[1]['error']}"
    if silent(ev) and out.result.exit_code not in (0, None) and not out.result.killed:
        detail = (
            f"leg {ev.leg} exited {out.result.exit_code} ({out.result.end_reason}) before printing any "
            f"preflight event; the last line of its log: {last_line(ev.log)!r}"
        )
        if hint := no_torch_hint(last_line(ev.log), out.python):
            detail += f"; {hint}"
    elif silent(ev):
        detail = f"leg {ev.leg} ({out.result.end_reason}, exit {out.result.exit_code}): {NO_EVENTS}"
    return Check(f"leg {ev.leg} finished", ok, detail, ev.pointer(done or stop), kind=Kind.LEG_FINISHED, leg=ev.leg)


def check_device(out: LegOutcome) -> Check:
    start = out.events.first("start")
    device = start[1].get("device") if start else None
    return Check(
        f"leg {out.events.leg} ran on the accelerator",
        str(device).startswith("cuda"),
        f"device {device!r}",
        out.events.pointer(start),
        kind=Kind.ON_ACCELERATOR,
        leg=out.events.leg,
    )

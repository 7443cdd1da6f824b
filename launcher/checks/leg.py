"""What every rung checks of one leg it launched: that it ended on its own (every rank's
`done`, its final checkpoint verified), that it stopped the way the launcher ended it (a
SIGTERM, a deadline), and that it ran where it should (the accelerator). The resume checks
are launcher.checks.resume."""

from __future__ import annotations

from launcher.backends.local import no_torch_hint
from launcher.checks.evidence import NO_EVENTS, Check, Kind, last_line, silent
from launcher.leg_env import Ending
from launcher.legs import LegOutcome
from runtime import contract


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


def check_ending(out: LegOutcome, ending: Ending) -> Check | None:
    """The leg stopped the way the launcher ended it."""
    want = "sigterm" if ending.sigterm_at is not None else "deadline" if ending.deadline_s is not None else None
    if want is None:
        return None
    stop = out.events.last("stop")
    got = stop[1].get("reason") if stop else None
    if contract.STOP_REASONS.get(str(got), contract.EXIT_OK) != contract.EXIT_OK:
        return None  # the leg refused or failed by itself first: that stop is the finding, not this one
    detail = f"the launcher ended leg {out.events.leg} by {want}; its `stop` event says {got!r}"
    if got != want:
        detail += _outran(out, "SIGTERM" if want == "sigterm" else "the hold")
    return Check(
        f"leg {out.events.leg} stopped on {want}",
        got == want,
        detail,
        out.events.pointer(stop),
        kind=Kind.STOPPED_AS_ASKED,
        leg=out.events.leg,
        facts={"want": want, "got": got},
    )


def _outran(out: LegOutcome, action: str) -> str:
    """Where the trainer stood when the launcher's stop went out, from its own step times: a
    trainer that ignored it, or one whose steps outran the launcher (then the stop was never
    exercised, and the rung needs more steps, not a fix in the trainer)."""
    if out.acted_at is None:
        if action == "the hold":
            return (
                "; the trainer never held at the planned step (rank 0 printed no `hold` event: a trainer "
                "off the runtime ignores LAUNCHER_HOLD_AT_STEP, and its deadline lands where its speed puts it)"
            )
        return f"; the launcher never sent {action} (rank 0 never printed the step it waits for)"
    steps = [
        (int(e["step"]), float(e["t"]))
        for _, e in out.events.all("step")
        if isinstance(e.get("t"), (int, float)) and isinstance(e.get("step"), int)
    ]
    before = [s for s, t in steps if t <= out.acted_at]
    if not before:
        return ""
    at, last = max(before), max(s for s, _ in steps)
    if action == "SIGTERM" and (died := _died_on_sigterm(out, at)):
        return died
    if at >= last:
        return (
            f"; the trainer had already printed its last step ({last}) when {action} went out: its steps "
            f"outran the launcher, so the stop was never exercised; give the rung more steps"
        )
    return f"; {action} went out at step {at}, and the trainer went on to step {last}"


def _died_on_sigterm(out: LegOutcome, at: int) -> str:
    """A trainer the SIGTERM ended: no `stop` and no `done` event, and a failing exit (-15 or 143:
    the signal's default action; another code: its own handler, or torchrun's 1 after its
    workers died). Its last step is the one the SIGTERM went out at, as for a trainer whose
    steps outran the launcher, but more steps would not help: nothing in it handles the stop."""
    code = out.result.exit_code
    if out.events.last("stop") or out.events.last("done") or code in (0, None) or out.result.killed:
        return ""
    how = {-15: "was ended by the signal itself (exit -15)", 143: "exited 143 (128 + SIGTERM)"}
    return (
        f"; the launcher sent SIGTERM at step {at} and the trainer {how.get(code, f'exited {code}')} without a "
        "`stop` or `done` event: it does not handle the stop, more steps would not help (the "
        "Session's handler comes with `sess.resume()` and acts in `sess.running()`; a framework's "
        "is the adapter's callback: one is missing, or the script replaced the SIGTERM handler)"
    )

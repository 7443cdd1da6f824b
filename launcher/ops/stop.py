"""`launcher stop RUN_ID`: a graceful stop, confirmed.

1. Refuse what cannot be stopped (no such run, already ended, a backend this
   version cannot signal) before anything is recorded.
2. Record the request: from now on the run launches no new leg.
3. SIGTERM the leg: the runtime finishes its step, pushes and verifies a
   final checkpoint, prints `stop` (reason sigterm) and `done`. Where the
   backend deletes the machine right after its SIGTERM (sky: SkyPilot's
   graceful cancel does not wait for the job), that final push races the
   deletion: say so, and first wait (at most `timeout_s`) until the leg has
   verified a checkpoint newer than the newest at the request, or has ended.
4. Wait for the leg to end (the `up` process tears its instance down and
   closes the leg's ledger row), at most `timeout_s`.
5. If it did not, say so and kill it (SIGKILL / docker kill).
6. Confirm the newest verified checkpoint in the store is loadable: fetched
   whole, every file's sha256 against its manifest, the state deserialized
   (`python -m runtime.programs.loadcheck`, in an interpreter with torch).
7. Record the outcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from launcher.backends import backend_class
from launcher.checks.evidence import LegEvents
from launcher.config.schema import Config
from launcher.errors import BadInput
from launcher.ledger.db import Ledger
from launcher.storekey import project_key
from runtime.store.seal import KEY_ENV

KILL_WAIT_S = 60.0
MAX_TIMEOUT_S = 24 * 3600.0
STORE_POLL_S = 2.0
"""Between two reads of the store while a stop waits for a checkpoint (one listing each: the Hub's too)."""


def _leg_row(ledger: Ledger, run_id: str, leg: int) -> dict[str, Any]:
    return next(r for r in ledger.runs(run_id=run_id)[0]["legs"] if r["leg"] == leg)


def _wait_leg_end(ledger: Ledger, run_id: str, leg: int, until: float) -> bool:
    while time.time() < until:
        if _leg_row(ledger, run_id, leg)["ended_at"] is not None:
            return True
        time.sleep(0.25)
    return _leg_row(ledger, run_id, leg)["ended_at"] is not None


def loadcheck(store_uri: str, run_id: str, name: str, key: bytes | None, python: str | None = None) -> dict[str, Any]:
    """Run runtime.programs.loadcheck in a torch interpreter (this one's, by default); the key
    travels in its environment, never on its command line."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    if key is not None:
        env[KEY_ENV] = key.hex()
    proc = subprocess.run(
        [python or sys.executable, "-m", "runtime.programs.loadcheck", store_uri, f"runs/{run_id}", name],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "name": name, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def stop(cfg: Config, run_id: str, timeout_s: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Stop run `run_id` gracefully, confirm its newest verified checkpoint loads, and record
    the outcome (the steps in this module's docstring); what happened, as a dict."""
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # also refuses nan
        raise BadInput(f"--timeout must be above 0 and at most {MAX_TIMEOUT_S:g} s, got {timeout_s:g}")
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    if ledger is None:
        raise BadInput(f"no ledger at {cfg.state_path / 'ledger.db'}: nothing has run yet")
    try:
        run, leg = _stoppable(ledger, run_id)
        backend = backend_class(run["backend"])
        stop_id = ledger.request_stop(run_id, leg["leg"] if leg else None, timeout_s)
        if leg is None:
            ledger.end_stop(stop_id, outcome="no leg running", detail="between legs: no further leg will launch")
            say("no leg was running; the run will launch no further leg")
            return {"run": run_id, "outcome": "no leg running", "stop_id": stop_id}
        began = time.time()
        waited = _checkpoint_first(cfg, ledger, run, leg, began + timeout_s, say) if backend.sigterm_deletes else None
        ended = bool(waited and waited.get("ended"))  # it ended by itself while the stop waited
        graceful = ended or _terminate(backend, ledger, run_id, leg, began, timeout_s, waited, say)
        if not graceful:
            say(f"the leg did not stop within {timeout_s:g} s: killing it")
            backend.signal_leg(leg, signal.SIGKILL)
            _wait_leg_end(ledger, run_id, leg["leg"], time.time() + KILL_WAIT_S)
        out = _confirm(cfg, ledger, run, leg, stop_id, graceful, timeout_s, waited)
        return {**out, "seconds": round(time.time() - began, 1), "stop_id": stop_id}
    finally:
        ledger.close()


def _terminate(
    backend: Any,
    ledger: Ledger,
    run_id: str,
    leg: dict[str, Any],
    began: float,
    timeout_s: float,
    waited: dict[str, Any] | None,
    say: Callable[[str], None],
) -> bool:
    """SIGTERM the leg and wait for its end (its row closed by the `up` process); whether it came
    in time. Where the SIGTERM deletes the machine (`waited`), its end is the provider's teardown,
    not the trainer's push: it gets KILL_WAIT_S at least, whatever the checkpoint's wait took."""
    then = "its machine deleted right after" if waited else f"waiting up to {timeout_s:g} s for its final checkpoint"
    say(f"SIGTERM -> leg {leg['leg']} ({leg['instance']}); {then}")
    backend.signal_leg(leg, signal.SIGTERM)
    until = max(began + timeout_s, time.time() + KILL_WAIT_S) if waited is not None else began + timeout_s
    return _wait_leg_end(ledger, run_id, leg["leg"], until)


def _checkpoint_first(
    cfg: Config, ledger: Ledger, run: dict[str, Any], leg: dict[str, Any], until: float, say: Callable[[str], None]
) -> dict[str, Any]:
    """Before a SIGTERM that deletes the machine right after it: wait until the leg has verified a
    checkpoint newer than the newest one now (the launcher's own read of the store, as `_confirm`
    reads it: runtime.checkpoint.cycle.newest_verified under the project's key), or has ended, or `until`.
    What it waited for and what it got (None: nothing newer in time), the wait shown as it goes."""
    from runtime.store import open_store
    from runtime.store.base import StoreError, newest_verified

    store = open_store(run["store_uri"], f"runs/{run['id']}", key=project_key(cfg.state_path, create=False))
    base, began = newest_verified(store), time.time()
    after = base.name if base else "none yet"
    say(
        f"the {run['backend']} backend's SIGTERM deletes the machine right after it, so the leg's final push "
        f"may not land: waiting up to {until - began:.0f} s for leg {leg['leg']} to verify a checkpoint newer "
        f"than {after} first"
    )
    out: dict[str, Any] = {"after": base.name if base else None, "got": None, "got_step": None}
    while time.time() < until:
        if _leg_row(ledger, run["id"], leg["leg"])["ended_at"] is not None:
            say(f"leg {leg['leg']} ended by itself after {time.time() - began:.1f} s")
            return {**out, "ended": True}
        try:
            newest = newest_verified(store)
        except StoreError as err:  # a store that did not answer this time: asked again
            newest, out["store_error"] = None, str(err)[:200]
        if newest is not None and (base is None or newest.step > base.step):
            say(f"{newest.name} verified {time.time() - began:.1f} s after the request: stopping now")
            return {**out, "got": newest.name, "got_step": newest.step, "seconds": round(time.time() - began, 1)}
        time.sleep(STORE_POLL_S)
    say(f"no checkpoint newer than {after} verified within {until - began:.0f} s: stopping anyway")
    return out


def _stoppable(ledger: Ledger, run_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run and its live leg (None: between legs), or bad input when there is nothing
    this version can stop: no such run, one that ended, a leg its backend cannot signal."""
    from launcher.ops.reconcile import end_dead_runs

    end_dead_runs(ledger)  # a run whose launcher died has ended: nothing to stop
    found = ledger.runs(run_id=run_id)
    if not found:
        raise BadInput(f"no run {run_id!r} in the ledger", hint="`launcher ledger` lists the runs")
    run = found[0]
    if run["ended_at"] is not None:
        raise BadInput(
            f"run {run_id} is not running: it ended ({run['verdict']})",
            hint=f"`launcher status {run_id}` shows where it stopped",
        )
    live = [leg for leg in run["legs"] if leg["ended_at"] is None]
    leg = live[-1] if live else None
    backend_class(run["backend"]).check_signal(run, leg)
    return run, leg


def _confirm(
    cfg: Config,
    ledger: Ledger,
    run: dict[str, Any],
    leg: dict[str, Any],
    stop_id: int,
    graceful: bool,
    timeout_s: float,
    waited: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """After the leg ended: its final events, the newest verified checkpoint and whether it
    loads; the outcome, recorded against the stop request and returned. Where the machine went
    right after the SIGTERM (`waited`: what `_checkpoint_first` got), the checkpoint verified
    before the signal is the stop's final one when the leg's own final push did not land."""
    from runtime.store import open_store
    from runtime.store.base import newest_verified

    run_id = run["id"]
    events = LegEvents.read(leg["leg"], Path(leg["log_path"]))
    stop_ev, done = events.last("stop"), events.last("done")
    final_step = int(done[1]["step"]) if done else (int(stop_ev[1]["step"]) if stop_ev else None)
    key = project_key(cfg.state_path, create=False)
    newest = newest_verified(open_store(run["store_uri"], f"runs/{run_id}", key=key))
    load = (
        loadcheck(run["store_uri"], run_id, newest.name, key) if newest else {"ok": False, "error": "nothing verified"}
    )
    pushed = _pushed_final(stop_ev, done, newest, final_step)
    before = bool(waited and waited.get("got") and newest is not None and newest.step >= waited["got_step"])
    clean = graceful and (pushed or before) and bool(load.get("ok"))
    outcome = (
        "graceful" if clean else "graceful, but not clean" if graceful else f"killed after {timeout_s:g} s timeout"
    )
    last = events.last("step")
    detail = _detail(clean, final_step, newest, load, None if pushed else (last[1]["step"] if last else "none"))
    ledger.end_stop(
        stop_id,
        outcome=outcome,
        final_step=final_step,
        checkpoint=newest.name if newest else None,
        verified=int(newest is not None),
        loadable=int(bool(load.get("ok"))),
        detail=detail,
    )
    return {
        "run": run_id,
        "leg": leg["leg"],
        "outcome": outcome,
        "clean": bool(clean),
        "final_step": final_step,
        "checkpoint": newest.name if newest else None,
        "checkpoint_step": newest.step if newest else None,
        "loadable": load,
        "detail": detail,
        "waited": waited,
    }


def _pushed_final(stop_ev: Any, done: Any, newest: Any, final_step: int | None) -> bool:
    """The leg's own final push landed: it stopped on the SIGTERM, its `done` says verified, and the
    store's newest verified checkpoint is that step's."""
    return (
        stop_ev is not None
        and stop_ev[1].get("reason") == "sigterm"
        and done is not None
        and bool(done[1].get("final_checkpoint_verified"))
        and newest is not None
        and newest.step == final_step
    )


def _detail(clean: bool, final_step: int | None, newest: Any, load: dict[str, Any], lost: Any = None) -> str:
    """The stop's outcome in a line: the final checkpoint, or what a resume falls back to. `lost`: the
    leg's last step seen, where its own final push did not land (the machine went right after the
    SIGTERM) and the checkpoint verified before the signal is the final one."""
    if clean and lost is not None:
        return (
            f"stopped: {newest.name} (step {newest.step}) verified before the machine was deleted, and loadable; "
            f"the leg's own final push after the SIGTERM did not land (its last step seen: {lost})"
        )
    if clean:
        return f"stopped at step {final_step}; final checkpoint {newest.name} verified and loadable"  # type: ignore[union-attr]
    if newest is not None:
        return (
            f"fell back to {newest.name} (step {newest.step}), the newest verified checkpoint left; "
            f"loadable: {bool(load.get('ok'))}" + (f" ({load['error']})" if load.get("error") else "")
        )
    return "no verified checkpoint in the store: a resume starts from scratch"

"""A launcher that died (kill -9, a lost terminal, a crash) leaves its run open in the
ledger, its reservation held and, on the local and docker backends, possibly a leg
still running and its disk. The next launcher command ends all of that:

- in one transaction (`settle_dead`): the reservation settled, the open legs and
  the run ended at the last sign of life, verdict "launcher died";
- then, outside it (`clean_up`): every process of the dead legs killed (by their
  token, as a drill's kill would), their leg dirs removed, their containers removed.

The leash (launcher.backends.leash) usually did the killing already, the moment
the launcher died; this is the check after it. A SkyPilot cluster is asked
after, never assumed gone: still up, its job is cancelled and it is taken down
now; either way its leg is billed to when it stopped (now, or SkyPilot's cost
report), and the run and its reservation are settled again with that.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.ledger.db import Ledger
from launcher.ledger.rows import LegRow


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether a process of this machine is alive (one owned by another user counts);
    given its start time, a reused pid is not it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OverflowError:
        return False
    return started is None or process_start(pid) in (None, started)


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    from launcher.backends.leash import proc_stat

    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _alive(host: str, pid: int, started: int | None) -> bool:
    if host != socket.gethostname():
        return True  # another machine's launcher: not ours to judge
    return pid_alive(pid, started)


@dataclass(frozen=True)
class DeadRun:
    """A run whose launcher died: ended in the ledger now; its legs are cleaned up after."""

    run_id: str
    legs: list[LegRow]


def settle_dead(ledger: Ledger) -> list[DeadRun]:
    """End what a dead launcher left: settle its reservation with what its legs billed
    where they ended, else with the full reservation (the instance may have run to its
    budget); close its open legs and the run ("launcher died"), at the last sign of life
    (its newest log line). One transaction (the caller's, when it holds one); the caller
    then removes what the legs left (`clean_up`)."""
    dead = []
    with ledger.transaction():
        stale = [r for r in ledger.unsettled_reservations() if not _alive(r["host"], r["pid"], r["pid_start"])]
        for r in stale:
            legs = ledger.leg_records(r["run_id"])
            open_legs = [leg for leg in legs if leg["ended_at"] is None]
            billed = sum(leg["billed_gpu_hours"] or 0.0 for leg in legs)
            usd = sum(leg["cost_usd"] or 0.0 for leg in legs)
            if open_legs:  # a leg never recorded its end: assume it ran to its budget
                billed, usd = max(billed, r["gpu_hours"]), max(usd, r["usd"])
            ledger.settle_reservation(r["id"], billed, usd, "reconciled (launcher died)")
            last_sign = max(
                [r["created_at"]]
                + [leg["ended_at"] or leg["started_at"] for leg in legs]
                + [os.path.getmtime(leg["log_path"]) for leg in legs if os.path.isfile(leg["log_path"])]
            )
            for leg in open_legs:
                ledger.end_orphan_leg(r["run_id"], leg["leg"], last_sign)
            ledger.end_orphan_run(r["run_id"], billed, usd, last_sign)
            dead.append(DeadRun(r["run_id"], open_legs))
    return dead


def end_dead_runs(ledger: Ledger) -> list[str]:
    """Reconcile now (a no-op when no launcher died); returns the runs ended. A ledger
    that cannot be written now (locked, read-only, full) is left for the next command."""
    try:
        if not ledger.any_unsettled():
            return []  # the common case, in one indexed read: nothing held, nothing to reconcile
    except sqlite3.Error:
        return []
    try:
        dead = settle_dead(ledger)
    except (sqlite3.Error, LauncherError):
        return []
    clean_up(dead, ledger)
    return [d.run_id for d in dead]


def clean_up(dead: list[DeadRun], ledger: Ledger) -> None:
    """Kill what the dead runs' legs left running and remove their disks."""
    from launcher.backends.leash import kill_leg, leg_token

    for run in dead:
        for leg in run.legs:
            if leg["backend"] == "local":
                kill_leg(leg_token(run.run_id, leg["leg"]), None)
                _remove_leg_dir(Path(leg["instance"]), run.run_id)
            elif leg["backend"] == "docker":
                docker = shutil.which("docker")
                if docker:
                    subprocess.run([docker, "rm", "-f", leg["instance"]], capture_output=True, check=False, timeout=60)
            elif leg["backend"] == "sky":
                _reap_cluster(ledger, run.run_id, leg)


def settle_leg(
    ledger: Ledger,
    run_id: str,
    leg: int,
    ended_at: float,
    reason: str,
    granularity_s: float = 60.0,
    nothing_billed: bool = False,
) -> None:
    """A dead launcher's leg, once its end is known (its cluster downed now, or SkyPilot's
    record): billed from its start to then, at the price it was launched at (nothing, where
    SkyPilot confirms nothing was provisioned); the run and its reservation settled again with
    the sum of the run's legs."""
    from launcher.backends.base import billed_seconds

    with ledger.transaction():
        row = ledger.leg_billing(run_id, leg)
        if row is None:
            return
        seconds = (
            0.0
            if nothing_billed
            else billed_seconds(max(0.0, ended_at - row["started_at"]), granularity_s) * row["nodes"]
        )
        hours = seconds / 3600.0 * row["gpu_count"]
        usd = None if row["hourly_usd"] is None else seconds / 3600.0 * row["hourly_usd"]
        billed, cost = ledger.rebill_leg(
            run_id, leg, ended_at, hours, usd if not nothing_billed else 0.0, reason, seconds
        )
        ledger.settle_run_reservations(
            run_id, billed, cost or 0.0, "reconciled (launcher died; billed to the cluster's end)"
        )


def _reap_cluster(ledger: Ledger, run_id: str, leg: LegRow) -> None:
    """End what the dead leg left on SkyPilot (its request, its cluster or managed job) and bill
    the leg to when it stopped (launcher.backends.sky.reap)."""
    from launcher.backends.sky.api import job_id_of
    from launcher.backends.sky.inflight import PENDING_JOB_PREFIX
    from launcher.backends.sky.reap import reap, reap_job, reap_submit

    instance = leg["instance"]
    try:
        job = job_id_of(instance)
        if instance.startswith(PENDING_JOB_PREFIX):
            reaped = reap_submit(instance[len(PENDING_JOB_PREFIX) :], leg.get("request_id"))
        elif job is not None:
            reaped = reap_job(job)
        else:
            reaped = reap(instance, leg.get("request_id"))
    except LauncherError as err:  # skypilot not installed here: say what to check
        reaped = None
        sys.stderr.write(
            f"note: run {run_id} leg {leg['leg']} ran on cluster {instance}: {err.message}; "
            f"check `sky api status`, `sky status` and `sky down {instance}`\n"
        )
    if reaped is None:
        return
    sys.stderr.write(f"note: run {run_id} leg {leg['leg']} (launcher died): {reaped.detail}\n")
    if reaped.ended_at is not None:
        settle_leg(
            ledger,
            run_id,
            leg["leg"],
            reaped.ended_at,
            f"launcher died; {reaped.detail}",
            nothing_billed=reaped.nothing_billed,
        )


def _remove_leg_dir(path: Path, run_id: str) -> None:
    """Only a leg dir this launcher made: <tmp>/preflight-legs/<run id>-leg<N>-*."""
    from launcher.backends.leash import LEGS_ROOT

    if (
        path.parent.name == LEGS_ROOT
        and path.name.startswith(f"{run_id}-leg")
        and path.is_dir()
        and not path.is_symlink()
    ):
        shutil.rmtree(path, ignore_errors=True)

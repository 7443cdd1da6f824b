"""A launcher that died (kill -9, a lost terminal, a crash) leaves its run open in the
ledger, its reservation held and, on the local and docker backends, possibly a leg
still running and its disk. The next launcher command ends all of that:

- in one transaction (launcher.spend.reconcile): the reservation settled, the open
  legs and the run ended at the last sign of life, verdict "launcher died";
- then, outside it: every process of the dead legs killed (by their token, as a
  drill's kill would), their leg dirs removed, their containers removed.

The leash (launcher.backends.leash) usually did the killing already, the moment
the launcher died; this is the check after it. A SkyPilot cluster is asked
after, never assumed gone: still up, its job is cancelled and it is taken down
now; either way its leg is billed to when it stopped (now, or SkyPilot's cost
report), and the run and its reservation are settled again with that.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from launcher.errors import LauncherError
from launcher.ledger import Ledger

if TYPE_CHECKING:
    from launcher.spend import DeadRun


def end_dead_runs(ledger: Ledger) -> list[str]:
    """Reconcile now (a no-op when no launcher died); returns the runs ended. A ledger
    that cannot be written now (locked, read-only, full) is left for the next command."""
    try:
        if not ledger.conn.execute("SELECT 1 FROM reservations WHERE settled_at IS NULL LIMIT 1").fetchone():
            return []  # the common case, in one indexed read: nothing held, nothing to reconcile
    except sqlite3.Error:
        return []
    from launcher.spend import reconcile

    try:
        with ledger.transaction() as db:
            dead = reconcile(db)
    except (sqlite3.Error, LauncherError):
        return []
    clean_up(dead, ledger)
    return [d.run_id for d in dead]


def clean_up(dead: "list[DeadRun]", ledger: Ledger) -> None:
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
                    subprocess.run([docker, "rm", "-f", leg["instance"]], capture_output=True, check=False,
                                   timeout=60)
            elif leg["backend"] == "sky":
                _reap_cluster(ledger, run.run_id, leg)


def _reap_cluster(ledger: Ledger, run_id: str, leg: dict) -> None:
    """Down the dead leg's cluster if SkyPilot still has it, and bill the leg to when it stopped."""
    from launcher.backends.sky import reap, reap_job
    from launcher.backends.skyjob import job_id_of
    from launcher.spend import settle_leg

    try:
        job = job_id_of(leg["instance"])
        reaped = reap_job(job) if job is not None else reap(leg["instance"])
    except LauncherError as err:  # skypilot not installed here: say what to check
        reaped = None
        sys.stderr.write(f"note: run {run_id} leg {leg['leg']} ran on cluster {leg['instance']}: {err.message}; "
                         f"check `sky status` and `sky down {leg['instance']}`\n")
    if reaped is None:
        return
    sys.stderr.write(f"note: run {run_id} leg {leg['leg']} (launcher died): {reaped.detail}\n")
    if reaped.ended_at is not None:
        settle_leg(ledger, run_id, leg["leg"], reaped.ended_at, f"launcher died; {reaped.detail}")


def _remove_leg_dir(path: Path, run_id: str) -> None:
    """Only a leg dir this launcher made: <tmp>/preflight-legs/<run id>-leg<N>-*."""
    from launcher.backends.leash import LEGS_ROOT

    if path.parent.name == LEGS_ROOT and path.name.startswith(f"{run_id}-leg") and path.is_dir() \
            and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)

"""Every process of a local leg, found and killed together, and killed too when the launcher dies.

A leg is not one pid. torchrun starts its workers in sessions of their own, so
a SIGKILL of the leg's process group once left two workers training to step 40
and writing to the store after the drill had "killed" the leg. So every
process a leg starts inherits PREFLIGHT_LEG_TOKEN in its environment, and the
leg's processes are those whose /proc/<pid>/environ carries it, or that sit in
the leg's session. A kill freezes them all (SIGSTOP, so none can fork another),
then SIGKILLs them, and repeats until none is left.

The leash is a small watcher process per leg (`python -m
launcher.backends.leash TOKEN SID WORKDIR KEEP`) reading a pipe whose write end
only the launcher holds. The launcher writes "done" when it has ended the leg
itself; EOF without "done" means the launcher died (kill -9 included), and the
leash kills every process of the leg and removes its disk: a lost launcher
leaves nothing running. Either way, a process the leg left behind dies.

Standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

NODE_TOKEN_ENV = "PREFLIGHT_NODE_TOKEN"
"""Beside the leg's token, each node of a local leg of several carries its own (`<leg token>:node<R>`):
losing one node kills the processes that carry it (launcher.backends.nodes)."""
TOKEN_ENV = "PREFLIGHT_LEG_TOKEN"  # not LAUNCHER_*: that namespace is the leg contract, the same on every backend
LEGS_ROOT = "preflight-legs"
"""The folder, under the temp dir, that holds the local backend's leg dirs."""


def leg_token(run_id: str, leg: int) -> str:
    """The token every process of leg `leg` of `run_id` carries (run ids are unique)."""
    return f"{run_id}:{leg}"


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session id) of a live process, None if gone."""
    fields = proc_stat(pid)
    return None if fields is None else (fields[0].decode(), int(fields[2]), int(fields[3]))


def _leg_procs(token: str, sid: int | None, var: str = TOKEN_ENV) -> list[tuple[int, int]]:
    """(pid, process group) of each live (non-zombie) process carrying `token`, or in session `sid`."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"\0{var}={token}\0".encode()
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        if sid is not None and st[2] == sid:
            found.append((pid, st[1]))
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = b"\0" + fh.read()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ + b"\0":
            found.append((pid, st[1]))
    return found


def leg_pids(token: str, sid: int | None = None, var: str = TOKEN_ENV) -> list[int]:
    """Live (non-zombie) processes carrying `token`, or in session `sid`."""
    return [pid for pid, _ in _leg_procs(token, sid, var)]


def signal_leg(token: str, sid: int | None, sig: int, group_first: bool = False, var: str = TOKEN_ENV) -> list[int]:
    """Send `sig` once to every process of the leg; returns the pids signalled.

    `group_first` (for a caller that holds the leg's unreaped leader, so `sid` is surely the
    leg's): the leader's process group gets it first, in one call, and the /proc scan then
    reaches only the rest (torchrun's workers, in sessions of their own). The scan reads every
    process's environ: on a host of 370 processes under load it took tens of milliseconds, and
    a trainer of 1.5 ms steps ran 13 steps past a hold before the SIGSTOP landed (3 rehearsals
    in 6 under stress-ng ended leg 1 on its step limit, not its deadline; docs/benchmarks.md, "Load-dependent failures found")."""
    grouped = False
    if group_first and sid is not None:
        try:
            os.killpg(sid, sig)
            grouped = True
        except (ProcessLookupError, PermissionError):
            pass
    procs = _leg_procs(token, sid, var)
    if not procs and sid is not None and not os.path.isdir("/proc"):
        procs = [(sid, sid)]  # no /proc (not Linux): the process group is all we can reach
    pids = []
    for pid, group in procs:
        pids.append(pid)
        if grouped and group == sid:
            continue  # had it from the group signal: a second SIGTERM can mean "die now" to a trainer
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def kill_leg(token: str, sid: int | None, timeout_s: float = 10.0, var: str = TOKEN_ENV) -> int:
    """Freeze, then kill, every process of the leg, until none is left; returns how many died."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = signal_leg(token, sid, signal.SIGSTOP, var=var)  # frozen: none forks another meanwhile
        pids += [p for p in signal_leg(token, sid, signal.SIGSTOP, var=var) if p not in pids]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed.update(pids)
        time.sleep(0.02)
    return len(killed)


def start(
    token: str,
    sid: int | None,
    workdir: Path | None = None,
    keep: bool = False,
    container: str | None = None,
    docker: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start the leash of one leg; write b"done" to its stdin and close it when the leg is over."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # the leash is not part of the leg
    src = str(Path(__file__).resolve().parents[2])  # the launcher's own source, installed or not
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "launcher.backends.leash", "--token", token]
    argv += ["--sid", str(sid)] if sid is not None else []
    argv += ["--workdir", str(workdir)] if workdir is not None else []
    argv += ["--keep"] if keep else []
    argv += ["--container", container, "--docker", docker or "docker"] if container else []
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def release(leash: subprocess.Popen[bytes] | None) -> None:
    """The launcher ended the leg itself: the leash kills what the leg left behind, and exits."""
    if leash is None:
        return
    try:
        leash.communicate(b"done\n", timeout=15)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        leash.kill()
        leash.wait()


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m launcher.backends.leash")
    p.add_argument("--token", required=True)
    p.add_argument("--sid", type=int)
    p.add_argument("--workdir")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--container")
    p.add_argument("--docker", default="docker")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher is not ours
    said = sys.stdin.buffer.read()  # blocks until the launcher closes the pipe, or dies
    done = said.strip() == b"done"
    if not done and args.container:
        subprocess.run([args.docker, "rm", "-f", args.container], capture_output=True, check=False, timeout=120)
    kill_leg(args.token, None if done else args.sid)
    if not done and args.workdir and not args.keep:
        shutil.rmtree(Path(args.workdir), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What each process of a leg is doing, read from outside it: the watchdog's second look at a
suspect leg (docs/watchdog.md). Which rank a process is (the RANK its launcher gave it), its
state (stopped, running, asleep), its CPU so far, and the Python stacks of its threads, read by
py-spy with `--nonblocking` (it reads the process's memory without stopping it, and reads a
stopped one). Nothing is asked of the trainer. Linux (/proc) only; root, or the leg's own user.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.backends.leash import proc_stat

STATES = {"R": "running", "S": "asleep", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped", "Z": "ended"}
COLLECTIVES = re.compile(
    r"\b(all_reduce|allreduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|"
    r"all_to_all\w*|send|recv|irecv|isend|wait)\b"
)
"""A frame of torch.distributed by one of these names: the rank waits on the others."""
COMMS = re.compile(r"(c10d::|gloo::|nccl|c10d_)")
"""A native frame of torch's communication libraries (c10d, gloo, NCCL)."""
WAITING = re.compile(
    r"^(pthread_cond_\w*wait|__?futex\w*|futex\w*|syscall|poll|epoll_wait|__poll|nanosleep|"
    r"clock_nanosleep|sched_yield|std::condition_variable::\w+|std::__condition_variable::\w+|"
    r"__pthread_\w+|std::this_thread::\w+|c10::\w*::wait\w*)$"
)
"""Native frames that only wait: the frame under them is what the thread waits in."""
DUMP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Look:
    pid: int
    rank: int | None
    """RANK from the process's environment (torchrun's workers, the nodes' ranks); None: no rank."""
    state: str
    cpu_s: float
    stack: str = ""
    """py-spy's dump of its threads ("" where none was taken or it failed: `note` says why)."""
    note: str = ""

    def doing(self) -> str:
        """What it was doing, in words: stopped, waiting in a collective (which), or its state."""
        if self.state in ("T", "t"):
            return "stopped (SIGSTOP or a debugger)"
        waiting = collective_in(self.stack)
        if waiting:
            return f"waiting in {waiting}"
        return STATES.get(self.state, f"state {self.state}")

    def line(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a process without a rank"
        top = innermost(self.stack)
        return f"{who} (pid {self.pid}): {self.doing()}, {self.cpu_s:.1f} CPU-s" + (f"; at {top}" if top else "")


def look(pids: list[int], stacks: bool = True) -> list[Look]:
    """A look at each live process of `pids` (a process gone meanwhile is left out)."""
    found = []
    for pid in pids:
        stat = _stat(pid)
        if stat is None:
            continue
        state, cpu = stat
        rank = _rank(pid)
        stack, note = py_spy_dump(pid) if stacks and state not in ("Z",) else ("", "")
        if stack and rank is not None and state == "S" and not collective_in(stack):
            # asleep in a call into torch's C++ (DDP's backward waits there for the gradients'
            # all-reduce): where it sleeps shows only in the native frames. Read pausing it for
            # a moment (py-spy reads native stacks only so); never a stopped process.
            native, _ = py_spy_dump(pid, native=True)
            stack = native or stack
        found.append(Look(pid, rank, state, cpu, stack, note))
    return found


def py_spy_dump(pid: int, timeout_s: float = DUMP_TIMEOUT_S, native: bool = False) -> tuple[str, str]:
    """(py-spy's dump of the process's threads, "") or ("", why there is none). `native`: with
    the C/C++ frames, which py-spy reads only by pausing the process for the dump."""
    exe = py_spy()
    if exe is None:
        return "", "py-spy is not installed"
    try:
        res = subprocess.run(
            [exe, "dump", "--native" if native else "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "", f"py-spy took over {timeout_s:g} s"
    if res.returncode != 0:
        why = next((line for line in res.stderr.splitlines() if line.strip()), "no reason given")
        return "", f"py-spy: {why.strip()}"
    return res.stdout, ""


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def collective_in(stack: str) -> str | None:
    """The collective a dump's main thread waits in, named with its file ("all_reduce
    (torch/distributed/distributed_c10d.py)"), or, in a native dump, the communication library's
    frame it is blocked in right under the wait ("c10d::Reducer::finalize_backward"); or None."""
    frames = _main_thread(stack)
    for frame in frames:
        name, _, where = frame.partition(" (")
        if "torch/distributed" in where and COLLECTIVES.fullmatch(name.strip()):
            return f"{name.strip()} ({where.split(':')[0].split('site-packages/')[-1]})"
    for frame in frames:  # innermost first: past the waiting primitives, the first frame of code
        name = frame.partition(" (")[0].strip()
        if name.startswith("0x") or WAITING.search(name):
            continue
        return f"{name} (native)" if COMMS.match(name) else None
    return None


def innermost(stack: str) -> str:
    """The main thread's innermost frame ("wait_here (train.py:12)"), "" where none."""
    frames = _main_thread(stack)
    return frames[0] if frames else ""


def _main_thread(stack: str) -> list[str]:
    """The frames of the dump's first thread (py-spy lists the main thread first), innermost first."""
    frames: list[str] = []
    seen = False
    for line in stack.splitlines():
        if line.startswith("Thread "):
            if seen:
                break
            seen = True
        elif seen and line.startswith("    ") and line.strip():
            frames.append(line.strip())
    return frames


def _stat(pid: int) -> tuple[str, float] | None:
    """(state letter, user + system CPU seconds) of a live process, None if gone."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    return fields[0].decode(), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rank(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"RANK="):
            value = item[5:].decode(errors="replace")
            return int(value) if value.isdigit() else None
    return None

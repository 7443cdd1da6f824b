"""Where `make test`'s CPU goes, process by process: the kernel's process accounting (every
process that ended, killed ones included, with its own user + system CPU, its pid and parent)
read against the tests' start and end times (tests/conftest.py's PREFLIGHT_TEST_TIMES).

Each process is charged to the test its pytest worker was running when the process's ancestor
directly under the worker started; a process the worker started that outlived its test by more
than 30 s (SkyPilot's API server, the stand-in's executors) and one no worker started (dockerd's
containers) are counted apart. Processes still running when accounting stops (dockerd,
containerd) are not in the file. Run by scripts/suite-profile.sh; by hand:

    python scripts/suite_profile.py ACCT_FILE TEST_TIMES [--top N]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import time
from dataclasses import dataclass

KINDS = (
    ("torchrun", ("pt_elastic", "pt_tcpstore_uv")),
    ("SkyPilot's server", ("SkyPilot:execut", "sky")),
    ("launcher CLI", ("launcher",)),
    ("torch process (a rank, a load check, rung 0)", ("python", "pt_gloo_runloop", "gloo_tcp_loop", "jemalloc_bg_thd")),
)
"""A process's kind by its accounting name: the name of its last thread to end (a rank that
used gloo often ends as `pt_gloo_runloop`, torchrun as `pt_elastic`)."""


@dataclass
class Proc:
    comm: str
    cpu: float
    elapsed: float
    pid: int
    ppid: int
    start: float


def read_acct(path: str) -> dict[int, list[Proc]]:
    """`dump-acct`'s lines (acct v3: times in 1/100 s), by pid (a pid may be reused)."""
    out = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    procs: dict[int, list[Proc]] = {}
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        start = time.mktime(time.strptime(f[14], "%a %b %d %H:%M:%S %Y"))
        proc = Proc(f[0], (float(f[2]) + float(f[3])) / 100, float(f[4]) / 100, int(f[9]), int(f[10]), start)
        procs.setdefault(proc.pid, []).append(proc)
    return procs


def read_tests(path: str) -> dict[int, list[tuple[float, float, str]]]:
    """Each worker's tests: (start, end, node id)."""
    tests: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)
    began: dict[tuple[int, str], float] = {}
    for line in open(path, encoding="utf-8"):
        pid, kind, at, nodeid = line.rstrip("\n").split(" ", 3)
        if kind == "S":
            began[(int(pid), nodeid)] = float(at)
        elif (int(pid), nodeid) in began:
            tests[int(pid)].append((began.pop((int(pid), nodeid)), float(at), nodeid))
    return tests


def parent_of(procs: dict[int, list[Proc]], proc: Proc) -> Proc | None:
    """The process that was `proc`'s parent: of the records under its pid, the newest that
    started no later than `proc` (accounting times are whole seconds)."""
    candidates = [p for p in procs.get(proc.ppid, []) if p.start <= proc.start + 1]
    return max(candidates, key=lambda p: p.start) if candidates else None


def charge(procs: dict[int, list[Proc]], tests: dict[int, list[tuple[float, float, str]]]) -> tuple:
    """(CPU by test, CPU by kind of process, CPU not charged to a test, by why)."""
    by_test: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    apart: collections.Counter = collections.Counter()
    for records in procs.values():
        for proc in records:
            by_kind[kind_of(proc.comm)] += proc.cpu
            chain, cur = [proc], proc
            while cur.pid not in tests and (up := parent_of(procs, cur)) is not None and len(chain) < 64:
                chain.append(up)
                cur = up
            if proc.pid in tests:
                apart["the pytest workers themselves"] += proc.cpu
            elif cur.pid not in tests:
                apart[f"started by no worker (ends under {chain[-1].comm})"] += proc.cpu
            else:
                top = chain[-2]  # the worker's own child this process descends from
                during = [t for t in tests[cur.pid] if t[0] - 1 <= top.start <= t[1] + 1]
                if not during or top.elapsed > during[0][1] - during[0][0] + 30:
                    apart[f"outlived its test ({top.comm})"] += proc.cpu
                else:
                    by_test[during[0][2]] += proc.cpu
    return by_test, by_kind, apart


def kind_of(comm: str) -> str:
    for kind, names in KINDS:
        if comm in names:
            return kind
    return f"other ({comm})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("acct")
    parser.add_argument("times")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    procs = read_acct(args.acct)
    by_test, by_kind, apart = charge(procs, read_tests(args.times))
    total = sum(p.cpu for records in procs.values() for p in records)
    counts = collections.Counter(kind_of(p.comm) for records in procs.values() for p in records)
    print(f"{total:.0f} CPU-s in {sum(counts.values())} ended processes; {sum(by_test.values()):.0f} charged to tests")
    print("by kind of process (CPU-s, processes, mean):")
    for kind, cpu in by_kind.most_common(12):
        print(f"  {cpu:8.1f}  {counts[kind]:6d}  {cpu / counts[kind]:5.2f}  {kind}")
    print("not charged to a test:")
    for why, cpu in apart.most_common(10):
        print(f"  {cpu:8.1f}  {why}")
    modules: collections.Counter = collections.Counter()
    for nodeid, cpu in by_test.items():
        modules[nodeid.split("::")[0]] += cpu
    print("by module:")
    for module, cpu in modules.most_common(args.top):
        print(f"  {cpu:8.1f}  {module}")
    print(f"the {args.top} dearest tests:")
    for nodeid, cpu in by_test.most_common(args.top):
        print(f"  {cpu:8.1f}  {nodeid}")


if __name__ == "__main__":
    main()

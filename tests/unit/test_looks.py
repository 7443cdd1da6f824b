"""The watchdog's second look (launcher.backends.looks): which rank a process is, whether it is
stopped, and where its main thread stands, read from outside by /proc and py-spy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.backends import looks

WAITER = "import time\ndef wait_here():\n    time.sleep(120)\nprint('ready', flush=True)\nwait_here()\n"

DUMP = """Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2806)
    wrapper (/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81)
    step (/srv/app/runtime/session/core.py:301)
    <module> (train.py:88)
Thread 4250 (idle): "Thread-1 (pusher)"
    wait (threading.py:327)
"""


def waiter(rank: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "RANK"} | ({"RANK": rank} if rank is not None else {})
    proc = subprocess.Popen([sys.executable, "-c", WAITER], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.skipif(looks.py_spy() is None, reason="py-spy is part of the launcher's install")
def test_a_stopped_rank_is_named_with_where_it_stood() -> None:
    stopped, asleep = waiter("1"), waiter(None)
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while looks._stat(stopped.pid)[0] != "T" and time.time() < deadline:  # type: ignore[index]
            time.sleep(0.01)
        first, second = looks.look([stopped.pid, asleep.pid])
        assert (first.rank, first.state, first.note) == (1, "T", ""), first
        assert first.doing() == "stopped (SIGSTOP or a debugger)"
        assert first.line().startswith(f"rank 1 (pid {stopped.pid}): stopped (SIGSTOP or a debugger), ")
        assert first.line().endswith("; at wait_here (<string>:3)"), first.line()
        assert looks._stat(stopped.pid)[0] == "T"  # type: ignore[index] # read, not woken
        assert (second.rank, second.doing()) == (None, "asleep") and "wait_here" in second.stack
        assert second.line().startswith(f"a process without a rank (pid {asleep.pid}): asleep")
    finally:
        for proc in (stopped, asleep):
            proc.kill()
            proc.wait()
    assert looks.look([stopped.pid]) == []  # gone: left out


def test_the_collective_a_rank_waits_in_is_read_from_its_main_thread() -> None:
    assert looks.collective_in(DUMP) == "all_reduce (torch/distributed/distributed_c10d.py)"
    assert looks.innermost(DUMP).startswith("all_reduce (")
    waiting = looks.Look(4242, 0, "S", 12.5, DUMP)
    assert waiting.doing() == "waiting in all_reduce (torch/distributed/distributed_c10d.py)"
    mine = DUMP.replace("torch/distributed/distributed_c10d.py", "mylib/comm.py")
    assert looks.collective_in(mine) is None  # a frame of that name outside torch.distributed
    pusher_only = DUMP.split("Thread 4250")[1]
    assert looks.collective_in("Thread 4250" + pusher_only) is None  # only the main thread counts
    assert looks.collective_in("") is None and looks.innermost("") == ""


NATIVE = """Thread 115647 (idle): "MainThread"
    0x7f81db4a3f16 (libc.so.6)
    pthread_cond_wait (libc.so.6)
    std::condition_variable::wait (libstdc++.so.6.0.30)
    c10d::Reducer::finalize_backward (libtorch_cpu.so)
    torch::autograd::GraphTask::exec_post_processing (libtorch_cpu.so)
    torch::autograd::Engine::execute (libtorch_cpu.so)
    THPEngine_run_backward (libtorch_python.so)
    _engine_run_backward (torch/autograd/graph.py:979)
    backward (torch/autograd/__init__.py:395)
    <module> (ddp.py:11)
"""
"""py-spy --native on a rank of a 2-rank gloo DDP whose peer never joined the gradients' all-reduce
(recorded here, torch 2.13): its Python frames say only `_engine_run_backward`."""


def test_a_rank_waiting_in_ddps_backward_all_reduce_is_read_from_its_native_frames() -> None:
    assert looks.collective_in(NATIVE) == "c10d::Reducer::finalize_backward (native)"
    computing = NATIVE.replace(
        "    pthread_cond_wait (libc.so.6)\n    std::condition_variable::wait (libstdc++.so.6.0.30)\n",
        "    at::native::cpublas::gemm (libtorch_cpu.so)\n",
    )
    assert looks.collective_in(computing) is None  # busy in a kernel, not waiting on a peer
    sleeping = 'Thread 1 (idle): "MainThread"\n    clock_nanosleep (libc.so.6)\n    pysleep (libpython3.11.so)\n    wait_here (train.py:3)\n'
    assert looks.collective_in(sleeping) is None  # asleep in its own code


def test_without_py_spy_the_look_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(looks, "py_spy", lambda: None)
    assert looks.py_spy_dump(os.getpid()) == ("", "py-spy is not installed")
    [me] = looks.look([os.getpid()])
    assert me.stack == "" and me.note == "py-spy is not installed" and me.state == "R"

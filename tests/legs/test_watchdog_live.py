"""The watchdog on a live leg (launcher.legs, launcher.checks.watchdog, launcher.backends.looks):
a rank that goes quiet past its limit is named while the leg runs, with what each process of the
leg was doing and its threads' stacks. One asleep in its own code is not called hung: the leg goes
on. One stopped is: the leg is ended, with why. Trainers of the contract alone (no torch): the
watchdog reads the events and the processes, not the framework."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from launcher import legs
from launcher.backends.base import StagedFile
from launcher.backends.local import LocalBackend
from launcher.config.schema import Config, RungConfig, RungsConfig, TrainerConfig, WatchdogConfig
from launcher.ladder import rung_named
from launcher.ledger.db import Ledger

QUIET_AT = 8
TRAINER = f"""
import json, sys, time

def emit(event, **fields):
    print(json.dumps({{"event": event, "t": round(time.time(), 3), "rank": 0, **fields}}), flush=True)

def quiet_a_while():
    time.sleep(3.0)  # not hung: a slow evaluation, say

emit("start", world_size=1)
for step in range(1, 13):
    time.sleep(0.05)
    emit("step", step=step, loss=1.0 / step, lr=0.1)
    if step == {QUIET_AT}:
        quiet_a_while()
emit("stop", reason="max_steps", step=12)
emit("done", step=12, final_checkpoint_verified=True)
"""


def run_one_leg(tmp_path: Path, command: list[str], script: Path, shown: list[str]) -> tuple[legs.LegOutcome, dict]:
    """One leg on the local backend under a 1 s floor; (its outcome, its ledger row's watchdog)."""
    cfg = Config(
        project="t",
        trainer=TrainerConfig(command=command, watchdog=WatchdogConfig(floor_s=1.0, first_step_s=60.0)),
        reviewed=[script.name],
        rungs=RungsConfig(rehearsal=RungConfig(steps=12, budget_minutes=2)),
        root=tmp_path,
    )
    ledger = Ledger(tmp_path / "ledger.db")
    ctx = legs.RunContext(
        cfg,
        rung_named("rehearsal"),
        LocalBackend(root=tmp_path / "legs"),
        ledger,
        "wd-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10],
        "file:///s",
        {script.name: StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())},
        None,
        lambda leg, line: shown.append(line),
    )
    ledger.begin_run(legs.ledger_run_row(ctx, None, "d", "c"), {})
    out = legs.run_leg(ctx, 0, max_steps=12)
    return out, ledger.runs()[0]["legs"][0]["watchdog"]


def test_a_rank_quiet_past_its_limit_is_named_with_its_stack_and_the_leg_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    shown: list[str] = []
    out, record = run_one_leg(tmp_path, [sys.executable, "train.py"], script, shown)
    assert out.result.exit_code == 0 and not out.result.killed, out.result
    said = [line for line in shown if line.startswith("launcher: watchdog:")]
    assert said[0].startswith("launcher: watchdog: rank 0 silent ") and f"after step {QUIET_AT}" in said[0], said
    assert "limit 1.0 s while stepping); observed: the leg goes on" in said[0], said
    assert any("a process without a rank" in line and "asleep" in line and "quiet_a_while" in line for line in said)
    [suspect] = record["suspects"]
    assert (suspect["rank"], suspect["last_step"], suspect["spoke_again"]) == (0, QUIET_AT, True), suspect
    assert record["closest"] >= 1.0 and record["policy"]["floor_s"] == 1.0
    looked = record["looks"][0]  # looked at again each limit (1 s) while it stayed quiet
    assert all(each["hung"] is None for each in record["looks"])  # asleep in its own code: not ended
    stacks = Path(looked["stacks"]).read_text()
    assert "quiet_a_while (train.py:" in stacks and str(script.name) in stacks, stacks
    json.dumps(record)


TWO_RANKS = """
import json, os, signal, sys, time

RANK = int(os.environ["RANK"])

def emit(event, **fields):
    print(json.dumps({"event": event, "t": round(time.time(), 3), "rank": RANK, **fields}), flush=True)

emit("start", world_size=2)
for step in range(1, 13):
    time.sleep(0.05)
    emit("step", step=step, loss=1.0 / step, lr=0.1)
    if step == 6 and RANK == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 1 stops here, as a debugger or a drill would stop it
    if step == 6 and RANK == 0:
        time.sleep(120)  # rank 0 waits for rank 1, as its next collective would
"""


def test_a_stopped_rank_is_called_hung_and_its_leg_ended_with_why(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    both = f"RANK=0 {sys.executable} two.py & RANK=1 {sys.executable} two.py & wait"
    shown: list[str] = []
    began = time.monotonic()
    out, record = run_one_leg(tmp_path, ["bash", "-c", both], script, shown)
    took = time.monotonic() - began
    # The reason names the suspect looked at (either rank: both fall silent after step 6; under
    # load rank 1 can lag, rank 0 be named first, look "asleep" and be left alone until a look a
    # limit later) and what the look found: rank 1 stopped.
    reason = out.result.end_reason
    assert out.result.killed and reason.startswith("hung: rank ") and "after step " in reason, out.result
    assert "rank 1 (pid " in reason and "stopped (SIGSTOP or a debugger)" in reason, reason
    assert took < 30, took  # a 1 s floor and a second look, not the 2-minute budget
    said = [line for line in shown if line.startswith("launcher: watchdog:")]
    assert [line for line in said if "; the leg is ended" in line], said
    assert any(line.startswith("launcher: watchdog:   rank 1 (pid ") for line in said), said
    hung = [looked for looked in record["looks"] if looked["hung"]]
    assert hung and "rank 1 (pid" in hung[0]["hung"], record["looks"]
    stacks = Path(hung[0]["stacks"]).read_text()
    assert "(two.py:" in stacks, stacks


DDP = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
for step in range(1, 6):
    if rank == 1 and step == 3:
        print("blocked", flush=True)
        dist.recv(torch.zeros(1), src=0)  # a collective rank 0 never joins
    model(torch.randn(4, 16)).sum().backward()
"""


def test_a_rank_waiting_in_ddps_backward_is_seen_waiting_by_its_native_frames(tmp_path: Path) -> None:
    """Rank 1 blocks in a receive; rank 0 goes on into its backward and waits there for rank 1's
    gradients, in C++: its Python stack says `_engine_run_backward`, its native frames say
    DDP's reducer waits. The look reads both ranks as waiting in a collective (real gloo DDP)."""
    import os
    import subprocess

    from launcher.backends.leash import proc_stat
    from launcher.backends.looks import look
    from launcher.checks.watchdog import confirm

    (tmp_path / "ddp.py").write_text(DDP)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [str(torchrun), "--standalone", "--nproc_per_node=2", "ddp.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "blocked\n"
        deadline = time.time() + 60
        while True:
            parents = {int(d): int((proc_stat(int(d)) or [b"", b"0"])[1]) for d in os.listdir("/proc") if d.isdigit()}
            ours = [pid for pid, parent in parents.items() if parent == proc.pid]  # torchrun's workers
            seen = {p.rank: p for p in look(ours) if p.rank is not None}
            if len(seen) == 2 and all(p.doing().startswith("waiting in") for p in seen.values()):
                break
            assert time.time() < deadline, {r: p.line() for r, p in seen.items()}
            time.sleep(0.5)
        assert seen[0].doing() == "waiting in c10d::Reducer::finalize_backward (native)", seen[0].stack
        assert "_engine_run_backward" in seen[0].stack and seen[1].doing().startswith("waiting in recv")
        assert (confirm(list(seen.values())) or "").startswith("every rank waits in a collective: rank 0 (pid ")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()

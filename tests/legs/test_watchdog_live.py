"""The watchdog on a live leg (launcher.legs, launcher.checks.watchdog, launcher.backends.looks),
observed only: a rank that goes quiet past its limit is named while the leg runs, with what each
process of the leg was doing and its threads' stacks; the leg goes on and the ledger keeps it all.
A trainer of the contract alone (no torch): the watchdog reads the events, not the framework."""

from __future__ import annotations

import hashlib
import json
import sys
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


def test_a_rank_quiet_past_its_limit_is_named_with_its_stack_and_the_leg_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    cfg = Config(
        project="t",
        trainer=TrainerConfig(
            command=[sys.executable, "train.py"], watchdog=WatchdogConfig(floor_s=1.0, first_step_s=60.0)
        ),
        reviewed=["train.py"],
        rungs=RungsConfig(rehearsal=RungConfig(steps=12, budget_minutes=2)),
        root=tmp_path,
    )
    ledger = Ledger(tmp_path / "ledger.db")
    shown: list[str] = []
    ctx = legs.RunContext(
        cfg,
        rung_named("rehearsal"),
        LocalBackend(root=tmp_path / "legs"),
        ledger,
        "wd-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10],
        "file:///s",
        {"train.py": StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())},
        None,
        lambda leg, line: shown.append(line),
    )
    ledger.begin_run(legs.ledger_run_row(ctx, None, "d", "c"), {})
    out = legs.run_leg(ctx, 0, max_steps=12)
    assert out.result.exit_code == 0 and not out.result.killed, out.result
    said = [line for line in shown if line.startswith("launcher: watchdog:")]
    assert said[0].startswith("launcher: watchdog: rank 0 silent ") and f"after step {QUIET_AT}" in said[0], said
    assert "limit 1.0 s while stepping) (observed only: the leg goes on)" in said[0], said
    assert any("a process without a rank" in line and "asleep" in line and "quiet_a_while" in line for line in said)
    record = ledger.runs()[0]["legs"][0]["watchdog"]
    [suspect] = record["suspects"]
    assert (suspect["rank"], suspect["last_step"], suspect["spoke_again"]) == (0, QUIET_AT, True), suspect
    assert record["closest"] >= 1.0 and record["policy"]["floor_s"] == 1.0
    [looked] = record["looks"]
    stacks = Path(looked["stacks"]).read_text()
    assert "quiet_a_while (train.py:" in stacks and str(script.name) in stacks, stacks
    json.dumps(record)

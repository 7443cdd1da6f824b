"""Operating a live run: `launcher status`, `launcher stop`, and the step-time breakdown.

The test trainers are the reference trainer behind a wrapper (train.py) that
prints an early warning, can slow its input pipeline (--data-delay) and, for
one test, ignores SIGTERM the way a trainer without a handler would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from launcher.checks.evidence import Kind
from runtime.events import parse_line
from tests.helpers import LAUNCHER, Done, assert_one_line_error, check, run_cli

WRAPPER = '''"""Test trainer: the reference trainer, plus an early warning line."""
import os
import signal
import sys

from runtime.reference.trainer import build_parser, main  # noqa: F401 - rung 0 parses with build_parser

print("UserWarning: NCCL_P2P_LEVEL unset, falling back to sockets (printed early for the status test)",
      file=sys.stderr, flush=True)
if DELAY_LEG_0_ONLY and os.environ.get("LAUNCHER_LEG") != "0":  # the later legs read at full speed
    sys.argv = [("0" if sys.argv[i - 1] == "--data-delay" else a) for i, a in enumerate(sys.argv)]
if IGNORE_SIGTERM:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal = lambda *a, **k: None  # the trainer's own handler never lands: SIGTERM does nothing
if __name__ == "__main__":
    sys.exit(main())
'''


def make_project(
    root: Path, *, ignore_sigterm: bool = False, delay: float = 0.15, steps: int = 300, leg_0_only: bool = False
) -> Path:
    """A project running the wrapper; `delay` seconds a batch in every leg, or in leg 0 only."""
    assert run_cli(["init", str(root)], cwd=root.parent).code == 0
    wrapper = WRAPPER.replace("IGNORE_SIGTERM", str(ignore_sigterm)).replace("DELAY_LEG_0_ONLY", str(leg_0_only))
    (root / "train.py").write_text(wrapper)
    cfg = root / "launcher.yaml"
    text = re.sub(
        r"(?m)^  command: .*$",
        f"  command: python train.py --ckpt-every 5 --metrics-every 5 --health-every 0 --data-delay {delay}",
        cfg.read_text(),
    )
    text = re.sub(r"(?m)^  rehearsal: .*$", f"  rehearsal: {{steps: {steps}, budget_minutes: 10}}", text)
    cfg.write_text(text)
    assert run_cli(["review"], cwd=root).code == 0
    return root


def start_up(root: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    out = root / "up.out"
    env = dict(os.environ, TMPDIR=str(root.parent / "tmp"))
    (root.parent / "tmp").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [str(LAUNCHER), "up", "rehearsal", *args],
        cwd=root,
        env=env,
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return proc, out


def wait_for_step(root: Path, step: int, timeout: float = 180) -> tuple[str, Path]:
    """(run id, leg-0 log) once leg 0 has printed step `step`."""
    until = time.time() + timeout
    while time.time() < until:
        for log in (root / ".launcher" / "runs").glob("*/leg-0.log"):
            for line in log.read_text().splitlines():  # the last line may be half written yet:
                event = parse_line(line) if line.startswith('{"event": "step"') else None  # a cut one reads None
                if event is not None and event.get("event") == "step" and event["step"] >= step:
                    return log.parent.name, log
        time.sleep(0.2)
    raise AssertionError(f"leg 0 never reached step {step}")


def finish(proc: subprocess.Popen, out: Path) -> int:
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        print(out.read_text()[-3000:])


def test_status_then_graceful_stop(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    proc, out = start_up(root)
    try:
        run_id, log = wait_for_step(root, 17)
        res = run_cli(["status", "--json"], cwd=root)
        assert res.code == 0, res.err
        s = res.json()
        assert s["run"] == run_id and s["state"] == "running" and s["leg"]["state"] == "running"
        assert s["leg"]["step"] >= 17 and s["leg"]["process_alive"] is True
        assert s["checkpoints"]["newest_verified"]["state"] == "verified"
        assert s["checkpoints"]["newest_verified"]["step"] >= 10
        assert s["health"]["disk_free_bytes"] > 0 and s["health"]["gpu"] is None
        [warning] = [w for w in s["warnings"] if "NCCL_P2P_LEVEL" in w["text"]]
        lines = log.read_text().splitlines()
        assert warning["first_line"] <= 3 and not any("NCCL" in ln for ln in lines[-10:])  # early, not in the tail
        human = run_cli(["status", run_id], cwd=root)
        assert human.code == 0 and "newest verified: step-" in human.out and "NCCL_P2P_LEVEL" in human.out

        res = run_cli(["stop", run_id, "--timeout", "60", "--json"], cwd=root)
        assert res.code == 0, res.out + res.err
        st = res.json()
        assert st["outcome"] == "graceful" and st["clean"] is True
        assert st["final_step"] == st["checkpoint_step"] and st["loadable"]["ok"] is True
        assert st["loadable"]["step"] == st["final_step"] and st["loadable"]["verified"] is True
        assert finish(proc, out) == 1  # the rung did not run to its end: its answer is not "yes"
    finally:
        if proc.poll() is None:
            proc.kill()
    after = run_cli(["status", run_id, "--json"], cwd=root).json()
    assert after["state"] == "ended: stopped" and after["legs"] == 1  # no leg launched after the stop
    assert after["checkpoints"]["newest_verified"]["step"] == st["final_step"] == after["leg"]["step"]
    [row] = after["stops"]
    assert row["outcome"] == "graceful" and row["loadable"] == 1 and row["final_step"] == st["final_step"]
    events = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith('{"event"')]
    assert {"event": "stop", "reason": "sigterm"}.items() <= next(e for e in events if e["event"] == "stop").items()
    assert not Path(run_cli(["ledger", run_id, "--json"], cwd=root).json()[0]["legs"][0]["instance"]).exists()


def test_a_trainer_that_ignores_sigterm_is_killed_and_the_fallback_reported(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", ignore_sigterm=True)
    proc, out = start_up(root)
    try:
        run_id, _ = wait_for_step(root, 12)
        began = time.time()
        res = run_cli(["stop", run_id, "--timeout", "3", "--json"], cwd=root)
        st = res.json()
        assert res.code == 1 and st["outcome"] == "killed after 3 s timeout" and st["clean"] is False
        assert time.time() - began < 60
        assert st["checkpoint"] and st["checkpoint_step"] >= 10 and st["loadable"]["ok"] is True
        assert "fell back to" in st["detail"]
        assert finish(proc, out) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    s = run_cli(["status", run_id, "--json"], cwd=root).json()
    assert s["stops"][0]["outcome"].startswith("killed") and s["state"] == "ended: stopped"
    assert s["checkpoints"]["newest_verified"]["name"] == st["checkpoint"]


def test_stop_refuses_what_it_cannot_stop(after_static: Done) -> None:
    project = after_static.root  # its one run: a static run, ended
    assert_one_line_error(run_cli(["stop", "nope"], cwd=project), 2, "no run 'nope'")
    run_id = run_cli(["ledger", "--json"], cwd=project).json()[0]["id"]
    assert_one_line_error(run_cli(["stop", run_id], cwd=project), 2, "is not running")
    assert_one_line_error(run_cli(["status", "nope"], cwd=project), 2, "no run 'nope'")


def test_breakdown_names_the_bottleneck(tmp_path: Path) -> None:
    """The probe measures leg 0, so only leg 0 reads slowly (data-bound); `status` shows the newest
    leg (the straight-through leg 2, at full speed: compute-bound). Status naming a data-bound
    breakdown, and a compute-bound one: tests/unit/test_status_breakdown.py."""
    root = make_project(tmp_path / "proj", delay=0.15, leg_0_only=True)
    res = run_cli(["up", "probe", "--cpu", "--steps", "60", "--json"], cwd=root, env={"TMPDIR": str(tmp_path)})
    detail = check(res, Kind.STEP_BREAKDOWN, leg=0)["detail"]
    assert re.search(r"\. data wait \d+ % of step time", detail), detail
    s = run_cli(["status", "--json"], cwd=root).json()
    assert s["leg"]["leg"] == 2 and s["breakdown"]["largest"] == "compute", s["breakdown"]
    assert re.search(r"\. forward/backward \d+ % of step time", s["breakdown"]["summary"]), s["breakdown"]
    # the FLOPs the leg did, and no MFU on a CPU: there is no peak to hold them against
    assert s["efficiency"]["flop_s"] > 0 and s["efficiency"]["mfu"] is None
    assert "no peak is known for a CPU" in s["efficiency"]["summary"]

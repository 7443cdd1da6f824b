"""The live view of a rung: readable lines, not dicts; quiet by default (a line that says nothing is
wrong stays in the leg's log), everything with -v."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from launcher.backends.base import pump_lines
from launcher.cli.live import LegView, event_summary

ROOT = Path(__file__).resolve().parents[2]

EVENTS = [
    {"event": "start", "device": "cpu", "params": 120576, "world_size": 2, "max_steps": 20},
    {
        "event": "resume",
        "from_step": 5,
        "checkpoint": "step-00000005",
        "sample_index": 40,
        "batch_hash": "ab" * 32,
        "lr": 0.0018,
        "lr_expected": 0.0018,
    },
    {"event": "step", "step": 6, "loss": 3.2, "lr": 0.0018, "sample_index": 40, "tok_s": 20000.0},
    {"event": "memory", "step": 10, "kind": "cuda", "peak": 6.3e9, "peak_max": 6.3e9},
    {
        "event": "rate",
        "step": 10,
        "tok_s": 69809.2,
        "window_first": 2,
        "window_last": 10,
        "seconds": 1.0,
        "rel_err": 0.033,
        "total_steps": 100000,
        "eta_s": 11736.0,
    },
    {
        "event": "health",
        "step": 10,
        "disk_free_bytes": 8e10,
        "disk_total_bytes": 2.7e11,
        "ram_available_bytes": 2.4e10,
        "ram_total_bytes": 2.5e10,
        "gpu_free_bytes": 1.3e11,
        "gpu_total_bytes": 1.4e11,
    },
    {"event": "save", "step": 10, "bytes": 1488619, "seconds": 0.02},
    {
        "event": "verify",
        "step": 10,
        "name": "step-00000010",
        "windows": 3,
        "bytes_read": 1488619,
        "ok": True,
        "seconds": 0.01,
    },
    {
        "event": "verify",
        "step": 15,
        "name": "step-00000015",
        "windows": 3,
        "bytes_read": 100,
        "ok": False,
        "seconds": 0.01,
        "failures": ["state.pt[0:+100]: bytes differ from the local copy"],
    },
    {"event": "push_wait", "step": 15, "seconds": 0.01, "reason": "queue full"},
    {"event": "push_wait", "step": 20, "seconds": 3.2, "reason": "queue full"},
    {"event": "log", "level": "info", "source": "setup", "node": 1, "message": "torch 2.13.0+cpu, cuda False"},
    {"event": "log", "level": "warning", "source": "notice watcher", "message": "gcp metadata did not answer"},
    {"event": "stop", "step": 20, "reason": "max_steps"},
    {"event": "done", "step": 20, "final_checkpoint_verified": True},
]


def test_every_event_kind_reads_as_a_sentence() -> None:
    lines = [event_summary(e) for e in EVENTS]
    assert not any("{" in line or "'" in line for line in lines), lines  # no dict or repr anywhere
    assert "memory at step 10: GPU peak 6,300.0 MB (max across ranks)" in lines
    assert "rate 69,809 tok/s +-3.3 % over steps 2..10; ETA to step 100000: 3.3 h" in lines
    assert any(line.startswith("instance: disk 74.5 GiB of 251.5 GiB free") and "GPU" in line for line in lines)


def view_output(verbose: bool) -> list[str]:
    buf = io.StringIO()
    with LegView(Console(file=buf, width=200), verbose) as view:
        for e in EVENTS:
            view(0, json.dumps(e) + "\n")
        view(0, "Traceback (most recent call last):\n")
    return buf.getvalue().splitlines()


def test_quiet_by_default_everything_with_verbose() -> None:
    quiet, loud = view_output(False), view_output(True)
    assert len(quiet) == 7 and len(loud) == len(EVENTS) + 1
    text = "\n".join(quiet)
    for needle in (
        "started on cpu",
        "resumed from step-00000005",
        "verification FAILED",
        "waited 3.20 s",
        "notice watcher: gcp metadata did not answer",  # a warning of the runtime's own
        "done at step 20",
        "Traceback",
    ):
        assert needle in text
    for absent in ("step     6", "memory at", "rate ", "instance:", "waited 0.01 s", "stopping at", "torch 2.13"):
        assert absent not in text
    assert "leg0 (node 1) setup: torch 2.13.0+cpu, cuda False" in loud  # info: with -v only


def test_a_line_that_says_nothing_is_wrong_is_logged_and_shown_only_with_verbose(tmp_path: Path) -> None:
    """The notice watcher beside each node of a local `--nodes 2` leg has no cloud to watch and
    says so, every node of every leg: the real watcher's output, pumped as a backend pumps a
    leg's (launcher.backends.base.pump_lines, the nodes' prefixes), is in the leg's log either
    way, and on the terminal only with -v."""
    env = {k: v for k, v in os.environ.items() if k != "SKYPILOT_CLUSTER_INFO"}
    watcher = subprocess.run(
        [sys.executable, "-m", "runtime.programs.notice", "--mark", str(tmp_path / "mark"), "--parent", "1"],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert watcher.returncode == 0 and not watcher.stderr, watcher.stderr
    said = "no metadata notice to watch without SKYPILOT_CLUSTER_INFO"
    lines = [f"(node {n}) {line}" for n in (0, 1) for line in watcher.stdout.splitlines(keepends=True)]
    lines.append(json.dumps({"event": "done", "step": 20, "final_checkpoint_verified": True}) + "\n")
    for verbose in (False, True):
        log, buf = tmp_path / f"leg-{verbose}.log", io.StringIO()
        with log.open("w") as fh, LegView(Console(file=buf, width=200), verbose) as view:
            pump_lines(lines, fh, lambda line: view(0, line))
        assert log.read_text().count(said) == 2
        shown = buf.getvalue()
        assert "done at step 20" in shown and shown.count(said) == (2 if verbose else 0), shown


def test_status_lists_the_runtimes_warnings_among_a_logs_warnings_and_not_its_info(tmp_path: Path) -> None:
    """`launcher status` groups a leg's warning-looking lines that are no events; the runtime's
    own `log` warnings count (the watcher's used to be plain text), its info lines do not."""
    from launcher.ops.status import warnings_in

    said = {"t": 1.0, "rank": 0, "source": "notice watcher"}
    lines = [
        {"event": "log", **said, "level": "info", "message": "no metadata notice to watch; the leg gets none"},
        {"event": "log", **said, "level": "warning", "message": "gcp metadata did not answer (timed out); polling on"},
        {"event": "stop", "t": 2.0, "rank": 0, "reason": "store_error", "error": "an error the checks report"},
    ]
    log = tmp_path / "leg-0.log"
    log.write_text("".join(json.dumps(e) + "\n" for e in lines) + "UserWarning: a trainer's own\n")
    texts = [w["text"] for w in warnings_in(log)]
    assert len(texts) == 2 and "did not answer" in texts[0] and texts[1] == "UserWarning: a trainer's own", texts


def test_the_runtimes_own_lines_are_no_sign_that_the_trainer_speaks(tmp_path: Path) -> None:
    """A sky leg's setup and notice watcher print `log` events before the trainer does: a leg
    whose log holds only those is silent (the trainer never spoke the contract), and while it
    runs they do not count as the trainer's first event (events_grace_s still ends it)."""
    from types import SimpleNamespace

    from launcher.checks.evidence import LegEvents, silent
    from launcher.config.schema import Config
    from launcher.legs import _Watch

    said = {"event": "log", "t": 1.0, "rank": 0, "level": "info", "source": "setup", "message": "torch 2.13.0+cpu"}
    log = tmp_path / "leg-0.log"
    log.write_text(f"(worker1, rank=1, pid=7, ip=127.0.0.1) {json.dumps(said)}\nTraceback (most recent call last):\n")
    assert silent(LegEvents.read(0, log))
    watch = _Watch(
        SimpleNamespace(show=lambda leg, line: None, cfg=Config(project="t")),  # type: ignore[arg-type]
        SimpleNamespace(leg=0),  # type: ignore[arg-type]
        0.0,
        SimpleNamespace(hold_at=None, sigterm_at=None),  # type: ignore[arg-type]
        None,
    )
    watch.on_line(json.dumps(said) + "\n")
    assert not watch.spoke.is_set()
    watch.on_line(json.dumps({"event": "session", "t": 2.0, "rank": 0, "run_id": "r", "leg": 0, "pid": 7}) + "\n")
    assert watch.spoke.is_set()
    log.write_text(log.read_text() + json.dumps({"event": "session", "t": 2.0, "rank": 0}) + "\n")
    assert not silent(LegEvents.read(0, log))

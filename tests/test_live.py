"""The live view of a rung: readable lines, not dicts; quiet by default, everything with -v."""

from __future__ import annotations

import io
import json

from rich.console import Console

from launcher.cli.live import LegView, event_summary

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
    assert len(quiet) == 6 and len(loud) == len(EVENTS) + 1
    text = "\n".join(quiet)
    for needle in (
        "started on cpu",
        "resumed from step-00000005",
        "verification FAILED",
        "waited 3.20 s",
        "done at step 20",
        "Traceback",
    ):
        assert needle in text
    for absent in ("step     6", "memory at", "rate ", "instance:", "waited 0.01 s", "stopping at"):
        assert absent not in text

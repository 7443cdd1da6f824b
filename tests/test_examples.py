"""The examples climb the ladder unmodified but for their ladder.diff: static ->
rehearsal -> drill (two kills mid-push) -> report, on scripts in the shapes users
have (a flat script that trains at import time; a plain loop with SGD, a plateau
schedule and an epoch loader). Their original versions pass rung 0 as they are."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def changed_lines(diff: Path) -> int:
    return sum(1 for line in diff.read_text().splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def copy_example(name: str, dest: Path) -> Path:
    root = dest / name
    shutil.copytree(EXAMPLES / name, root)
    assert run_cli(["review"], cwd=root).code == 0
    return root


@pytest.mark.parametrize("name", ["flat_gpt", "plain_loop"])
def test_the_example_climbs_the_ladder(name: str, tmp_path: Path, leg_tmp: Path) -> None:
    assert changed_lines(EXAMPLES / name / "ladder.diff") <= 20
    root = copy_example(name, tmp_path)
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out
    rehearsal = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    assert rehearsal.code == 0, [c for c in rehearsal.json()["checks"] if not c["ok"]]
    checks = {c["name"]: c for c in rehearsal.json()["checks"]}
    assert "identical at every step" in checks["resumed run = straight-through run"]["detail"]
    drill = run_cli(["drill", "cold-resume", "--kills", "2", "--at", "mid-push", "--json"], cwd=root, timeout=900)
    assert drill.code == 0, [c for c in drill.json()["checks"] if not c["ok"]]
    report = run_cli(["report", "--json"], cwd=root, timeout=600)
    status = {p["number"]: p["status"] for p in report.json()["proofs"]}
    assert status == {1: "PASS", 2: "PASS", 3: "PASS", 4: "PASS", 5: "MISSING", 6: "PASS", 7: "PASS", 8: "PASS"}, \
        {p["number"]: p["summary"] for p in report.json()["proofs"] if p["status"] != "PASS"}
    assert report.code == 0


@pytest.mark.parametrize("name", ["flat_gpt", "plain_loop"])
def test_the_original_script_passes_rung_0_and_the_rehearsal_says_why_not(name: str, tmp_path: Path,
                                                                           leg_tmp: Path) -> None:
    root = tmp_path / name
    shutil.copytree(EXAMPLES / name, root)
    shutil.copyfile(root / "train_original.py", root / "train.py")
    cfg = root / "launcher.yaml"
    text = cfg.read_text().replace("--ckpt_every 5", "").replace("--ckpt-every 5", "")
    cfg.write_text(text.replace("trainer:\n", "trainer:\n  events_grace_s: 20\n"))
    assert run_cli(["review"], cwd=root).code == 0
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out
    began = time.monotonic()
    rehearsal = run_cli(["up", "rehearsal"], cwd=root, timeout=600)
    took = time.monotonic() - began
    assert rehearsal.code == 1 and took < 120, (took, rehearsal.out[-2000:])  # the grace period, not the 5-min budget
    fails = [line for line in rehearsal.out.splitlines() if line.strip().startswith("FAIL")]
    assert len(fails) == 1 and "printed no preflight events" in fails[0], rehearsal.out[-1500:]

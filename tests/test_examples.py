"""The examples climb the ladder unmodified but for their ladder.diff: static ->
rehearsal -> drill (two kills mid-push) -> report, on scripts in the shapes users
have (a flat script that trains at import time; a plain loop with SGD, a plateau
schedule and an epoch loader). Their original versions pass rung 0 as they are."""

from __future__ import annotations

import shutil
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
def test_the_original_script_passes_rung_0_as_it_is(name: str, tmp_path: Path, leg_tmp: Path) -> None:
    root = tmp_path / name
    shutil.copytree(EXAMPLES / name, root)
    shutil.copyfile(root / "train_original.py", root / "train.py")
    cfg = root / "launcher.yaml"
    cfg.write_text(cfg.read_text().replace("--ckpt_every 5", "").replace("--ckpt-every 5", ""))
    assert run_cli(["review"], cwd=root).code == 0
    static = run_cli(["up", "static", "--json"], cwd=root)
    assert static.code == 0, static.out

"""`launcher drill hang` on the local backend: one of two ranks stopped at a step is found by the
leg's own watchdog under the default policy, its stacks taken, the leg ended, and the run resumed
from the store to its end (launcher.rungs.drill_hang). The docker backend's:
tests/docker/test_docker.py::test_a_hung_rank_in_a_container_is_found_and_the_run_resumes."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import assert_one_line_error, check, edit_config, failed, run_cli

SLOW_STEPS = "train.py --ckpt-every 2 --data-delay 1.2"
"""Steps of about 1.2 s (a sleep in the trainer's data read), watched under a 5 s floor (the
policy in launcher.yaml: POLICY): the rank's limit is 5 x its p99, about 6 s, and the detection
(that, the judging second, the look) falls under 10 x the leg's p99 step time. Under the default
15 s floor, with 2.5 s steps, it took 15.2 s locally and 15.8 s in containers (docs/drills.md); at
the suite's usual 0.1 s steps that floor is 150 x p99, and docs/watchdog.md says why it is there."""
POLICY = {"floor_s": 5.0}


def check_hang(checks: list[dict], run: dict, rank: int) -> dict:
    """The drill's checks all PASS, the hang was found within 10 x p99 and 30 s, and the leg's
    ledger row and stacks name the stopped rank. Returns the hang's facts."""
    assert not failed(checks), failed(checks)
    facts = check(checks, Kind.HANG_FOUND, leg=0)["facts"]
    assert 0 < facts["detected_s"] < min(30.0, 10 * facts["p99_step_s"]), facts
    assert facts["limit_s"] >= 5.0 and facts["p99_step_s"] > 1.0, facts
    leg0 = run["legs"][0]
    # The suspect named first may be a peer (it falls silent too, waiting for the stopped rank, and
    # can be the one furthest past its limit); the look names the rank that is stopped.
    reason = leg0["end_reason"]
    assert leg0["killed"] and reason.startswith("hung: rank ") and f"; rank {rank} (pid " in reason, reason
    assert "stopped (SIGSTOP or a debugger)" in reason, reason
    [hung] = [each for each in leg0["watchdog"]["looks"] if each["hung"]]
    stacks = Path(hung["stacks"]).read_text()
    assert f"== rank {rank} (pid {facts['pids'][0]}): stopped (SIGSTOP or a debugger)" in stacks, stacks
    assert "(train.py:" in stacks, stacks  # its Python frames, read while it was stopped
    # Step 4's checkpoint gathers every rank's state: if the stop lands before rank 1 gave its
    # part, that checkpoint never completes and the newest verified is step 2's.
    resumed = check(checks, Kind.RESUMED_NEWEST, leg=1)["facts"]
    assert resumed["resumed_at"] == resumed["expected"] in (2, 4), resumed
    assert not run["legs"][1]["killed"] and run["legs"][1]["exit_code"] == 0
    hung = run["hours"]["legs"][0]["parts"]["hang"]  # the account: leg 0 from its last step to its end
    assert facts["detected_s"] - 3 < hung < facts["detected_s"] + 5, (hung, facts)
    return facts


def test_a_stopped_rank_is_found_in_seconds_and_the_run_resumes(project: Path) -> None:
    edit_config(
        project,
        trainer__command=f"torchrun --standalone --nproc_per_node=2 {SLOW_STEPS}",
        trainer__watchdog=POLICY,
        rungs__drill={"steps": 8, "budget_minutes": 5},
    )
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["drill", "hang", "--at-step", "4", "--json"], cwd=project, timeout=600)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    out = res.json()
    run = run_cli(["ledger", out["run_id"], "--json"], cwd=project).json()[0]
    facts = check_hang(out["checks"], run, rank=1)
    # The report states the figure and carries the stacks in its evidence.
    folder = project / "report"
    assert run_cli(["report", "--out", str(folder)], cwd=project).code == 0
    md = (folder / "preflight.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- **Hang drill**"))
    assert f"called hung {facts['detected_s']:.1f} s later" in line, line
    cited = f"evidence/{out['run_id']}/{Path(facts['stacks']).name}"
    assert f"`{cited}`" in md and "stopped (SIGSTOP" in (folder / cited).read_text()
    assert json.loads((folder / "preflight.json").read_text())["plan"]["hangs"][0]["detected_s"] == facts["detected_s"]
    assert run_cli(["report", "--check", str(folder)], cwd=project).code == 0


def test_a_rank_blocked_in_a_collective_is_found_by_two_looks_and_the_run_resumes(project: Path) -> None:
    """`--how collective`: after step 3 rank 1 waits in a receive no rank sends (the runtime does
    it, LAUNCHER_DRILL_HANG) and rank 0 waits in its next collective. Nothing is stopped: the
    look finds every rank waiting, and the look a limit later, in the same silence, finds the
    same, so the leg is hung at about twice the limit. Under a 3 s floor (launcher.yaml's policy)
    and 0.3 s steps, so that it takes seconds: under the default policy it took 30.6 s
    (docs/drills.md)."""
    edit_config(
        project,
        trainer__command="torchrun --standalone --nproc_per_node=2 train.py --ckpt-every 2 --data-delay 0.3",
        trainer__watchdog={"floor_s": 3.0},
        rungs__drill={"steps": 8, "budget_minutes": 5},
    )
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["drill", "hang", "--how", "collective", "--at-step", "3", "--json"], cwd=project, timeout=600)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    checks = res.json()["checks"]
    found = check(checks, Kind.HANG_FOUND, leg=0)
    facts = found["facts"]
    assert found["name"] == "leg 0: the watchdog found rank 1 blocked in a collective"
    assert 2 * facts["limit_s"] < facts["detected_s"] < 2 * facts["limit_s"] + 10, facts
    assert facts["hung"].startswith("every rank waits in a collective: rank 0 (pid "), facts
    assert "rank 1 (pid " in facts["hung"] and "waiting in recv (torch/distributed" in facts["hung"]
    [run] = run_cli(["ledger", res.json()["run_id"], "--json"], cwd=project).json()
    looks = run["legs"][0]["watchdog"]["looks"]
    assert [bool(each["hung"]) for each in looks if each["rank"] == looks[-1]["rank"]][-2:] == [False, True]
    assert check(checks, Kind.RESUMED_NEWEST, leg=1)["facts"]["resumed_at"] == 2 and not failed(checks)


def test_drill_hang_refuses_what_it_cannot_drill(project: Path) -> None:
    """Bad input in one line, exit 2, before anything is recorded."""
    for args, said in (
        (["--backend", "sky"], "cannot reach a leg's processes"),
        (["--at-step", "1"], "--at-step must lie in 2..39"),
        (["--at-step", "40"], "--at-step must lie in 2..39"),
        (["--backend", "nowhere"], "unknown backend"),
        (["--how", "sideways"], "--how takes stop or collective"),
    ):
        res = run_cli(["drill", "hang", *args], cwd=project)
        assert_one_line_error(res, 2, said)
    edit_config(project, trainer__watchdog={"act": False})
    assert_one_line_error(run_cli(["drill", "hang"], cwd=project), 2, "needs trainer.watchdog.act: true")
    assert not (project / ".launcher" / "ledger.db").exists() or not run_cli(["ledger", "--json"], cwd=project).json()


def test_a_rank_slower_than_its_peers_is_named_a_straggler_by_the_probe_and_status(project: Path) -> None:
    """Rank 1 alone reads its batches 50 ms slower: the probe names it, with what the other rank
    waits for it each step, and so does `status` on the same run. The same trainer with every
    rank as slow is named by neither: tests/unit/test_stragglers.py holds the rule's edges."""
    from tests.legs.test_planted_bugs import plant

    plant(
        project,
        "            time.sleep(args.data_delay)",
        '            time.sleep(args.data_delay if os.environ.get("RANK") == "1" else 0.0)',
    )
    plant(project, "import argparse\n", "import argparse\nimport os\n")
    edit_config(
        project, trainer__command="torchrun --standalone --nproc_per_node=2 train.py --ckpt-every 5 --data-delay 0.05"
    )
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "probe", "--cpu", "--steps", "20", "--json"], cwd=project, timeout=600)
    named = check(res.json()["checks"], Kind.STRAGGLER, leg=0)
    assert named["facts"]["rank"] == 1 and named["facts"]["excess_s"] > 0.04, named
    assert named["detail"].startswith("rank 1 is a straggler (steps "), named
    status = run_cli(["status", res.json()["run_id"], "--json"], cwd=project).json()
    assert status["stragglers"]["rank"] == 1 and status["stragglers"]["summary"].startswith("rank 1 is a straggler")

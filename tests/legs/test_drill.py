"""`launcher drill cold-resume` on the local backend: kills at chosen moments, resumes checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, edit_config, failed, leg_events, run_cli


def drill(project: Path, *args: str) -> tuple[int, list[dict], dict]:
    res = run_cli(["drill", "cold-resume", "--json", *args], cwd=project, timeout=1200)
    out = res.json()
    run = run_cli(["ledger", out["run_id"], "--json"], cwd=project).json()[0]
    return res.code, out["checks"], run


def fell_back(checks: list[dict], leg: int, moment: str, at_event: str) -> None:
    """Leg `leg` of a passing drill was killed at `moment` (the line of `at_event` for step S): an
    older step V was the newest verified in the store, and the next leg resumed there, exactly."""
    killed = check(checks, Kind.KILLED, leg=leg)
    assert killed["facts"]["moment"] == moment, killed
    found = re.search(
        rf'"{at_event}", "step": (\d+)(, "name": "step-\d+")?\}}; newest verified in store after the '
        r"kill: step (\d+)",
        killed["detail"],
    )
    saving, verified = int(found.group(1)), int(found.group(3))
    assert verified < saving
    assert f"resumed at step {verified};" in check(checks, Kind.RESUMED_NEWEST, leg=leg + 1)["detail"]
    assert check(checks, Kind.STORE_AFTER_KILL, leg=leg)["ok"]
    assert "identical at every step" in check(checks, Kind.TIMELINE)["detail"]


def test_a_kill_during_the_background_write_never_leaves_a_verified_checkpoint(project: Path) -> None:
    """Killed while the snapshot of step S was being written off the critical path: S never
    reaches the store; the next leg resumes from the newest verified V < S."""
    code, checks, _ = drill(project, "--kills", "1", "--at", "mid-save")
    assert code == 0, failed(checks)
    fell_back(checks, 0, "mid-save", "save")


@pytest.mark.slow
def test_kill_9_matrix_four_random_kills(project: Path) -> None:
    """4 kills at random moments, each of step/push/verify/prune once (seed 4); every resume
    exact, each checked against the launcher's read of the store's state. (It was 20 kills over
    130 steps, 92 s of a 20-minute suite, then 8 over 60, 47 s; every resume exact in every run on
    record; the moments are each drawn once here, as often as a kill of one moment costs.) The
    same drill is the record of its kills (a leg each, the straight run last, in the ledger) and
    the kill mid-push that falls back to the previous verified checkpoint: two drills of their
    own until session 14."""
    edit_config(project, rungs__drill={"steps": 32, "budget_minutes": 10})
    code, checks, run = drill(project, "--kills", "4", "--at", "random", "--seed", "4")
    assert code == 0, failed(checks)
    moments = {c["leg"]: c["facts"]["moment"] for c in checks_of(checks, Kind.KILLED)}
    assert sorted(moments.values()) == sorted(["after-push", "mid-push", "mid-verify", "mid-step"])  # each once
    resumed = checks_of(checks, Kind.RESUMED_NEWEST)
    assert len(resumed) == 4 and all(
        c["ok"] and "the launcher's read of that checkpoint" in c["detail"] for c in resumed
    ), resumed
    # the record: a leg per kill, each ended by its kill, then the last leg and the straight run
    assert run["rung"] == "drill" and run["verdict"] == "pass"
    assert [leg["role"] for leg in run["legs"]] == [None] * 5 + ["straight"]
    assert [leg["leg"] for leg in run["legs"] if leg["killed"]] == sorted(moments) == list(range(4))
    assert all(leg["end_reason"].startswith(f"drill kill {moments[leg['leg']]} at ") for leg in run["legs"][:4])
    assert {c["leg"] for c in checks_of(run, Kind.RESUMED_NEWEST)} == set(range(1, 5))
    # a kill mid-push (written, its upload in flight) falls back to the previous verified checkpoint
    leg = min(i for i, m in moments.items() if m == "mid-push")
    fell_back(checks, leg, "mid-push", "serialized")
    replay = check(checks, Kind.LOSS_CONTINUITY, leg=leg + 1)
    assert replay["ok"] and "must match exactly" in replay["detail"]  # the lost steps re-run exactly
    assert "re-run reading the same batches" in check(checks, Kind.DATA_POSITION, leg=leg + 1)["detail"]


def test_the_default_drill_kills_after_the_lrs_turn_and_sigterms_after_an_epoch_boundary(
    tmp_path: Path, leg_tmp: Path
) -> None:
    """`--at auto`, the default: the straight-through run goes first and its events say where
    the rare state changes. plain_loop (8 batches an epoch, the LR halved on a plateau): the
    SIGTERM lands just after the first epoch boundary, the SIGKILL just after the LR's first
    cut; every check holds (the scheduler is in the state)."""
    from tests.legs.test_planted_bugs import copy_example

    root = copy_example("plain_loop", tmp_path)
    edit_config(
        root,
        trainer={"command": "python train.py --ckpt-every 5 --batch 32"},
        rungs={"rehearsal": {"steps": 20, "budget_minutes": 5}, "drill": {"steps": 32, "budget_minutes": 5}},
    )
    assert run_cli(["review"], cwd=root).code == 0
    code, checks, run = drill(root)
    assert code == 0, failed(checks)
    stopped = check(checks, Kind.STOPPED_AS_ASKED, leg=0)
    assert stopped["ok"] and stopped["facts"]["want"] == "sigterm", stopped
    final = check(checks, Kind.SIGTERM_FINAL, leg=0)
    assert final["ok"] and "on the SIGTERM sent at step 10" in final["detail"], final  # epoch 1 begins at step 9
    assert check(checks, Kind.KILLED, leg=1)["facts"]["moment"] == "at step 18"  # the LR is first cut at step 17
    assert [leg["killed"] for leg in run["legs"]] == [False, True, False, False]


def test_a_trainer_that_dies_on_sigterm_fails_the_default_drill(project: Path) -> None:
    """No final push on SIGTERM (the default handler kills the process): the default drill's
    SIGTERM moment says so; no kill-only drill could."""
    from tests.legs.test_planted_bugs import SIGTERM_DEFAULT, plant

    plant(
        project,
        "    model.train()\n",
        "    model.train()\n" + "".join("    " + ln + "\n" for ln in SIGTERM_DEFAULT.splitlines()),
    )
    res = run_cli(["drill", "cold-resume"], cwd=project, timeout=1200)  # as a user reads it: no --json
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    bad = failed(run)
    assert run["rung"] == "drill", run["rung"]
    assert res.code == 1 and checks_of(bad, Kind.SIGTERM_FINAL) and checks_of(bad, Kind.STOPPED_AS_ASKED), bad
    answer = " ".join(res.out[res.out.rindex("answer:") :].split())  # the last line, however it wrapped
    assert answer.startswith("answer: no ("), answer  # and it names the failed checks
    assert check(bad, Kind.SIGTERM_FINAL)["name"] in answer and check(bad, Kind.STOPPED_AS_ASKED)["name"] in answer


def test_kills_at_the_users_own_steps(project: Path) -> None:
    code, checks, run = drill(project, "--kills-at", "13")
    assert code == 0, failed(checks)
    killed = check(checks, Kind.KILLED, leg=0)["facts"]["moment"]
    assert killed == "at step 13" and len(run["legs"]) == 3  # one kill, the last leg, the straight run
    assert [leg["end_reason"] for leg in run["legs"] if leg["killed"]] == [
        'drill kill at step 13 at {"event": "step", "step": 13}'
    ]
    for bad in ("17,8", "0,3", "3,x"):
        res = run_cli(["drill", "cold-resume", "--kills-at", bad], cwd=project)
        assert res.code == 2 and "--kills-at" in res.err and "Traceback" not in res.err, (bad, res.err)


EPOCH_AT = "    sess.step(loss=loss, batch=x, tokens=tokens_per_step, sample_index=first_sample)\n"


def test_the_resume_matrix_moments_on_two_ranks_resume_where_planned(project: Path) -> None:
    """`--at mid-epoch,epoch-end,mid-epoch-1`: three graceful SIGTERMs placed from the straight
    run's `epoch`, so the resumes land mid-epoch 0, exactly at the epoch boundary and mid-epoch 1
    (the 2nd and 3rd resumes of one run). The reference trainer on 2 ranks, its steps made to print
    their epoch, 96 samples of 16 a step (6 steps an epoch) over 10 steps: stops after steps 3, 6
    and 8, and both ranks of each next leg resume there; every check of the drill holds. (With 4
    steps an epoch, mid-epoch's resume at step 2 leaves loss continuity under 3 steps to measure a
    band on.) The moments' placing and refusals: tests/unit/test_drill_moments.py."""
    train = project / "train.py"
    text = train.read_text()
    assert EPOCH_AT in text
    train.write_text(text.replace(EPOCH_AT, EPOCH_AT[:-2] + ", epoch=first_sample // order.n_samples)\n"))
    command = "torchrun --standalone --nproc_per_node=2 train.py --ckpt-every 5 --data-tokens 6145"
    edit_config(project, trainer__command=command, rungs__drill={"steps": 10, "budget_minutes": 5})
    assert run_cli(["review"], cwd=project).code == 0
    code, checks, run = drill(project, "--at", "mid-epoch,epoch-end,mid-epoch-1")
    assert code == 0, failed(checks)
    for leg, step in enumerate((3, 6, 8)):
        placed = check(checks, Kind.KILL_MOMENT, leg=leg)
        assert placed["ok"] and f"stopped at step {step}," in placed["detail"], placed
        assert check(checks, Kind.SIGTERM_FINAL, leg=leg)["ok"]
    assert [leg["role"] for leg in run["legs"]] == [None] * 4 + ["straight"]
    logs = [leg_events(leg) for leg in run["legs"]]
    keys = ("from_step", "checkpoint", "sample_index", "batch_hash", "lr")
    for events, step in zip(logs[1:4], (3, 6, 8)):
        resumes = {e["rank"]: e for e in events if e["event"] == "resume"}
        assert sorted(resumes) == [0, 1], resumes  # every rank says where it resumed, in its own line
        assert {k: resumes[0][k] for k in keys} == {k: resumes[1][k] for k in keys}  # the same cursor
        assert resumes[0]["from_step"] == step and resumes[0]["sample_index"] == step * 16  # 2 ranks x batch 8
        assert resumes[1]["rank_sample_index"] - resumes[0]["rank_sample_index"] == 8
    # Each rank read its own slice; together they read every sample once (the straight run's 10 steps).
    read = sorted(e["sample_index"] + k for e in logs[4] if e["event"] == "step" for k in range(8))
    assert read == list(range(10 * 16))
    # Only rank 0 pushes; both ranks finish with the same verdict; memory is the MAX across ranks.
    assert {e["rank"] for events in logs for e in events if e["event"] == "push"} == {0}
    assert [e["final_checkpoint_verified"] for e in logs[3] if e["event"] == "done"] == [True, True]
    for events in (logs[3], logs[4]):  # the legs that reach step 10, the first metrics window
        memory = [e for e in events if e["event"] == "memory"]
        assert {e["rank"] for e in memory} == {0, 1}, memory
        for at in ([e for e in memory if e["step"] == s] for s in {e["step"] for e in memory}):
            assert len({e["peak_max"] for e in at}) == 1 and at[0]["peak_max"] == max(e["peak"] for e in at)

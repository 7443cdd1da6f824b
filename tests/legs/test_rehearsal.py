"""Rung 1 end to end on the embedded default: the real trainer, two legs, a resume from the store."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import SECRET, Rehearsed, check, checks_of, edit_config, failed, run_cli

ASSETS = Path(__file__).parents[1] / "assets"


def dry_run_env(text: str) -> dict[str, str]:
    """The leg-0 environment a local dry run prints (`$ cd <dir> && K=V ... command`)."""
    line = next(ln for ln in text.splitlines() if ln.startswith("$ cd "))
    words = shlex.split(line.split(" && ", 1)[1])
    return dict(w.split("=", 1) for w in words if "=" in w and w.split("=", 1)[0].isupper())


def test_rehearsal_resumes_at_the_pushed_step(rehearsed: Rehearsed) -> None:
    """The worker's shared rehearsal (tests/legs/conftest.py): its dry run, then the rehearsal
    with HF_TOKEN set."""
    project, res = rehearsed.root, rehearsed.res
    shown, shown_at = dry_run_env(rehearsed.dry.json()["text"]), rehearsed.shown_at
    assert all(c["ok"] for c in checks_of(res)), failed(res)
    # Three legs, two sequential resumes, each at the step the previous leg pushed: leg 0 ended by
    # SIGTERM once it printed step 6, leg 1 by its deadline (it holds itself at step 13 until it comes).
    resumed = check(res, Kind.RESUMED, leg=1)["detail"]
    s0 = int(resumed.split(" at step ")[1].split(";")[0])
    assert s0 in (6, 7, 8) and f"leg 0 pushed step {s0}" in resumed
    stops = [check(res, Kind.STOPPED_AS_ASKED, leg=leg)["facts"] for leg in (0, 1)]
    assert stops == [{"want": "sigterm", "got": "sigterm"}, {"want": "deadline", "got": "deadline"}], stops
    s1 = int(check(res, Kind.RESUMED, leg=2)["detail"].split(" at step ")[1].split(";")[0])
    assert s1 == 13, check(res, Kind.RESUMED, leg=2)  # the hold: at the planned step, on any machine speed
    for leg in (0, 1, 2):  # the launcher's own read of the store after each leg
        assert "fetched whole, every file's sha256 matches" in check(res, Kind.READBACK, leg=leg)["detail"]
    assert f"step {s0 + 1} read" in check(res, Kind.DATA_POSITION, leg=1)["detail"]
    assert "samples 0..159 read once each" in check(res, Kind.SAMPLE_INDEX)["detail"]
    assert "steps 1..20: 20 batch hashes, none read twice" in check(res, Kind.NO_REPEAT)["detail"]
    assert "identical at every step" in check(res, Kind.TIMELINE)["detail"]
    assert "straight-through run's LR" in check(res, Kind.LR, leg=2)["detail"]

    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["rung"] == "rehearsal" and run["verdict"] == "pass" and run["exit_code"] == 0
    assert [leg["exit_code"] for leg in run["legs"]] == [0, 0, 0, 0]
    assert [leg["role"] for leg in run["legs"]] == [None, None, None, "straight"]
    assert run["legs"][0]["command"][1:] == ["train.py", "--ckpt-every", "5"]
    assert [leg["env"]["LAUNCHER_MAX_STEPS"] for leg in run["legs"]] == ["12", "19", "20", "20"]
    assert json.loads(run["legs"][0]["env"]["LAUNCHER_FILES_SHA256"]) == run["files"]
    assert set(run["files"]) == {"train.py"} and len(run["files"]["train.py"]) == 64
    assert run["billed_gpu_hours"] == 0.0  # CPU legs bill no GPU time
    assert len({leg["instance"] for leg in run["legs"]}) == 4  # a fresh disk per leg

    # The dry run showed leg 0 the environment the real leg 0 got (one runtime.contract.leg_env):
    # the same names and values but the run's id and a deadline as far from its start.
    real = run["legs"][0]
    assert set(shown) == set(real["env"]) and shown["CUDA_VISIBLE_DEVICES"] == ""
    for name in set(shown) - {"LAUNCHER_RUN_ID", "LAUNCHER_DEADLINE"}:
        assert shown[name] == real["env"][name], name
    assert shown["LAUNCHER_RUN_ID"] == "dry-run" and real["env"]["LAUNCHER_RUN_ID"] == run["id"]
    ahead = int(real["env"]["LAUNCHER_DEADLINE"]) - real["started_at"]
    assert abs((int(shown["LAUNCHER_DEADLINE"]) - shown_at) - ahead) <= 5, (shown, real["env"])

    # The secret reached the legs' environment but was written down nowhere.
    state = project / ".launcher"
    assert SECRET not in res.out + res.err
    assert SECRET not in (state / "ledger.db").read_bytes().decode("latin-1")
    for log in (state / "runs").rglob("*.log"):
        assert SECRET not in log.read_text()


def test_rehearsal_says_no_when_leg_1_does_not_resume(project: Path) -> None:
    shutil.copyfile(ASSETS / "forgetful_train.py", project / "train.py")
    edit_config(project, trainer__modules=[])
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "rehearsal", "--json"], cwd=project)
    assert res.code == 1
    # It ignores SIGTERM and pushes nothing the launcher can read: the rung stops at leg 0.
    assert check(failed(res), Kind.STOPPED_AS_ASKED, leg=0)["facts"]["want"] == "sigterm"
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["verdict"] == "fail" and run["exit_code"] == 1


def test_rehearsal_cycles_through_the_hub_when_configured(project: Path, hub_server) -> None:  # noqa: ANN001
    edit_config(project, store="hf://tester/ckpts")
    env = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": "hf_good", "HF_HOME": str(project / "hf-home")}
    res = run_cli(["up", "rehearsal", "-v"], cwd=project, env=env)
    assert res.code == 0, res.out + res.err
    # -v: every event as a sentence (the checkpoint cycle's deletes too), then the check table.
    assert len(res.out.splitlines()) > 60 and "delete" in res.out, res.out[-2000:]
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["checks"] and all(c["ok"] for c in run["checks"]), [c for c in run["checks"] if not c["ok"]]
    assert run["store_uri"] == "hf://tester/ckpts"
    # The checkpoints went through the Hub: LFS uploads on the second origin, ranged reads back.
    puts = [r for r in hub_server.requests if r.method == "PUT" and r.origin == "lfs"]
    assert len(puts) >= 4
    repo = hub_server.repos["tester/ckpts"]
    head = repo.commits[repo.branches["main"]]
    assert f"runs/{run['id']}/step-00000020/verified.json" in head.files


def test_a_refused_token_stops_the_leg_with_the_reason(project: Path, hub_server) -> None:  # noqa: ANN001
    """The store guard asks the store the launcher reads (tests/legs/test_plan.py); a leg whose own
    store refuses its token (here `leg_env` sends the legs to another Hub, which knows another
    token) stops at its first push and says why."""
    from tests.fakes.hub_server import HubServer

    with HubServer(token="hf_other") as elsewhere:
        edit_config(project, store="hf://tester/ckpts", leg_env={"HF_ENDPOINT": elsewhere.url})
        assert run_cli(["review"], cwd=project).code == 0
        env = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": "hf_good", "HF_HOME": str(project / "hf-home")}
        res = run_cli(["up", "rehearsal", "--json"], cwd=project, env=env)
    assert res.code == 1, res.out + res.err
    leg0 = check(res, Kind.LEG_FINISHED, leg=0)
    assert not leg0["ok"] and "store_error" in leg0["detail"] and "StoreAuthError" in leg0["detail"]

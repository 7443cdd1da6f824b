"""Several nodes, for real, on one host: `--backend local --nodes N` runs the very `run:`
script the sky backend renders on N fresh folders, each with SkyPilot's node variables,
torchrun's static rendezvous across them and gloo between the ranks
(launcher.backends.nodes). The passing 2-node x 2-rank rehearsal is the fsdp example's
(tests/legs/test_examples.py), checked here by `each_node_ran_the_sky_script`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from tests.helpers import edit_config, leg_events, run_cli


def two_by_one(project: Path) -> None:
    """One rank on each of two nodes (PREFLIGHT_NPROC_PER_NODE; a CPU node runs one unless told)."""
    edit_config(project, leg_env={"HF_HUB_DISABLE_XET": "1", "PREFLIGHT_NPROC_PER_NODE": "1"})
    assert run_cli(["review"], cwd=project).code == 0


def sky_rendered_run(project: Path, rung: str) -> str:
    """The `run:` script `up RUNG --backend sky --nodes 2 --dry-run` prints in its task YAML (a
    dry run SkyPilot's API server takes part in: its test asks for `sky_api`)."""
    res = run_cli(["up", rung, "--backend", "sky", "--nodes", "2", "--dry-run"], cwd=project)
    text = res.out.split("task YAML", 1)[1].split("\n", 1)[1].split("\nskypilot:")[0]
    task = yaml.safe_load(text)
    assert task["num_nodes"] == 2, text
    return task["run"]


def each_node_ran_the_sky_script(project: Path, run_id: str, planned: dict, steps: int) -> None:
    """A passing 2-node x 2-rank rehearsal (the fsdp example's, tests/legs/test_examples.py): every
    leg, the straight-through one too, ran the bytes SkyPilot would run on each node, as the
    dry run planned; each node's log holds its own two ranks; leg 0 ended on its SIGTERM; the
    memory MAX is over every rank of every node."""
    run = run_cli(["ledger", run_id, "--json"], cwd=project).json()[0]
    script = sky_rendered_run(project, "rehearsal")
    for leg in run["legs"]:
        assert leg["run_sha256"] == hashlib.sha256(script.encode()).hexdigest() == planned["plan"]["run_sha256"]
        assert [n["node"] for n in leg["nodes"]] == [0, 1] and leg["command"][:2] == ["bash", "-c"]
        assert leg["command"][2] == script  # the bytes SkyPilot would run, executed
        for node in leg["nodes"]:
            events = leg_events({"log_path": node["log"]})
            assert events and {e["node"] for e in events} == {node["node"]}, node
            ranks = {e["rank"] for e in events if e["event"] != "log"}  # the watcher beside them is no rank
            assert ranks == {2 * node["node"], 2 * node["node"] + 1}
    assert run["legs"][0]["end_reason"].startswith("node ")  # stopped by SIGTERM: torchrun exits 1 on each
    status = run_cli(["status", run_id, "--json"], cwd=project).json()
    assert [(n["node"], n["step"], n["exit_code"]) for n in status["leg"]["nodes"]] == [(0, steps, 0), (1, steps, 0)]
    # the memory MAX is over every rank of every node: each rank prints the same peak_max, the largest peak
    windows = 0
    for leg in run["legs"]:
        memory = [e for e in leg_events(leg) if e["event"] == "memory"]
        for step in {e["step"] for e in memory}:
            at = [e for e in memory if e["step"] == step]
            assert {e["rank"] for e in at} == {0, 1, 2, 3} and {e["peak_max"] for e in at} == {
                max(e["peak"] for e in at)
            }
            windows += 1
    assert windows >= 1


def test_a_node_lost_alone_ends_the_leg_and_the_cluster_with_it(project: Path, tmp_path: Path) -> None:
    """`lose_node` kills one node's processes (found by the node's token), nothing else; the
    cluster then ends the leg, tearing down the node left, and nothing of the leg outlives it."""
    import dataclasses
    import time

    from launcher.backends.base import LegSpec, StagedFile
    from launcher.backends.leash import leg_pids, leg_token
    from launcher.backends.local import LocalBackend
    from launcher.config.load import load_config

    script = project / "sleeper.py"
    script.write_text("import os, time\nprint('ready', os.environ['RANK'], flush=True)\ntime.sleep(600)\n")
    cfg = load_config(project / "launcher.yaml")
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, command=["python", "sleeper.py"]))
    run_id = "nodes-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]
    env = {
        "LAUNCHER_RUN_ID": run_id,
        "LAUNCHER_LEG": "0",
        "LAUNCHER_RUNG": "rehearsal",
        "LAUNCHER_DEADLINE": str(int(time.time()) + 300),
    }
    files = {"sleeper.py": StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())}
    spec = LegSpec(run_id, 0, "rehearsal", tuple(cfg.trainer.command), env, {}, files, tmp_path / "leg-0.log")
    backend = LocalBackend(root=tmp_path / "legs", cfg=cfg, nodes=2)
    lines: list[str] = []
    handle = backend.launch(spec, on_line=lines.append)
    deadline = time.time() + 60
    while sum("ready" in line for line in lines) < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert {line.split(" ready")[0] for line in lines if " ready " in line} == {"(node 0)", "(node 1)"}, lines
    assert backend.wait(handle, timeout=0.5) is None  # both nodes run
    backend.lose_node(handle, 1)
    result = backend.wait(handle, timeout=60)
    assert result is not None and result.end_reason.startswith("node 1 exited -9; the other nodes were torn down")
    assert result.survivors == 0 and leg_pids(leg_token(run_id, 0)) == []
    assert [n["exit_code"] for n in result.nodes] == [-9, -9] and not Path(handle.instance).exists()


def test_node_lost_needs_several_nodes_on_a_backend_that_can(project: Path) -> None:
    res = run_cli(["drill", "cold-resume", "--at", "node-lost"], cwd=project)
    assert res.code == 2 and "--at node-lost loses one node of several" in res.err, res.err
    res = run_cli(["drill", "cold-resume", "--at", "node-lost", "--nodes", "2", "--backend", "sky"], cwd=project)
    assert res.code == 2 and "not --nodes 2 on sky" in res.err, res.err

"""The Accelerate example on several ranks, launched as its users launch it: under `torchrun
--nproc_per_node 2` (one node, one disk), there with gradient accumulation (4 micro-batches per
optimizer step, resumed inside windows), and on two nodes of one rank each (`--nodes 2`: each
node an empty folder of its own, only the store shared). Each climbs static -> rehearsal ->
`drill cold-resume --kills 2 --at mid-push` -> report, every rank's `step` events read by the
launcher's per-rank checks (docs/notes-multirank.md: before, only rank 0 printed, a resumed epoch 1
replayed epoch 0's order, two nodes pushed rank 0's RNG file only, and rank 0 pushed a folder
before rank 1 wrote into it). And `accelerate launch --cpu --num_processes 2`, which starts one
process, refused at rung 0."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import edit_config, run_cli
from tests.legs.test_examples import copy_example, hf_python
from tests.legs.test_multirank_hf import climb, newest_drill_manifest


def test_accelerate_launch_cpu_with_two_processes_is_refused_at_rung_0(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("accelerate", tmp_path)
    accelerate = Path(hf_python()).with_name("accelerate")
    edit_config(root, trainer__command=f"{accelerate} launch --cpu --num_processes 2 train.py --ckpt-every 5")
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["up", "static"], cwd=root)
    said = res.err.strip().splitlines()
    assert res.code == 3 and len(said) == 1 and "runs one process, not 2" in said[0], (res.out[-2000:], res.err)
    assert "--multi_gpu --num_processes 2" in said[0] and "Accelerator(cpu=True)" in said[0], said


def test_the_accelerate_example_climbs_on_one_node_of_two_ranks_accumulating_4(tmp_path: Path, leg_tmp: Path) -> None:
    """Batches of 4: 10 a rank an epoch, so windows of 4 (an epoch's last of 2) and the legs'
    stops and saves (every 5 micro-batches) inside them: each resumed exactly (proof 3 PASS)."""
    root = copy_example("accelerate", tmp_path)
    torchrun = Path(hf_python()).with_name("torchrun")
    command = f"{torchrun} --standalone --nproc_per_node 2 train.py --ckpt-every 5 --batch-size 4 --grad-accum 4"
    edit_config(root, trainer__command=command)
    assert run_cli(["review"], cwd=root).code == 0
    took = climb(root, [])
    manifest = newest_drill_manifest(root)
    assert {k: manifest["meta"][k] for k in ("world_size", "accumulation", "per_rank_batch")} == {
        "world_size": 2,
        "accumulation": 4,
        "per_rank_batch": 4,
    }
    print(f"1 node x 2 ranks, accumulation 4: climbed in {took:.0f} s")


def test_the_accelerate_example_climbs_on_two_nodes_of_one_rank(tmp_path: Path, leg_tmp: Path) -> None:
    root = copy_example("accelerate", tmp_path)
    edit_config(root, leg_env={"PREFLIGHT_NPROC_PER_NODE": "1"})
    assert run_cli(["review"], cwd=root).code == 0
    took = climb(root, ["--nodes", "2"])
    manifest = newest_drill_manifest(root)
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {f["path"] for f in manifest["files"]}  # node 1's too
    assert manifest["meta"]["world_size"] == 2 and manifest["meta"]["accumulation"] == 1
    print(f"2 nodes x 1 rank: climbed in {took:.0f} s")

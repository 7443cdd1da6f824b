"""The plan of several processes: the interpreter rung 0 of a torchrun command runs in
(launcher.backends.local.trainer_python), the shape the plan knows (launcher.ops.shape: world size
and accumulation from the command, the nodes and the node script) and the refusal of a resume
from a checkpoint saved in another shape, read with runtime's store API."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher.backends.local import resolve_command, trainer_python
from launcher.config.schema import Config, GpuSpec, TrainerConfig
from launcher.errors import Refused
from launcher.ops.shape import Shape, command_processes, planned_shape, resume_refusal
from runtime.store import Manifest, open_store
from tests.unit.test_store import make_checkpoint, mark_verified


def fake_venv(root: Path, script: str) -> tuple[Path, Path]:
    """A venv's bin holding `script` (pip's console script: `#!<venv>/bin/python3.11`)."""
    venv = root / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python3.11"
    python.write_text("")
    (venv / script).write_text(f"#!{python}\nimport sys\n")
    (venv / script).chmod(0o755)
    return venv, python


def test_torchrun_runs_rung_0_in_the_interpreter_its_script_names(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A trainer's venv's torchrun starts the script with that venv's python: rung 0 runs there
    (before: the launcher's, which lacked the trainer's modules: "No module named 'datasets'")."""
    venv, python = fake_venv(tmp_path, "torchrun")
    assert trainer_python([str(venv / "torchrun"), "--nproc_per_node", "2", "train.py"]) == str(python)
    monkeypatch.setenv("PATH", str(venv))  # a bare `torchrun`: the one on PATH, for rung 0 and the leg
    assert resolve_command(["torchrun", "train.py"])[0] == str(venv / "torchrun")
    assert trainer_python(["torchrun", "train.py"]) == str(python)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # none on PATH: the one beside this interpreter, if any
    beside = Path(sys.executable).parent / "torchrun"
    assert resolve_command(["torchrun", "t.py"])[0] == (str(beside) if beside.exists() else "torchrun")


@pytest.mark.parametrize(
    "command, ranks",
    [
        (
            "torchrun --standalone --nproc_per_node 2 train.py --nproc_per_node 9",
            2,
        ),  # the script's own is not torchrun's
        ("/v/bin/torchrun --nproc-per-node=4 train.py", 4),
        ("torchrun train.py", 1),
        ("torchrun --nproc_per_node auto train.py", None),  # GPUs or CPUs of the machine: not guessed
        ("torchrun --nnodes 2 --nproc_per_node 2 train.py", None),
        ("accelerate launch --multi_gpu --num_processes 2 train.py", 2),
        ("accelerate launch --num_processes 2 --cpu train.py", 1),  # its simple launcher: one process
        ("accelerate launch train.py", None),  # its config file decides
        ("python train.py", None),  # Lightning's launcher may start more
    ],
)
def test_the_ranks_a_command_starts_on_one_node(command: str, ranks: int | None) -> None:
    assert command_processes(command.split())[0] == ranks


def cfg_of(command: str, **leg_env: str) -> Config:
    return Config(project="p", trainer=TrainerConfig(command=command.split()), leg_env=dict(leg_env))


def test_the_plans_shape_counts_every_node() -> None:
    """One node runs the command as it is; several nodes (or sky) run the node script, which
    starts PREFLIGHT_NPROC_PER_NODE ranks, else one per GPU, else one (sky/*.yaml)."""
    cmd = "torchrun --nproc_per_node 2 train.py --gradient_accumulation_steps 4"
    shape = planned_shape(cfg_of(cmd), "rehearsal", "local", 1, None)
    assert (shape.world_size, shape.accumulation) == (2, 4)
    assert planned_shape(cfg_of(cmd), "rehearsal", "local", 2, None).world_size == 2  # 2 nodes x 1 (CPU)
    nproc = cfg_of(cmd, PREFLIGHT_NPROC_PER_NODE="2")
    assert planned_shape(nproc, "rehearsal", "local", 2, None).world_size == 4
    assert planned_shape(cfg_of("python train.py"), "probe", "sky", 2, GpuSpec("T4", 2)).world_size == 4
    unknown = planned_shape(cfg_of("python train.py --gradient-accumulation-steps=x"), "rehearsal", "local", 1, None)
    assert (unknown.world_size, unknown.accumulation) == (None, None)
    assert "ranks unknown to the plan" in unknown.describe()


def store_with(tmp_path: Path, meta: dict) -> object:  # noqa: ANN401 - a Store
    """A store whose newest verified checkpoint, step 20, was saved in the shape `meta` says."""
    store = open_store((tmp_path / "store").as_uri(), "runs/r1", key=None)
    folder, plain = make_checkpoint(tmp_path / "local", 20, size=1000)
    manifest = Manifest(plain.name, plain.step, plain.files, meta)
    store.push(folder, manifest)
    mark_verified(store, manifest, folder)
    return store


def test_a_resume_in_another_shape_is_refused_naming_both_values(tmp_path: Path) -> None:
    store = store_with(tmp_path, {"world_size": 2, "accumulation": 4, "per_rank_batch": 8})
    four = Shape(4, "torchrun --nproc_per_node 4", 4, "--gradient_accumulation_steps 4")
    refusal = resume_refusal(store, four)
    assert isinstance(refusal, Refused) and refusal.exit_code == 3
    assert refusal.message == (
        "the newest checkpoint step-00000020 was saved by 2 ranks; this plan runs 4 (torchrun --nproc_per_node 4)"
    )
    both = resume_refusal(store, Shape(1, "one", 2, "--gradient_accumulation_steps 2"))
    assert both is not None and "\n" not in both.message
    assert "saved with gradient accumulation 4; this plan accumulates 2" in both.message
    assert resume_refusal(store, Shape(2, "", 4, "")) is None  # the same shape
    assert resume_refusal(store, Shape()) is None  # what the plan cannot know, the leg's own check decides


def test_a_checkpoint_without_a_shape_or_no_checkpoint_is_not_refused(tmp_path: Path) -> None:
    assert resume_refusal(store_with(tmp_path, {"world_size": "2"}), Shape(4, "x")) is None  # not a number
    empty = open_store((tmp_path / "empty").as_uri(), "runs/r2", key=None)
    assert resume_refusal(empty, Shape(4, "x")) is None


def test_the_plan_warns_where_its_legs_would_run_another_shape_than_the_command_says() -> None:
    from types import SimpleNamespace

    from launcher.ladder import rung_named
    from launcher.ops.shape import shape_warnings

    def warned(command: str, backend: str = "local", nodes: int = 1, gpus: GpuSpec | None = None, **env: str) -> str:
        request = SimpleNamespace(rung=rung_named("rehearsal"), backend=backend, nodes=nodes, gpus=gpus)
        return " ".join(shape_warnings(cfg_of(command, **env), request))

    two = "torchrun --standalone --nproc_per_node 2 train.py"
    assert "starts 1 process(es) (one on a CPU node), not 2" in warned(two, nodes=2)  # its options dropped
    assert warned(two, nodes=2, PREFLIGHT_NPROC_PER_NODE="2") == ""
    assert "read by the node script only" in warned(two, PREFLIGHT_NPROC_PER_NODE="2")
    assert "GPUs left idle" in warned("torchrun train.py", gpus=GpuSpec("T4", 2))
    assert warned(two, gpus=GpuSpec("T4", 2)) == warned("python train.py", gpus=GpuSpec("T4", 2)) == ""


def test_a_shape_that_cannot_run_is_refused_before_anything_is_rented() -> None:
    """A command waiting for more nodes than the leg has would wait for its rendezvous until the
    leg's budget; `accelerate launch` under the node script would fail on every node."""
    from types import SimpleNamespace

    from launcher.ladder import rung_named
    from launcher.ops.shape import refuse_unrunnable

    def refused(command: str, backend: str = "local", nodes: int = 1, rung: str = "rehearsal") -> str:
        request = SimpleNamespace(rung=rung_named(rung), backend=backend, nodes=nodes, gpus=None)
        try:
            refuse_unrunnable(cfg_of(command), request)
        except Refused as err:
            assert err.exit_code == 3 and "\n" not in err.message
            return err.message
        return ""

    said = refused("torchrun --nnodes 2 --nproc_per_node 1 train.py")
    assert said.startswith("the command's `torchrun --nnodes 2` waits for 2 nodes; this plan runs 1")
    assert "waits for 2 nodes" in refused("torchrun --nnodes=2:4 train.py", "docker")
    assert "waits for 3 nodes" in refused("accelerate launch --num_machines 3 --num_processes 6 train.py")
    for runs in ("torchrun --nnodes 1:2 train.py", "torchrun --standalone train.py --nnodes 5", "python train.py"):
        assert refused(runs) == "", runs
    assert refused("torchrun --nnodes 2 train.py", nodes=2) == ""  # the node script drops its options
    assert refused("torchrun --nnodes 2 train.py", rung="static") == ""  # rung 0 launches nothing
    assert "cannot start a leg of 2 node(s)" in refused("accelerate launch --num_processes 2 train.py", nodes=2)
    assert "cannot start a leg of 1 node(s) on sky" in refused("accelerate launch train.py", "sky")

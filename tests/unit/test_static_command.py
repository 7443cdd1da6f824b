"""Rung 0's reading of a leg command (runtime/programs/static_command.py) and the interpreter
it runs in (launcher.backends.local.trainer_python): `accelerate launch` beside python and
torchrun. accelerate's own parser runs in .venv-hf (tests/legs/test_static.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher.backends.local import script_python, trainer_python
from runtime.programs.static_command import split_command


def test_the_shapes_rung_0_reads() -> None:
    assert split_command(["python", "-u", "train.py", "--lr", "1"]) == ("script", "train.py", ["--lr", "1"])
    assert split_command(["python3", "-m", "pkg.train", "-x"]) == ("module", "pkg.train", ["-x"])
    got = split_command(["torchrun", "--nproc_per_node=2", "train.py", "--ckpt-every", "5"])
    assert got == ("script", "train.py", ["--ckpt-every", "5"])
    for bad, said in (
        (["accelerate", "config"], "`accelerate config`"),
        (["accelerate"], "`accelerate nothing`"),
        (["deepspeed", "train.py"], "`accelerate launch ...`"),
        (["torchrun", "--nproc-per-node=2", "python", "train.py"], "instead of the script"),
    ):
        with pytest.raises(ValueError, match=said):
            split_command(bad)


def test_accelerate_launch_needs_accelerate_in_the_interpreter_it_runs_in() -> None:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="has no accelerate"):
            split_command(["accelerate", "launch", "--cpu", "train.py"])
    else:
        assert split_command(["accelerate", "launch", "--cpu", "train.py", "-x"]) == ("script", "train.py", ["-x"])


def test_accelerate_runs_in_the_interpreter_its_script_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's console script starts with `#!<venv>/bin/python`: that interpreter has accelerate
    (and torch), the launcher's may not."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python3.11"
    python.write_text("")
    (venv / "accelerate").write_text(f"#!{python}\nimport sys\n")
    (venv / "accelerate").chmod(0o755)
    assert trainer_python([str(venv / "accelerate"), "launch", "train.py"]) == str(python)
    monkeypatch.setenv("PATH", str(venv))  # bare `accelerate`: the one on PATH
    assert script_python("accelerate") == str(python)
    (venv / "accelerate").write_text("#!/bin/sh\nexec python -m accelerate\n")  # no python in `#!`: the one beside
    (venv / "python").write_text("")
    assert script_python(str(venv / "accelerate")) == str(venv / "python")
    assert trainer_python(["/nowhere/accelerate", "launch", "t.py"]) == sys.executable


def test_a_sigtermed_accelerate_leg_is_judged_by_its_ranks_done() -> None:
    """`accelerate launch` has no SIGTERM handler: it dies of the launcher's SIGTERM (exit -15,
    measured on the accelerate example's rehearsal) while its trainer saves and prints `done`,
    as torchrun exits 1 once its ranks are done; a plain python leg's failing exit stays a failure."""
    from types import SimpleNamespace

    from launcher.rungs.resume_legs import under_torchrun

    def ctx(command: str, nodes: int = 1) -> object:
        return SimpleNamespace(
            cfg=SimpleNamespace(trainer=SimpleNamespace(command=tuple(command.split()))), nodes=nodes
        )

    assert under_torchrun(ctx("/venv/bin/accelerate launch --cpu train.py"))
    assert under_torchrun(ctx("torchrun --nproc-per-node=2 train.py"))
    assert not under_torchrun(ctx("python train.py")) and under_torchrun(ctx("python train.py", nodes=2))

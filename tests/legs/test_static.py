"""Rung 0: imports, command-line parse with the trainer's own parser, hash guard."""

from __future__ import annotations

import shutil
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import Done, assert_one_line_error, check, checks_of, details, edit_config, run_cli, run_rows

STATIC = Kind.TRAINER_STATIC
"""The checks runtime/programs/static_check.py reports (command shape, parse, imports, ...): one
kind, so a test reads what they say together (`details`), or the one that failed."""


def test_static_passes_and_reports_evidence(after_static: Done) -> None:
    project, res = after_static.root, after_static.res
    assert all(c["ok"] for c in checks_of(res))
    assert "train.py --ckpt-every 5" in check(res, Kind.COMMAND_LINE)["detail"]
    assert '"ckpt_every": 5' in details(res, STATIC)
    pointer = checks_of(res, STATIC)[0]["evidence"][0]  # one line: what the static check printed
    log_lines = Path(pointer["log"]).read_text().splitlines()
    assert log_lines[pointer["line"] - 1] == pointer["text"]  # the pointer points at the evidence
    assert run_rows(project) == 1


def test_flag_typo_fails_on_host_with_exit_1(project: Path) -> None:
    edit_config(project, trainer__command="python train.py --ckpt-evry 5")
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1
    assert "unrecognized arguments: --ckpt-evry" in check(res, STATIC, ok=False)["detail"]


def test_torchrun_handed_the_interpreter_fails(project: Path) -> None:
    edit_config(project, trainer__command="torchrun --nproc_per_node=2 python train.py")
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1
    assert "interpreter" in details(res, STATIC, ok=False)


def test_torchrun_command_parses_script_args(project: Path) -> None:
    edit_config(project, trainer__command="torchrun --nproc_per_node=2 train.py --ckpt-every 5")
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 0, res.out


def test_unreviewed_import_fails_in_staged_dir(project: Path) -> None:
    """train.py imports a helper that is not in the reviewed set: a leg would not have it."""
    (project / "helper.py").write_text("VALUE = 1\n")
    train = project / "train.py"
    train.write_text(train.read_text() + "\nimport helper  # noqa: E402\n")
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1
    assert "helper (imported by train.py): not found" in details(res, STATIC, ok=False)


FLAT = """import argparse, sys
p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=10)
args = p.parse_args()          # at module level, like many public scripts
open("TRAINED", "w").write("rung 0 must never get here")
"""


def test_a_flat_script_is_parsed_with_its_own_argv_and_never_trains(project: Path) -> None:
    (project / "flat.py").write_text(FLAT)
    edit_config(project, trainer={"command": "python flat.py --iters 3"}, reviewed=["flat.py"])
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 0, res.out
    assert '"iters": 3' in details(res, STATIC)
    edit_config(project, trainer={"command": "python flat.py --itres 3"})  # a typo: argparse's own message, quoted
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1 and "unrecognized arguments: --itres 3" in details(res, STATIC, ok=False)


def test_an_import_by_absolute_path_is_refused(project: Path, tmp_path: Path) -> None:
    """A sys.path edit that works here and fails on a fresh instance."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret_helper.py").write_text("X = 1\n")
    (project / "flat.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path / 'outside')!r})\nimport secret_helper\n" + FLAT
    )
    edit_config(project, trainer={"command": "python flat.py"}, reviewed=["flat.py"])
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1 and "secret_helper" in details(res, STATIC, ok=False), res.out


def test_hash_mismatch_refused_exit_3_lists_file(project: Path) -> None:
    train = project / "train.py"
    train.write_text(train.read_text() + "\n# edited after review\n")
    for rung in ("static", "rehearsal"):
        res = run_cli(["up", rung], cwd=project)
        assert_one_line_error(res, 3, "changed: train.py")
        assert "launcher review" in res.err
    assert run_rows(project) == 0


def test_missing_reviewed_file_refused(project: Path) -> None:
    (project / "train.py").unlink()
    res = run_cli(["up", "static"], cwd=project)
    assert_one_line_error(res, 3, "missing: train.py")


def test_no_review_refused(tmp_path: Path, leg_tmp: Path) -> None:
    assert run_cli(["init", "p"], cwd=tmp_path).code == 0
    res = run_cli(["up", "static"], cwd=tmp_path / "p")
    assert_one_line_error(res, 3, "no review")


def test_review_then_accepts_edit(project: Path) -> None:
    train = project / "train.py"
    train.write_text(train.read_text() + "\n# reviewed edit\n")
    assert run_cli(["review"], cwd=project).code == 0
    assert run_cli(["up", "static"], cwd=project).code == 0


def nanogpt_shape(tmp_path: Path) -> Path:
    root = tmp_path / "nanogpt_shape"
    shutil.copytree(Path(__file__).parents[1] / "assets" / "nanogpt_shape", root)
    assert run_cli(["review"], cwd=root).code == 0
    return root


def test_a_nanogpt_shaped_script_passes_rung_0_as_it_is(tmp_path: Path, leg_tmp: Path) -> None:
    """Module-level config overridden by `exec(open("configurator.py").read())`, `import wandb`
    under `if wandb_log:` (not installed), a FutureWarning at import, under the default
    `parser: argv`: run up to the end of its configurator, its overrides shown, nothing trained;
    the guarded import is a note. A key the script has no global for fails with the
    configurator's own error, and so does a configurator left out of `reviewed:`."""
    root = nanogpt_shape(tmp_path)
    res = run_cli(["up", "static", "--json"], cwd=root)
    assert res.code == 0, checks_of(res, ok=False)
    said = details(res, STATIC)  # the parse's and the imports' checks among them
    assert "read by configurator.py" in said and '"ckpt_every": 5' in said and '"learning_rate": 0.01' in said, said
    assert "note: imported only under an `if`" in said and "wandb (imported by train.py)" in said, said
    edit_config(root, trainer={"command": "python train.py --ckpt_evry=5"})
    res = run_cli(["up", "static", "--json"], cwd=root)
    assert res.code == 1 and "Unknown config key: ckpt_evry" in details(res, STATIC, ok=False), res.out
    edit_config(root, trainer={"command": "python train.py"}, reviewed=["train.py"])
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["up", "static", "--json"], cwd=root)
    detail = details(res, STATIC, ok=False)
    assert res.code == 1 and "configurator.py is not among the reviewed files" in detail, detail


def test_a_script_with_no_argparse_and_no_configurator_is_refused_naming_the_fix(project: Path) -> None:
    """A script that reads sys.argv by hand cannot be stopped after its parse: rung 0 says to
    set `trainer.parser: none` instead of running it (to its end, training) to find out; with
    that set, it compiles and passes."""
    (project / "by_hand.py").write_text(
        "import sys\nITERS = int(sys.argv[1])\nopen('TRAINED', 'w').write('rung 0 must never get here')\n"
    )
    edit_config(project, trainer={"command": "python by_hand.py 3"}, reviewed=["by_hand.py"])
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 1 and "set trainer.parser: none" in details(res, STATIC, ok=False), res.out
    edit_config(project, trainer={"command": "python by_hand.py 3", "parser": "none"})
    res = run_cli(["up", "static", "--json"], cwd=project)
    assert res.code == 0, res.out


def test_a_warning_is_not_quoted_as_the_reason_a_script_stopped() -> None:
    from runtime.programs.static_check import last_error_line

    err = (
        "train.py:40: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated.\n"
        "  scaler = torch.cuda.amp.GradScaler(enabled=False)\n"
        "usage: train.py [-h]\ntrain.py: error: the following arguments are required: --data\n"
        "/x/y.py:3: UserWarning: late\n  warnings.warn('late')\n"
    )
    assert last_error_line(err) == "train.py: error: the following arguments are required: --data"
    assert last_error_line("a.py:1: DeprecationWarning: x\n  y\n") is None


def test_an_accelerate_launch_command_is_parsed_by_accelerate_in_its_own_interpreter(
    tmp_path: Path, leg_tmp: Path
) -> None:
    """`accelerate launch [opts] train.py ARGS`: rung 0 runs in the interpreter `accelerate`
    belongs to (.venv-hf; the launcher's has no accelerate), accelerate's parser checks its
    flags, the script's parser the rest."""
    from tests.legs.test_examples import copy_example, hf_python

    root = copy_example("accelerate", tmp_path)
    accelerate = str(Path(hf_python()).parent / "accelerate")
    command = f"{accelerate} launch --num_processes 1 --cpu train.py --ckpt-every 5"
    edit_config(root, trainer__command=command)
    res = run_cli(["up", "static", "--json"], cwd=root)
    assert res.code == 0, res.out
    assert '"ckpt_every": 5' in details(res, STATIC)
    edit_config(root, trainer__command=command.replace("--num_processes", "--num_procesess"))
    res = run_cli(["up", "static", "--json"], cwd=root)
    assert res.code == 1 and "accelerate launch rejects its flags" in details(res, STATIC, ok=False), res.out

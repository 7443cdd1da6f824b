"""Rung 0's reading of the leg command: which script or module it runs, with which arguments.

Four shapes: `python [-u] script.py ARGS`, `python -m module ARGS`, `torchrun [TORCHRUN ARGS]
script.py|-m module ARGS` and `accelerate launch [OPTS] script.py|-m module ARGS`. torchrun's
and accelerate's flags are checked by their own parsers, imported in the trainer's interpreter
(runtime.programs.static_check runs there), so a flag either one would refuse fails at rung 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os


class Refusal(ValueError):
    """A command rung 0 refuses outright (the launcher exits 3): it parses, but would run another
    shape than it names (`accelerate launch --cpu --num_processes 2` starts one process)."""


PYTHON_FLAGS_NO_ARG = {"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-b", "-bb", "-q"}


def split_command(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind, target, args): kind is 'script' or 'module'. Raises ValueError."""
    if not argv:
        raise ValueError("empty command")
    exe = os.path.basename(argv[0])
    if exe == "torchrun":
        return _torchrun(argv[1:])
    if exe == "accelerate":
        return _accelerate(argv[1:])
    if not exe.startswith("python"):
        raise ValueError(
            f"rung 0 understands `python ...`, `torchrun ...` and `accelerate launch ...` commands, not {argv[0]!r}"
        )
    i = 1
    while i < len(argv) and argv[i] in PYTHON_FLAGS_NO_ARG:
        i += 1
    if i >= len(argv):
        raise ValueError("the command names no script or module")
    if argv[i] == "-m":
        if i + 1 >= len(argv):
            raise ValueError("`-m` with no module name")
        return "module", argv[i + 1], argv[i + 2 :]
    if argv[i].startswith("-"):
        raise ValueError(f"unsupported interpreter flag {argv[i]!r}")
    return "script", argv[i], argv[i + 1 :]


def _parsed_by(parser: argparse.ArgumentParser, args: list[str], program: str) -> argparse.Namespace:
    """`args` parsed by a launcher program's own parser; its complaint as a ValueError."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            return parser.parse_args(args)
        except SystemExit:
            said = err.getvalue().strip().splitlines() or ["no message"]
            raise ValueError(f"{program} rejects its flags: {said[-1]}") from None


def _script_of(ns: argparse.Namespace, program: str) -> tuple[str, str, list[str]]:
    """The script or module a launcher program (torchrun, accelerate launch) runs, from its parse."""
    script, rest = ns.training_script, list(ns.training_script_args)
    if ns.module:
        return "module", script, rest
    if ns.no_python:
        raise ValueError(f"{program} --no-python runs a program, not a Python script: rung 0 cannot parse it")
    if os.path.basename(script).startswith("python"):
        raise ValueError(
            f"{program} was handed the interpreter {script!r} instead of the script ({program} adds python itself)"
        )
    return "script", script, rest


def _torchrun(args: list[str]) -> tuple[str, str, list[str]]:
    from torch.distributed.run import get_args_parser

    return _script_of(_parsed_by(get_args_parser(), args, "torchrun"), "torchrun")


def _accelerate(args: list[str]) -> tuple[str, str, list[str]]:
    """`accelerate launch [OPTS] script.py|-m module ARGS`, parsed by accelerate's own parser in
    the interpreter `accelerate` belongs to (launcher.backends.local.trainer_python)."""
    if not args or args[0] != "launch":
        said = args[0] if args else "nothing"
        raise ValueError(f"rung 0 understands `accelerate launch ...`, not `accelerate {said}`")
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError as err:
        raise ValueError(f"`accelerate launch` but this interpreter has no accelerate ({err})") from None
    ns = _parsed_by(launch_command_parser(), args[1:], "accelerate launch")
    if ns.cpu and (ns.num_processes or 1) > 1 and ns.mpirun_hostfile is None:
        # accelerate 1.15: `--cpu` goes to its simple launcher, which starts several processes
        # only through mpirun with a hostfile; without one it runs ONE (measured: one rank).
        raise Refusal(
            f"`accelerate launch --cpu --num_processes {ns.num_processes}` runs one process, not "
            f"{ns.num_processes}: use `--multi_gpu --num_processes {ns.num_processes}` with "
            "`Accelerator(cpu=True)` in the script, or torchrun"
        )
    return _script_of(ns, "accelerate launch")

"""Rung 0, static: seconds on the host, no GPU.

Does it import? Does the launch command line parse? Do the hashes of the files
about to run match the reviewed ones? The import and the parse run in the
trainer's interpreter (`runtime.programs.static_check`), inside a temp dir holding
exactly the reviewed files, as a leg would see them: a module the trainer
imports but nobody reviewed fails here, not on a billed GPU.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from launcher.backends.local import no_torch_hint, resolve_command, trainer_python
from launcher.checks.evidence import Check, Kind, Pointer
from launcher.errors import Refused
from launcher.legs import RunContext
from launcher.manifest import HashComparison, stage_files

STATIC_TIMEOUT_S = 300


def leg_command_line(ctx: RunContext) -> str:
    """The exact argv a local leg executes, and the environment names it is given."""
    names = ", ".join(k for k in ctx.leg_env(0, 0, 0.0) if k.startswith("LAUNCHER_"))
    return f"{shlex.join(resolve_command(ctx.cfg.trainer.command))}  (per-leg env: {names})"


def climb(ctx: RunContext, cmp: HashComparison) -> list[Check]:
    """The rung-0 checks, each with its evidence; writes the check log as leg 0's log."""
    log_path = ctx.run_dir / "leg-0.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    checks = [
        Check(
            "hashes match review",
            True,
            f"{len(cmp.current)} files match review #{cmp.review.id} (digest {cmp.review.digest[:16]})",
            kind=Kind.HASHES,
        )
    ]
    command_line = leg_command_line(ctx)
    checks.append(Check("command line", True, command_line, kind=Kind.COMMAND_LINE))

    # In the trainer's interpreter: a command that names its own python (a venv of the
    # trainer's) is checked with it, not with the launcher's.
    leg_argv = resolve_command(ctx.cfg.trainer.command)
    argv = [trainer_python(leg_argv), "-m", "runtime.programs.static_check", "--parser", ctx.cfg.trainer.parser]
    for module in ctx.cfg.trainer.modules:
        argv += ["--module", module]
    argv += ["--", *leg_argv]
    out, err, rc = _run_check(ctx, argv, log_path)
    result_line = len(log_path.read_text().splitlines())
    try:
        reported = json.loads(out.strip().splitlines()[-1])["checks"]
    except (IndexError, KeyError, json.JSONDecodeError):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return checks + [
            Check("import and parse", False, f"the check itself failed (exit {rc}): {tail}", kind=Kind.IMPORT_PARSE)
        ]
    refused = [c["detail"] for c in reported if c.get("refused")]
    if refused:  # a command that would run another shape than it names: nothing to climb
        raise Refused(refused[0])
    pointer = (Pointer(0, str(log_path), result_line, out.strip().splitlines()[-1]),)
    checks += [Check(c["name"], bool(c["ok"]), c["detail"], pointer, kind=Kind.TRAINER_STATIC) for c in reported]
    hint = no_torch_hint(" ".join(c["detail"] for c in reported if not c["ok"]), argv[0])
    if hint:  # one line that says what to do, beside the failures it explains
        checks.append(Check("torch for the trainer", False, hint, pointer, kind=Kind.IMPORT_PARSE))
    return checks


def _run_check(ctx: RunContext, argv: list[str], log_path: Path) -> tuple[str, str, int]:
    """Run the trainer's static check in a folder holding only the reviewed files, recorded in the
    ledger as leg 0 on the host; (stdout, stderr, exit code), its log written to `log_path`."""
    started = time.time()
    ctx.ledger.begin_leg(
        {
            "run_id": ctx.run_id,
            "leg": 0,
            "backend": "host",
            "instance": "host",
            "command": argv,
            "env": {},
            "log_path": str(log_path),
            "started_at": started,
        }
    )
    with tempfile.TemporaryDirectory(prefix=f"{ctx.run_id}-static-") as tmp:
        stage_files(
            {rel: f.source for rel, f in ctx.files.items()}, {rel: f.sha256 for rel, f in ctx.files.items()}, Path(tmp)
        )
        try:
            proc = subprocess.run(
                argv, cwd=tmp, capture_output=True, text=True, timeout=STATIC_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            out, err, rc = "", f"static check timed out after {STATIC_TIMEOUT_S} s", 124
    log_path.write_text(f"$ {shlex.join(argv)}\n{err}{out}")
    ctx.ledger.end_leg(
        ctx.run_id,
        0,
        ended_at=time.time(),
        exit_code=rc,
        killed=False,
        end_reason="timed out" if rc == 124 else "exited",
        billed_gpu_hours=0.0,
        cost_usd=0.0,
    )
    return out, err, rc

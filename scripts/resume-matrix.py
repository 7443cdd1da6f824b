"""The resume matrix's cells by hand (issue 53 item 3; docs/notes-multirank.md "The resume matrix").

One cell: a framework's example on 1 node x 2 ranks (torchrun for the HF Trainer and Accelerate,
Lightning's own launcher for examples/lightning_ddp), its loader workers and gradient accumulation
set as the suite's tests set them, drilled with `launcher drill cold-resume --at
mid-epoch,epoch-end,mid-epoch-1` (three graceful SIGTERMs placed from the straight run's `epoch`:
resumes mid-epoch 0, exactly at the epoch boundary, mid-epoch 1). Each example runs two epochs of
8 to 16 steps a rank (a batch size chosen so, where the default gives fewer than 6). It prints one
line per cell: the cell, the verdict, the steps each resumed leg's ranks resumed from, and each
failed check's kind and the first line of its detail. Exit 1 if any cell FAILs.

    .venv/bin/python scripts/resume-matrix.py lightning --workers 2 --accum 1
    .venv/bin/python scripts/resume-matrix.py --all

Interpreters: PREFLIGHT_HF_PYTHON / PREFLIGHT_PL_PYTHON, else .venv-hf / .venv-lightning.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
LAUNCHER = Path(sys.executable).with_name("launcher")
MOMENTS = "mid-epoch,epoch-end,mid-epoch-1"
ALL = [("hf", 2, 1), ("lightning", 2, 1), ("accelerate", 0, 4), ("lightning", 0, 4), ("accelerate", 2, 1), ("hf", 0, 1)]


def interpreter(framework: str) -> str:
    env, venv = (
        ("PREFLIGHT_PL_PYTHON", ".venv-lightning") if framework == "lightning" else ("PREFLIGHT_HF_PYTHON", ".venv-hf")
    )
    python = os.environ.get(env) or str(REPO / venv / "bin" / "python")
    if not Path(python).is_file():
        raise SystemExit(f"no interpreter for {framework} at {python}: build {venv} (make test) or set {env}")
    return python


def not_expressible(framework: str, workers: int, accum: int) -> str | None:
    """Why the example cannot take this cell without a change of its own, or None."""
    if framework == "hf" and accum != 1:
        return "the HF example has no --grad-accum (its TrainingArguments' gradient_accumulation_steps is 1)"
    if framework == "accelerate" and workers != 0:
        return "examples/accelerate has no loader-workers option (its DataLoader takes no num_workers)"
    return None


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{path.name}: expected one {old!r} to edit, found {text.count(old)}")
    path.write_text(text.replace(old, new))


def prepare(framework: str, workers: int, accum: int, dest: Path) -> tuple[Path, int]:
    """The example copied into `dest`, edited for the cell, its config set; (root, drill steps)."""
    name = {"hf": "hf_trainer", "accelerate": "accelerate", "lightning": "lightning_ddp"}[framework]
    root = dest / name
    shutil.copytree(EXAMPLES / name, root)
    python, train = interpreter(framework), root / "train.py"
    torchrun = Path(python).with_name("torchrun")
    if framework == "hf":  # 256 samples, 8 a rank a step: 16 steps an epoch
        if workers:
            replace_once(train, "dataloader_num_workers=0", f"dataloader_num_workers={workers}")
        command, steps = f"{torchrun} --standalone --nproc_per_node 2 train.py --save-steps 5", 32
    elif framework == "accelerate":  # 80 windows, batches of 4 over 2 ranks: 10 micro-steps an epoch
        command = f"{torchrun} --standalone --nproc_per_node 2 train.py --ckpt-every 5 --batch-size 4"
        command, steps = command + (f" --grad-accum {accum}" if accum != 1 else ""), 20
    else:  # 76 windows, 38 a rank, batches of 5: 8 an epoch (windows of 4 end at the epoch's middle and end)
        replace_once(train, "BATCH_SIZE = 8\n", "BATCH_SIZE = 5\n")
        replace_once(train, "ACCUMULATE = 1\n", f"ACCUMULATE = {accum}\n")
        if workers:
            replace_once(train, "BATCH_SIZE, shuffle=True)", f"BATCH_SIZE, shuffle=True, num_workers={workers})")
        command, steps = f"{python} train.py", 16
    cfg_path = root / "launcher.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["trainer"]["command"] = command
    cfg["rungs"]["drill"] = {"steps": steps, "budget_minutes": 8}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    review = launcher(["review"], root)
    if review.returncode != 0:
        raise SystemExit(f"launcher review failed in {root}: {review.stderr.strip()[-500:]}")
    return root, steps


def launcher(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHER_DEBUG"}
    return subprocess.run(
        [str(LAUNCHER), *args], cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800
    )


def resumes(root: Path, run_id: str) -> list[str]:
    """Per leg after the first (the straight leg left out): the step each rank resumed from."""
    ledger = launcher(["ledger", run_id, "--json"], root)
    legs = json.loads(ledger.stdout)[0]["legs"] if ledger.returncode == 0 else []
    said = []
    for leg in legs:
        if leg.get("role") == "straight" or leg.get("leg") == 0:
            continue
        logs = [Path(n["log"]) for n in leg.get("nodes") or []] or [Path(leg["log_path"])]
        got = sorted(
            (e.get("rank", 0), e["from_step"])
            for log in logs
            if log.is_file()
            for e in (
                json.loads(x[x.find('{"event": ') :]) for x in log.read_text().splitlines() if '"event": "resume"' in x
            )
        )
        said.append(f"leg {leg['leg']}: " + (" ".join(f"r{r}@{s}" for r, s in got) or "none"))
    return said


def leg_of(check: dict) -> str:
    return "" if check.get("leg") is None else f"[leg {check['leg']}]"


def first_line(check: dict) -> str:
    return str(check.get("detail") or check["name"]).splitlines()[0][:200]


def run_cell(framework: str, workers: int, accum: int) -> str:
    """One cell's line; its verdict first word after the cell: PASS, FAIL, ERROR or SKIP."""
    cell = f"{framework} workers={workers} accum={accum}"
    why = not_expressible(framework, workers, accum)
    if why:
        return f"{cell}: SKIP (not expressible: {why})"
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rm-", dir="/tmp") as tmp:  # short: workers' AF_UNIX sockets
        os.environ["TMPDIR"] = tmp
        root, steps = prepare(framework, workers, accum, Path(tmp))
        drill = launcher(["drill", "cold-resume", "--at", MOMENTS, "--json"], root)
        took = time.monotonic() - began
        try:
            out = json.loads(drill.stdout)
        except json.JSONDecodeError:
            tail = (drill.stderr.strip() or drill.stdout.strip())[-300:].replace("\n", " | ")
            return f"{cell}: ERROR exit {drill.returncode} in {took:.0f} s: {tail}"
        verdict = {0: "PASS", 1: "FAIL"}.get(drill.returncode, f"ERROR exit {drill.returncode}")
        bad = [c for c in out.get("checks", []) if not c["ok"]]
        fails = [f"{c.get('kind')}{leg_of(c)}: {first_line(c)}" for c in bad]
        legs = resumes(root, out["run_id"]) if out.get("run_id") else []
        lines = [f"{cell}: {verdict} ({steps} steps, {took:.0f} s); resumed " + "; ".join(legs)]
        return "\n".join(lines + [f"    failed {f}" for f in fails])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", nargs="?", choices=["hf", "accelerate", "lightning"])
    parser.add_argument("--workers", type=int, choices=[0, 2], default=0)
    parser.add_argument("--accum", type=int, choices=[1, 4], default=1)
    parser.add_argument("--all", action="store_true", help="every cell of the matrix run by hand, in order")
    args = parser.parse_args()
    if bool(args.all) == bool(args.framework):
        parser.error("name a framework or --all")
    cells = ALL if args.all else [(args.framework, args.workers, args.accum)]
    failed = False
    for cell in cells:
        line = run_cell(*cell)
        print(line, flush=True)
        failed |= line.split(": ", 1)[1].startswith(("FAIL", "ERROR"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Building the report folder, writing it atomically, and its signature.

`build` reads the ledger, derives the proofs and the plan, and writes a temp
folder (the legs' logs, preflight.json, preflight.md, plots) that is renamed
into place only once signed. The signature is tamper evidence, not authorship:
anyone who can rerun the launcher can sign a folder. It answers "was this
edited after it was written?"; `check` re-verifies it.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from launcher import __version__
from launcher.checks.hours import account, check_hours
from launcher.config.schema import Config
from launcher.errors import BadInput
from launcher.ledger.db import Ledger
from launcher.report.markdown import render
from launcher.report.plan import plan
from launcher.report.plots import draw_all
from launcher.report.proofs import TITLES, derive
from launcher.report.runs import Evidence, Proof, RunData, load_run, select_runs
from runtime.hashing import sha256_file

SIGNATURE = "signature.json"


def build(cfg: Config, run_ids: list[str], out_dir: Path | None) -> tuple[Path, dict[str, Any]]:
    """Write the report folder (atomically: a temp dir renamed into place); returns (path, json)."""
    if out_dir is not None:
        check_out_dir(out_dir)
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    if ledger is None:
        raise BadInput(f"no ledger at {cfg.state_path / 'ledger.db'}: nothing has run yet")
    try:
        from launcher.ops.reconcile import end_dead_runs

        end_dead_runs(ledger)
        rows = select_runs(ledger, run_ids)
        runs = [load_run(r) for r in rows]
        cite = Evidence()
        proofs = derive(cfg, runs, cite)
        numbers = plan(cfg, ledger, runs, proofs, cite)
        report = _report_json(cfg, rows, runs, proofs, numbers)
        again = None if out_dir is not None else (lambda: _default_dir(cfg))
        return _write(report, runs, cite, out_dir or _default_dir(cfg), again), report
    finally:
        ledger.close()


def _report_json(
    cfg: Config, rows: list[dict[str, Any]], runs: list[RunData], proofs: dict[int, Proof], numbers: dict[str, Any]
) -> dict[str, Any]:
    """preflight.json: what ran, the proofs, the damaged log lines, the plan."""
    images = {r.id: r.row.get("image") for r in runs if r.row.get("image")}
    return {
        "project": cfg.project,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "launcher_version": __version__,
        "runs": [_run_json(r) for r in runs],
        "reviewed_files": rows[0]["files"],
        "images": images,
        "task_yaml_sha256": sorted({leg["task_sha256"] for r in rows for leg in r["legs"] if leg.get("task_sha256")}),
        "proofs": [proofs[n].to_json(TITLES[n]) for n in sorted(proofs)],
        "damaged_lines": [dict(d, run=r.id) for r in runs for ev in r.legs for d in ev.damaged()],
        "plan": numbers,
    }


def _run_json(r: RunData) -> dict[str, Any]:
    hours = account(r.row, now=r.row["ended_at"] or time.time(), read={ev.leg: ev for ev in r.legs})
    summed = check_hours(hours)
    return {
        "hours": {**hours, "sums": {"ok": summed.ok, "detail": summed.detail}},
        "id": r.id,
        "rung": r.rung,
        "backend": r.row["backend"],
        "gpus": r.gpus,
        "on_gpu": r.on_gpu,
        "verdict": r.row["verdict"],
        "exit_code": r.row["exit_code"],
        "billed_gpu_hours": r.row["billed_gpu_hours"],
        "cost_usd": r.row["cost_usd"],
        "image": r.row.get("image"),
        "files_digest": r.row["files_digest"],
        "config_sha256": r.row["config_sha256"],
        "legs": [
            {
                "leg": leg["leg"],
                "instance": leg["instance"],
                "exit_code": leg["exit_code"],
                "killed": leg["killed"],
                "end_reason": leg["end_reason"],
                "task_sha256": leg.get("task_sha256"),
                "log": f"evidence/{r.id}/leg-{leg['leg']}.log",
            }
            for leg in r.row["legs"]
        ],
    }


def _default_dir(cfg: Config) -> Path:
    """A folder name not taken yet under .launcher/reports, named for the time: `-2`, `-3`, ...
    when reports land in one second (a report takes 0.3 s; two in a row collided)."""
    base = cfg.state_path / "reports" / f"preflight-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    names = itertools.chain([base], (base.with_name(f"{base.name}-{i}") for i in itertools.count(2)))
    return next(p for p in names if not p.exists())  # lazily: a tuple of a million names took 4 s


def check_out_dir(out: Path) -> None:
    """--out must be an empty folder or not exist yet: refused before any work is done."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BadInput(f"--out {out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        raise BadInput(f"--out {out}: exists and is not empty (a report folder is written once)")


def _write(
    report: dict[str, Any], runs: list[RunData], cite: Evidence, out: Path, again: Callable[[], Path] | None = None
) -> Path:
    """`again`: the default folder's namer, asked for another name if a report running beside
    this one took `out` first (else --out's folder, checked empty, is replaced)."""
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".report-", dir=out.parent))
    try:
        for run in runs:  # every leg log of every run reported: the whole record, not only cited lines
            for ev in run.legs:
                cite.logs.setdefault(f"evidence/{run.id}/leg-{ev.leg}.log", ev.log)
            for stacks in watchdog_stacks(run.row):
                cite.logs.setdefault(f"evidence/{run.id}/{stacks.name}", stacks)
        for rel, src in sorted(cite.logs.items()):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_file():
                shutil.copyfile(src, dst)
        (tmp / "evidence" / "ledger.json").parent.mkdir(parents=True, exist_ok=True)
        (tmp / "evidence" / "ledger.json").write_text(json.dumps([r.row for r in runs], indent=1, default=str) + "\n")
        report["plots"] = draw_all(runs, report, tmp)
        (tmp / "preflight.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (tmp / "preflight.md").write_text(render(report))
        sign(tmp)
        out = _place(tmp, out, again)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _place(tmp: Path, out: Path, again: Callable[[], Path] | None) -> Path:
    """Rename the finished folder into place; returns where it went."""
    while True:
        if out.exists() and again is None:
            out.rmdir()  # --out's folder, checked empty before any work
        try:
            os.rename(tmp, out)  # onto a folder another report filled meanwhile: ENOTEMPTY, never a merge
            return out
        except OSError as exc:
            if again is None or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            out = again()


# --- signature ----------------------------------------------------------------------


def _hash_tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != SIGNATURE
    }


def _digest(files: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items())).encode()).hexdigest()


def sign(folder: Path) -> str:
    """Write signature.json: every file's sha256 and one digest over them all; returns the digest."""
    files = _hash_tree(folder)
    digest = _digest(files)
    (folder / SIGNATURE).write_text(
        json.dumps(
            {
                "algorithm": "sha256",
                "digest": digest,
                "files": files,
                "how": "digest = sha256 of the lines '<sha256>  <path>\\n' of every file but this one, sorted by path",
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    return digest


def check(folder: Path) -> list[str]:
    """What differs from the signature ([] = intact). Bad input (exit 2) if it is no report."""
    sig_path = folder / SIGNATURE
    if not folder.is_dir() or not sig_path.is_file():
        raise BadInput(f"{folder}: no {SIGNATURE} here: not a report folder")
    try:
        sig = json.loads(sig_path.read_text())
        signed: dict[str, str] = sig["files"]
        digest = sig["digest"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{SIGNATURE} is unreadable ({err.__class__.__name__}): edited"]
    if not (
        isinstance(signed, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in signed.items())
        and isinstance(digest, str)
    ):
        return [f"{SIGNATURE} is malformed (files must map paths to sha256 strings, digest must be a string): edited"]
    now = _hash_tree(folder)
    problems = [f"edited: {rel}" for rel in sorted(signed) if rel in now and now[rel] != signed[rel]]
    problems += [f"missing: {rel}" for rel in sorted(set(signed) - set(now))]
    problems += [f"added: {rel}" for rel in sorted(set(now) - set(signed))]
    if _digest(signed) != digest:
        problems.append(f"{SIGNATURE}: the file list does not match its digest")
    return problems


def watchdog_stacks(row: dict[str, Any]) -> list[Path]:
    """The stacks each leg's watchdog took at a suspect (launcher.checks.watchdog), from the ledger."""
    found = []
    for leg in row["legs"]:
        record = leg.get("watchdog") or {}
        found += [Path(look["stacks"]) for look in record.get("looks", []) if isinstance(look.get("stacks"), str)]
    return found

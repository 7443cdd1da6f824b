"""The gate in front of rung 4: `launcher up run` launches only after a signed report
with every proof PASS for exactly the files (and image) about to run.

The report folder is not taken at its word. The newest report for these files must
be intact (its signature), every run it names must be in the ledger with these
files, and the proofs are derived again here from those runs' ledger rows and leg
logs — the same functions `launcher report` used. A report edited and re-signed, or
one whose runs the ledger does not hold, lets nothing launch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.schema import Config, GpuSpec
from launcher.errors import Refused
from launcher.ledger.db import Ledger
from launcher.report.folder import SIGNATURE
from launcher.report.folder import check as check_folder
from launcher.report.proofs import TITLES, derive
from launcher.report.runs import PASS, Evidence, load_run

GPU_PROOFS = (1, 2, 3, 4, 5, 6, 7, 8)
CPU_PROOFS = (1, 2, 3, 4, 6, 7, 8)
"""A CPU dress rehearsal of the run has no target rate to ask for (proof 5)."""


def producers(gpus: GpuSpec | None) -> dict[int, str]:
    """The command that produces each proof's evidence."""
    g = f"--gpus {gpus}" if gpus else "--cpu"
    return {
        1: "launcher up rehearsal",
        2: "launcher up rehearsal",
        3: "launcher up rehearsal",
        4: "launcher up rehearsal",
        5: f"launcher up probe {g}" if gpus else "launcher up probe --gpus ...",
        6: "launcher drill cold-resume --kills 2 --at mid-push",
        7: f"launcher up probe {g}",
        8: "launcher up rehearsal",
    }


@dataclass(frozen=True)
class Passed:
    """The report that let the run launch: recorded in the ledger beside the run."""

    folder: Path
    digest: str
    generated_at: str
    proofs: tuple[int, ...]
    plan: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": "passed",
            "report": str(self.folder),
            "digest": self.digest,
            "generated_at": self.generated_at,
            "proofs": list(self.proofs),
            "plan": {
                k: self.plan.get(k)
                for k in ("tok_s", "eta_hours", "gpu_hours", "usd", "gpus", "run_steps", "rate_source")
            },
            "notice": {k: v for k, v in (self.plan.get("notice") or {}).items() if k != "evidence"} or None,
        }


def skipped(reason: str) -> dict[str, Any]:
    return {"gate": "skipped", "reason": reason}


def reports_for(cfg: Config, files: dict[str, str]) -> list[tuple[Path, dict[str, Any]]]:
    """Report folders whose reviewed files are exactly `files`, newest first."""
    found = []
    for folder in (cfg.state_path / "reports").glob("*"):
        try:
            data = json.loads((folder / "preflight.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("reviewed_files") == files:
            found.append((str(data.get("generated_at", "")), folder.name, folder, data))
    return [(folder, data) for _, _, folder, data in sorted(found, key=lambda t: (t[0], t[1]), reverse=True)]


def check(cfg: Config, ledger: Ledger, files: dict[str, str], image: str | None, gpus: GpuSpec | None) -> Passed:
    """The newest report for these files, checked and re-derived; Refused (exit 3) naming
    every proof that is missing or failed and the command that produces it."""
    need = GPU_PROOFS if gpus else CPU_PROOFS
    make = producers(gpus)
    found = reports_for(cfg, files)
    if not found:
        raise Refused(
            "no signed preflight report for exactly these files: the run needs proofs "
            + ", ".join(map(str, need))
            + " PASS first",
            hint=_ladder_hint(need, make) + '; or --skip-preflight "REASON" (recorded)',
        )
    folder, data = found[0]
    problems = check_folder(folder)
    if problems:
        raise Refused(
            f"report {folder.name} fails its signature ({problems[0]}): it was changed after it was signed",
            hint="run `launcher report` again to write a fresh one",
        )
    proofs = derive(cfg, _ledger_runs(folder, data, ledger, files), Evidence())
    signed = {p.get("number"): p.get("status") for p in data.get("proofs") or [] if isinstance(p, dict)}
    lies = [n for n in need if signed.get(n) == PASS and proofs[n].status != PASS]
    if lies:
        raise Refused(
            f"report {folder.name} says proof {lies[0]} PASS, but its runs in the ledger give "
            f"{proofs[lies[0]].status}: {proofs[lies[0]].summary[:160]}",
            hint="run `launcher report` again from this ledger",
        )
    bad = [n for n in need if proofs[n].status != PASS]
    if bad:
        listed = "; ".join(f"proof {n} {proofs[n].status} ({TITLES[n]}): {make[n]}" for n in bad)
        raise Refused(
            f"report {folder.name}: not every proof PASS: {listed}",
            hint=_ladder_hint(bad, make) + '; or --skip-preflight "REASON" (recorded)',
        )
    _same_gpu_and_image(folder, data, proofs, gpus, image)
    digest = json.loads((folder / SIGNATURE).read_text())["digest"]
    return Passed(folder, digest, str(data.get("generated_at")), need, dict(data.get("plan") or {}))


def _ladder_hint(numbers: tuple[int, ...] | list[int], make: dict[int, str]) -> str:
    steps = list(dict.fromkeys(make[n] for n in numbers))
    return "run " + ", ".join(f"`{s}`" for s in steps) + ", then `launcher report`"


def _ledger_runs(folder: Path, data: dict[str, Any], ledger: Ledger, files: dict[str, str]) -> list[Any]:
    """The report's runs as the ledger holds them (with these files, ended): Refused otherwise."""
    runs = []
    for entry in data.get("runs") or []:
        rows = ledger.runs(run_id=str(entry.get("id")))
        if not rows or rows[0]["files"] != files or rows[0]["ended_at"] is None:
            raise Refused(
                f"report {folder.name} names run {entry.get('id')!r}, which the ledger does not hold with these files",
                hint="run `launcher report` again from this ledger",
            )
        runs.append(load_run(rows[0]))
    return runs


def _same_gpu_and_image(
    folder: Path, data: dict[str, Any], proofs: dict[int, Any], gpus: GpuSpec | None, image: str | None
) -> None:
    """Refused when the report measured its rate on another GPU, or ran on another image, than
    the run would launch on."""
    if gpus is not None:
        measured = str(proofs[5].numbers.get("gpus", ""))
        if measured.split(":")[0].lower() != gpus.name.lower():
            raise Refused(
                f"report {folder.name} measured the rate on {measured}, the run asks for {gpus}: its ETA "
                "and quota arithmetic are for another GPU",
                hint=f"launcher up probe --gpus {gpus}, then `launcher report`",
            )
    if image is not None:
        ran = sorted({str(v) for v in (data.get("images") or {}).values()})
        if image not in ran:
            raise Refused(
                f"report {folder.name} was not made on the image this run would launch ({image[:40]}): "
                f"its runs ran {', '.join(r[:40] for r in ran) or 'no image (local backend)'}",
                hint="climb the ladder on this backend, then `launcher report`",
            )

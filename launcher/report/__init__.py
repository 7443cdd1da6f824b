"""`launcher report`: the signed preflight report.

Reads the ledger and the legs' host-side logs (never an instance's disk, which
is gone), re-derives each of docs/design.md's eight proofs from the event lines
(a proof with no number is MISSING, never PASS), writes the plan numbers
(sustained rate, ETA, GPU-hours, the quota arithmetic), plots, and copies of
every log it cites, then signs the folder: sha256 of every file, and one
digest over them all. `launcher report --check DIR` re-verifies a folder.

    runs.py          a run, its legs' events and resumes; citations; a proof's verdict
    proofs.py        proof_1 ... proof_8, and PROOFS: the one table of numbers, titles, functions
    plan.py          rate, ETA, GPU-hours, quota, memory, checkpoint cost, efficiency
    folder.py        build and write the folder atomically; sign and check it
    markdown.py      preflight.md, rendered from preflight.json alone
    plots.py         the plots (SVG, drawn by svg.py)
    gate.py          the gate in front of rung 4: the newest signed report for the files, every
                     proof derived again from the ledger and PASS

Submodules import each other directly, never through this package.
"""

from launcher.report.folder import SIGNATURE, build, check, sign
from launcher.report.proofs import PROOFS, TITLES, derive
from launcher.report.runs import FAIL, MISSING, PASS, Evidence, load_run

__all__ = [
    "FAIL",
    "MISSING",
    "PASS",
    "PROOFS",
    "SIGNATURE",
    "TITLES",
    "Evidence",
    "build",
    "check",
    "derive",
    "load_run",
    "sign",
]

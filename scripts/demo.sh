#!/usr/bin/env bash
# The main job on the embedded default (local backend, local store):
# a fresh project from `launcher init`, reviewed, rung 0, rung 1, a dress
# rehearsal of the probe rung on the CPU, a cold-resume drill killing legs
# mid-push, the quota, the ledger, and the signed preflight report.
set -euo pipefail
dir=${DEMO_DIR:-.demo}
rm -rf "$dir"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step launcher init "$dir"
cd "$dir"
step launcher review
step launcher up static
step launcher up rehearsal
# The probe measures; on this CPU its answer may well be "no" (the reference
# config checkpoints every 5 steps of a ~15 ms step): that answer is the point.
step launcher up probe --cpu --steps 300 || echo "(the probe said no: see its checks above)"
step launcher drill cold-resume --kills 2 --at mid-push
step launcher spend
step launcher ledger --limit 5
step launcher report --out report
step launcher report --check report
printf '\nThe report: %s/report/preflight.md\n' "$dir"

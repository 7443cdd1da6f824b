#!/usr/bin/env bash
# The main job on the embedded default (local backend, local store):
# a fresh project from `launcher init`, reviewed, rung 0, rung 1, a cold-resume
# drill killing legs mid-push, the quota, the ledger.
set -euo pipefail
dir=${DEMO_DIR:-.demo}
rm -rf "$dir"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step launcher init "$dir"
cd "$dir"
step launcher review
step launcher up static
step launcher up rehearsal
step launcher drill cold-resume --kills 2 --at mid-push
step launcher spend
step launcher ledger

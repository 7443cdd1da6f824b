#!/usr/bin/env bash
# `make test` under the kernel's process accounting, then where its CPU went, process by process
# (scripts/suite_profile.py; the figures in docs/benchmarks.md, "Session 23"). Root only (accton);
# installs Debian's `acct` if missing. The run is an ordinary `make test` otherwise: its stage
# times stand beside the clean-clone runs'. Writes under ${OUT:-/tmp/suite-profile}.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/suite-profile}
if [ "$(id -u)" != 0 ]; then echo "error: process accounting needs root (accton)" >&2; exit 2; fi
command -v accton >/dev/null || { apt-get update -qq && apt-get install -y -qq acct >/dev/null; }
mkdir -p "$OUT" && rm -f "$OUT/acct" "$OUT/test-times" && touch "$OUT/acct"
# The suite starts tens of thousands of processes: past 32768 the kernel reuses pids, and a
# process would be charged to another's parent. A larger pid space for the run, put back after.
old_max=$(cat /proc/sys/kernel/pid_max)
echo 4194304 > /proc/sys/kernel/pid_max
trap 'accton off >/dev/null 2>&1 || true; echo "$old_max" > /proc/sys/kernel/pid_max' EXIT
accton "$OUT/acct"
rc=0
PREFLIGHT_TEST_TIMES="$OUT/test-times" make test 2>&1 | tee "$OUT/make-test.log" || rc=$?
accton off
python3 scripts/suite_profile.py "$OUT/acct" "$OUT/test-times" | tee "$OUT/profile.txt"
exit $rc

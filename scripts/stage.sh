#!/usr/bin/env bash
# Time one stage of `make test` and append "NAME SECONDS" to $STAGE_LOG; `stage.sh --summary`
# prints the table. Used by the Makefile so every CI run prints where its wall time went.
set -euo pipefail
log=${STAGE_LOG:-.stage-times}
if [ "${1:-}" = --summary ]; then
  [ -f "$log" ] || exit 0
  echo "== make test: wall time per stage"
  awk '{printf "  %-12s %7.1f s\n", $1, $2; total += $2} END {printf "  %-12s %7.1f s (%.1f min)\n", "total", total, total / 60}' "$log"
  exit 0
fi
name=$1; shift
start=$(date +%s.%N)
status=0
"$@" || status=$?
end=$(date +%s.%N)
secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
echo "$name $secs" >>"$log"
echo "== stage $name: $secs s (exit $status)"
exit "$status"

#!/usr/bin/env bash
# Time one stage of `make test` and append "NAME SECONDS" to $STAGE_LOG; `stage.sh --summary`
# prints the table. Used by the Makefile so every CI run prints where its wall time went.
set -euo pipefail
log=${STAGE_LOG:-.stage-times}
if [ "${1:-}" = --summary ]; then
  [ -f "$log" ] || exit 0
  echo "== make test: wall time per stage"
  awk '{printf "  %-12s %7.1f s  (CPU idle %s %%)\n", $1, $2, ($3 == "" ? "?" : $3); total += $2} END {printf "  %-12s %7.1f s (%.1f min)\n", "total", total, total / 60}' "$log"
  exit 0
fi
# The machine's CPU idle over the stage, from /proc/stat (idle + iowait of all CPUs): where it is
# well above zero, the stage waited on something other than the CPU (a third pytest worker could
# use it); near zero, the stage is CPU-bound and only less work makes it faster.
cpu_ticks() { awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat 2>/dev/null || echo "0 0"; }
name=$1; shift
start=$(date +%s.%N)
read -r idle0 total0 < <(cpu_ticks)
status=0
"$@" || status=$?
end=$(date +%s.%N)
read -r idle1 total1 < <(cpu_ticks)
secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
idle=$(awk -v i="$((idle1 - idle0))" -v t="$((total1 - total0))" 'BEGIN {printf "%.1f", (t > 0 ? 100 * i / t : 0)}')
echo "$name $secs $idle" >>"$log"
echo "== stage $name: $secs s (exit $status), CPU idle $idle %"
exit "$status"

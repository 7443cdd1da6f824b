#!/usr/bin/env bash
# The venvs stage of `make test`, side by side in one run: the Makefile at an earlier commit (BASE,
# default deed424, the last that built the three venvs with pip; e575d58, the last whose uv
# byte-compiled every module at install) against this tree's, each in a clean clone of its own,
# one after the other, each with a new empty uv cache (pip here keeps none).
# Usage: bash bench/venvs_stage.sh [BASE]   Prints one line per Makefile: wall seconds.
set -euo pipefail
base=${1:-deed424}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# each Makefile its own empty uv cache: neither finds what the other unpacked
git clone -q "$repo" "$work/base" && git -C "$work/base" checkout -q "$base"
git clone -q "$repo" "$work/tree"
cp "$repo/Makefile" "$work/tree/Makefile"  # this tree's Makefile, committed or not
for who in base tree; do
  start=$(date +%s.%N)
  UV_CACHE_DIR="$work/uv-cache-$who" make -C "$work/$who" --no-print-directory -j3 .venv/.installed .venv-hf/.installed .venv-lightning/.installed >"$work/$who.log" 2>&1 \
    || { echo "$who: failed"; tail -20 "$work/$who.log"; exit 1; }
  end=$(date +%s.%N)
  awk -v w="$who" -v a="$start" -v b="$end" 'BEGIN {printf "%-4s venvs stage: %.1f s\n", w, b - a}'
done

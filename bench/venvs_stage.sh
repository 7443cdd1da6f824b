#!/usr/bin/env bash
# The venvs stage of `make test`, side by side in one run: the Makefile at a commit that built the
# three venvs with pip (BASE, default deed424, the last such commit) against this tree's (uv), each in a
# clean clone of its own, one after the other; uv's cache is a new empty folder (pip here keeps none).
# Usage: bash bench/venvs_stage.sh [BASE]   Prints one line per builder: wall seconds.
set -euo pipefail
base=${1:-deed424}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export UV_CACHE_DIR="$work/uv-cache"
git clone -q "$repo" "$work/pip" && git -C "$work/pip" checkout -q "$base"
git clone -q "$repo" "$work/uv"
cp "$repo/Makefile" "$work/uv/Makefile"  # this tree's Makefile, committed or not
for who in pip uv; do
  start=$(date +%s.%N)
  make -C "$work/$who" --no-print-directory -j3 .venv/.installed .venv-hf/.installed .venv-lightning/.installed >"$work/$who.log" 2>&1 \
    || { echo "$who: failed"; tail -20 "$work/$who.log"; exit 1; }
  end=$(date +%s.%N)
  awk -v w="$who" -v a="$start" -v b="$end" 'BEGIN {printf "%-4s venvs stage: %.1f s\n", w, b - a}'
done

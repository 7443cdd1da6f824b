# Sourced by the gpu-*.sh scripts: run the launcher from this checkout under the
# machine's python3 (whose torch sees the GPUs), name the GPUs, and a `step`
# that runs on after a "no" (the point of these scripts is the figures).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${GPUS:-}" ]; then
    GPUS="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print $NF}'):$(nvidia-smi -L | wc -l)"
fi
bin=$(mktemp -d)
printf '#!/bin/sh\nexec python3 -m launcher.cli.app "$@"\n' > "$bin/launcher"
chmod +x "$bin/launcher"
export GPUS PATH="$bin:$PATH" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
step() { printf '\n$ %s\n' "$*"; "$@" || { echo "(exit $?)"; failed=$((failed + 1)); }; }

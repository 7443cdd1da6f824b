#!/usr/bin/env bash
# `launcher status` and `launcher stop` against a live smoke leg on a GPU box,
# then a short probe of a GPT-2-small-shaped model for the step-time breakdown.
# Like gpu-smoke.sh: from a checkout, under the machine's python3, local backend.
#   scripts/gpu-status-stop.sh [WORK_DIR]        GPUS=H200:1 to name the GPUs
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
work=${1:-/tmp/gpu-status}
rm -rf "$work"
launcher init "$work" >/dev/null && cd "$work" || exit 2
sed -i "s|^  command: .*|  command: python train.py --ckpt-every 20 --metrics-every 10 --health-every 0 --data-delay 0.01|" launcher.yaml
launcher review >/dev/null
launcher up smoke --gpus "$GPUS" --steps 3000 > up.log 2>&1 &
up=$!
for _ in $(seq 600); do
    grep -q '"step": 60,' .launcher/runs/*/leg-0.log 2>/dev/null && break
    sleep 0.2
done
run=$(basename "$(dirname "$(ls .launcher/runs/*/leg-0.log)")")
step launcher status
step launcher status --json
step launcher stop "$run" --timeout 120
wait $up; echo "up exited $?"
step launcher status "$run"
big="python train.py --ckpt-every 100 --n-layer 12 --n-head 12 --n-embd 768 --block 512 --batch 16 --total-steps 100000 --data-tokens 4000000"
sed -i "s|^  command: .*|  command: $big|" launcher.yaml
launcher review >/dev/null
step launcher up probe --gpus "$GPUS" --steps "${PROBE_STEPS:-250}"
step launcher status
echo "steps that said no: $failed"
exit $(( failed > 0 ))

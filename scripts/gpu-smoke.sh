#!/usr/bin/env bash
# The lower ladder of the reference trainer on a machine that has GPUs, from a
# checkout, with no install: the launcher runs under the machine's python3
# (whose torch sees the GPUs), local backend, local store.
#
#   scripts/gpu-smoke.sh [WORK_DIR]        GPUS=H200:1 to name the GPUs yourself
#
# Runs: review, rung 0, rung 1 (rehearsal, forced onto the CPU), rung 2 (smoke,
# on the GPUs), a cold-resume drill on the GPUs, then rung 3 (probe) of a
# GPT-2-small-sized model for the sustained rate, memory and checkpoint cost;
# ends with the spend, the ledger and the signed report (WORK_DIR/report).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
work=${1:-/tmp/gpu-smoke}

rm -rf "$work"
step nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
step launcher init "$work"
cd "$work"
step launcher review
step launcher up static
step launcher up rehearsal
step launcher up smoke --gpus "$GPUS" -v
# Smoke and the drill run in the deterministic mode (runtime/session/determinism.py): their checks say
# "deterministic mode: exact comparisons" when it held, or name the op that had no
# deterministic kernel; `launcher ledger --json` keeps the line.
step launcher drill cold-resume --gpus "$GPUS" --kills 2 --at mid-push -v
step launcher drill cold-resume --gpus "$GPUS"
# The probe of a ~85M-parameter model (GPT-2 small's shape, block 512): the
# reference trainer's sustained tokens/s, memory and checkpoint cost on this GPU.
big="${BIG_COMMAND:-python train.py --ckpt-every 200 --n-layer 12 --n-head 12 --n-embd 768 --block 512 --batch 16 --total-steps 100000 --data-tokens 4000000}"
sed -i "s|^  command: .*|  command: $big|" launcher.yaml
step launcher review
step launcher up probe --gpus "$GPUS" --steps "${PROBE_STEPS:-600}"
step launcher spend
step launcher ledger --limit 3
step launcher report --out report
step launcher report --check report
echo "steps that said no: $failed"
exit $(( failed > 0 ))

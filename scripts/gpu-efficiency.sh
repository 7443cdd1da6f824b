#!/usr/bin/env bash
# Where the GPU-hours go, on a machine that has GPUs: the probe of the reference
# trainer's GPT-2-small-shaped model (85.6M parameters, block 512, batch 16) in
# fp32 eager, then in bf16 autocast + torch.compile, each followed by its report;
# prints MFU, tok/s and the ETA of rungs.run.steps for both, from the reports'
# preflight.json, and the memory guard's predicted peak against the probe's measured
# max_memory_allocated/max_memory_reserved (MEMORY lines: docs/memory.md). From a
# checkout, no install (the machine's python3 and torch).
#
#   scripts/gpu-efficiency.sh [WORK_DIR]    GPUS=H200:1 to name the GPUs yourself
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
work=${1:-/tmp/gpu-efficiency}

rm -rf "$work"
step nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step launcher init "$work"
cd "$work"
model="python train.py --ckpt-every 200 --n-layer 12 --n-head 12 --n-embd 768 --block 512 --batch 16 --total-steps 100000 --data-tokens 4000000"
for variant in "fp32:" "bf16-compile:--dtype bf16 --compile"; do
  name=${variant%%:*}
  flags=${variant#*:}
  sed -i "s|^  command: .*|  command: $model $flags|" launcher.yaml
  step launcher review
  step launcher up probe --gpus "$GPUS" --steps "${PROBE_STEPS:-600}"
  step launcher report --out "report-$name"
  python3 - "report-$name/preflight.json" "$name" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]
e = plan.get("efficiency") or {}
w = e.get("what_if") or {}
r = w.get("reachable") or {}
mfu = e.get("mfu")
print(f"RESULT {sys.argv[2]}: {plan.get('tok_s', 0):,.0f} tok/s; "
      f"{(e.get('flop_s') or 0) / 1e12:,.1f} TFLOP/s; MFU {'-' if mfu is None else f'{100 * mfu:.1f} %'} "
      f"({e.get('dtype')} products, peak {(e.get('peak_flop_s') or 0) / 1e12:,.1f} TFLOP/s); "
      f"ETA {plan.get('eta_hours', 0):,.2f} h = {plan.get('gpu_hours', 0):,.2f} GPU-h; "
      f"at a reachable {100 * r.get('mfu', 0):.0f} %: {r.get('eta_hours', 0):,.2f} h; "
      f"idle {(e.get('idle') or {}).get('summary', '-')}")
print("levers:", "; ".join(e.get("levers") or []))
for m in (plan.get("memory_scores") or {}).get("rows", []):  # the memory guard's prediction, scored
    err = m.get("error")
    print(f"MEMORY {sys.argv[2]} {m['rung']} on {m['on']}: predicted {(m.get('predicted') or 0) / 2**20:,.1f} MiB "
          f"(with allowance {(m.get('needed') or 0) / 2**20:,.1f}); measured allocated "
          f"{(m.get('allocated') or 0) / 2**20:,.1f} MiB, reserved {(m.get('reserved') or 0) / 2**20:,.1f} MiB; "
          f"error {'MISSING' if err is None else f'{100 * err:+.1f} %'}")
PY
done
echo "steps that said no: $failed"

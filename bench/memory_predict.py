"""Will it fit? The prediction (runtime.programs.memory predict: the script's first two optimizer
steps on fake tensors) against the same steps run for real on this CPU and measured by the
allocator's own accounting (the profiler's memory events), for the reference trainer and every
example at three sizes; beside them what the usual estimates say: `accelerate estimate-memory`'s
training figure (its own `estimate_training_usage` on the same weights: weights, gradients and
Adam's two moments, no activations) and the 16-bytes-a-parameter rule (fp32 AdamW: 4 + 4 + 8).

A size is the example's own script with the values named substituted in its source (the examples
keep their sizes as constants or literals; the script is copied, never edited in place), plus
arguments. Several ranks: every rank predicted alone in torch's fake process group, measured
under torchrun; the largest rank is shown.

    .venv/bin/python bench/memory_predict.py [--only NAME] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASURE_REPEATS = 3
"""A measurement of several ranks is repeated: gloo's all-reduce finishes at a time of its own, and
DDP's peak moved by one gradient's size between runs of the same command (136.6 and 149.6 MB for
the reference trainer's M on 2 ranks). The error is against the largest of the repeats."""
V, HF, PL = (str(REPO / v / "bin" / "python") for v in (".venv", ".venv-hf", ".venv-lightning"))
REF = "runtime.reference.trainer"


@dataclass(frozen=True)
class Case:
    trainer: str  # an example's folder, or the reference trainer's module
    size: str
    python: str
    args: tuple[str, ...] = ()
    subs: dict[str, str] = field(default_factory=dict)
    world: int = 1
    sharded: bool = False  # FSDP2: a rank holds 1/world of the weights


def _ref(size: str, layers: int, embd: int, heads: int, block: int, *extra: str, world: int = 1) -> Case:
    args = ("--n-layer", str(layers), "--n-embd", str(embd), "--n-head", str(heads), "--block", str(block))
    return Case(REF, size, V, (*args, "--batch", "8", "--data-tokens", "200000", *extra), world=world)


CASES = [
    _ref("S", 2, 128, 4, 64),
    _ref("M", 4, 256, 4, 128),
    _ref("L", 8, 512, 8, 256),
    _ref("M bf16 autocast", 4, 256, 4, 128, "--dtype", "bf16"),
    _ref("L activation checkpointing", 8, 512, 8, 256, "--activation-checkpointing"),
    _ref("M DDP 2 ranks", 4, 256, 4, 128, world=2),
    *[
        Case("flat_gpt", s, V, ("--n_embd", e, "--block_size", b, "--batch_size", n))
        for s, e, b, n in (("S", "64", "64", "8"), ("M", "256", "128", "16"), ("L", "512", "256", "16"))
    ],
    *[
        Case("plain_loop", s, V, ("--hidden", h, "--batch", n))
        for s, h, n in (("S", "128", "16"), ("M", "512", "32"), ("L", "1024", "64"))
    ],
    *[
        Case(
            "fsdp_dcp",
            s,
            V,
            ("--batch", n, "--seq", q),
            {
                "nn.Embedding(256, 64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 256)": (
                    f"nn.Embedding(256, {d}), nn.Linear({d}, {2 * d}), nn.GELU(), nn.Linear({2 * d}, 256)"
                )
            },
            world=2,
            sharded=True,
        )
        for s, d, n, q in (("S", 64, "8", "16"), ("M", 512, "16", "32"), ("L", 2048, "32", "32"))
    ],
    *[
        Case(
            "stateful_loader",
            s,
            V,
            ("--batch", n, "--seq", q, "--workers", "2"),
            {
                "nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 256)": (
                    f"nn.Embedding(256, {d}), nn.Linear({d}, {2 * d}), nn.GELU(), nn.Linear({2 * d}, 256)"
                )
            },
        )
        for s, d, n, q in (("S", 32, "4", "16"), ("M", 256, "32", "32"), ("L", 1024, "64", "64"))
    ],
    *[
        Case(
            "hf_trainer",
            s,
            HF,
            (),
            {
                "n_embd=64, n_layer=2, n_head=2": f"n_embd={e}, n_layer={n}, n_head={h}",
                "per_device_train_batch_size=8": f"per_device_train_batch_size={b}",
            },
        )
        for s, e, n, h, b in (("S", 64, 2, 2, 8), ("M", 256, 4, 4, 8), ("L", 512, 6, 8, 16))
    ],
    Case(
        "hf_trainer",
        "M gradient checkpointing, accumulation 4",
        HF,
        (),
        {
            "n_embd=64, n_layer=2, n_head=2": "n_embd=256, n_layer=4, n_head=4",
            "dataloader_num_workers=0,": "dataloader_num_workers=0, gradient_checkpointing=True, gradient_accumulation_steps=4,",
        },
    ),
    *[
        Case("accelerate", s, HF, ("--batch-size", b), {"dim: int = 32": f"dim: int = {d}"})
        for s, d, b in (("S", 32, "8"), ("M", 256, "16"), ("L", 1024, "32"))
    ],
    *[
        Case(
            name,
            s,
            PL,
            (),
            {"EMBED, HIDDEN, DROPOUT = 32, 64, 0.2": f"EMBED, HIDDEN, DROPOUT = {e}, {h}, 0.2"},
            world=w,
        )
        for name, w in (("lightning", 1), ("lightning_ddp", 2))
        for s, e, h in (("S", 32, 64), ("M", 256, 1024), ("L", 512, 4096))
    ],
]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exit {proc.returncode}: {proc.stderr[-800:]}")


def _results(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def measure_case(case: Case, work: Path) -> dict:
    """Predicted (every rank) and measured (every rank) peaks of one case; the largest rank's."""
    if case.trainer != REF:
        src = (REPO / "examples" / case.trainer / "train.py").read_text()
        for old, new in case.subs.items():
            if old not in src:
                raise SystemExit(f"{case.trainer}: {old!r} is not in its train.py")
            src = src.replace(old, new)
        (work / "train.py").write_text(src)
        command = ["python", "train.py", *case.args]
    else:
        command = ["python", "-m", REF, *case.args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    pred, meas = work / "predicted", work / "measured"
    began = time.perf_counter()
    for rank in range(case.world):
        out = str(pred / f"rank-{rank}.json")
        _run([case.python, "-m", "runtime.programs.memory", "predict", "--world", str(case.world), "--rank",
              str(rank), "--out", out, "--", *command], work, env)  # fmt: skip
    predict_s = time.perf_counter() - began
    peaks = []  # several ranks: each measurement's largest rank, MEASURE_REPEATS times (see below)
    for repeat in range(MEASURE_REPEATS if case.world > 1 else 1):
        out = str(meas / f"{repeat}-rank-{{rank}}.json")
        program = ["-m", "runtime.programs.memory", "measure", "--out", out, "--", *command]
        if case.world > 1:
            torchrun = str(Path(case.python).parent / "torchrun")
            _run([torchrun, "--standalone", "--nproc-per-node", str(case.world), *program], work, env)
        else:
            _run([case.python, *program], work, env)
        peaks.append(max(_results(meas), key=lambda r: r["peak_bytes"]))
        for f in meas.glob("*.json"):
            f.rename(f.with_suffix(".done"))
    p = max(_results(pred), key=lambda r: r["peak_bytes"])
    m = max(peaks, key=lambda r: r["peak_bytes"])
    low = min(r["peak_bytes"] for r in peaks)
    if p["ended"] != "steps" or m["ended"] != "steps":
        raise RuntimeError(f"{case.trainer} {case.size}: predicted {p['ended']} {p['error']}, measured {m['ended']}")
    weights = p["categories"]["parameters"] * (case.world if case.sharded else 1)  # the whole model's weights
    return {
        "trainer": case.trainer,
        "size": case.size,
        "world": case.world,
        "predicted": p["peak_bytes"],
        "measured": m["peak_bytes"],
        "measured_low": low,
        "error": p["peak_bytes"] / m["peak_bytes"] - 1,
        "categories": p["categories"],
        "accelerate": _accelerate_training(weights),
        "rule16": weights // 4 * 16,
        "predict_s": round(predict_s, 2),
    }


def _accelerate_training(weight_bytes: int) -> int | None:
    """accelerate estimate-memory's training figure for these weights, by its own function (its
    CLI reads a Hub model's config; the arithmetic is this), fp32: no mixed precision."""
    code = (
        "import sys; from accelerate.commands.estimate import estimate_training_usage as e; "
        "u = e(int(sys.argv[1]), 'float32'); print(max(v for v in u.values() if v is not None and v > 0))"
    )
    proc = subprocess.run([HF, "-c", code, str(weight_bytes)], capture_output=True, text=True, timeout=120)
    return int(proc.stdout.strip()) if proc.returncode == 0 else None


def _measured(r: dict) -> str:
    if _mib(r["measured_low"]) == _mib(r["measured"]):
        return _mib(r["measured"])
    return f"{_mib(r['measured_low'])}-{_mib(r['measured'])}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


ON_RECORD = REPO / "docs" / "reports" / "h200-probe" / "preflight.json"
"""A GPU measurement on record: scripts/gpu-smoke.sh's probe on an H200 (torch 2.11+cu130, fp32), its
`memory` events' peak allocated and reserved, max across ranks, in the report's plan section."""
ON_RECORD_ARGS = ("--ckpt-every", "200", "--n-layer", "12", "--n-head", "12", "--n-embd", "768", "--block", "512",
                  "--batch", "16", "--total-steps", "100000", "--data-tokens", "4000000")  # fmt: skip
"""That probe's command (scripts/gpu-smoke.sh's BIG_COMMAND default; its `start` event's 85,645,824
parameters and 8,192 tokens a step say the same)."""


def on_record() -> dict:
    """The on-record GPU probe's command predicted on this CPU, against the peak the GPU measured."""
    plan = json.loads(ON_RECORD.read_text())["plan"]["memory"]
    work = Path(tempfile.mkdtemp(prefix="mempredict-"))
    try:
        out = work / "rank-0.json"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        _run([V, "-m", "runtime.programs.memory", "predict", "--out", str(out), "--", "python", "-m", REF,
              *ON_RECORD_ARGS], work, env)  # fmt: skip
        predicted = json.loads(out.read_text())["peak_bytes"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    allocated, reserved = int(plan["peak_bytes"]), int(plan["reserved_bytes"])
    return {"on": plan["on"], "run": plan["run"], "predicted": predicted, "allocated": allocated,
            "reserved": reserved, "error": predicted / allocated - 1, "reserve": reserved / allocated - 1}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None, help="one trainer (an example's name, or 'reference')")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    rows = []
    print(
        "| trainer | size | ranks | predicted MiB | measured MiB | error | accelerate's training MiB | 16 B/param MiB | predict s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        name = "reference" if case.trainer == REF else case.trainer
        if ns.only and ns.only != name:
            continue
        work = Path(tempfile.mkdtemp(prefix="mempredict-"))
        try:
            r = measure_case(case, work)
        except RuntimeError as err:
            print(f"| {name} | {case.size} | {case.world} | failed: {str(err)[:200]} |||||")
            continue
        finally:
            shutil.rmtree(work, ignore_errors=True)
        r["trainer"] = name
        rows.append(r)
        print(
            f"| {name} | {r['size']} | {r['world']} | {_mib(r['predicted'])} | {_measured(r)} | "
            f"{100 * r['error']:+.1f} % | {_mib(r['accelerate'])} | {_mib(r['rule16'])} | {r['predict_s']} |",
            flush=True,
        )
    worst = max((abs(r["error"]) for r in rows), default=0.0)
    print(f"\n{len(rows)} cases; the largest error {100 * worst:.1f} %")
    if not ns.only or ns.only == "reference":
        g = on_record()
        print(
            f"\nOn a GPU, on record ({g['run']}, {g['on']}): predicted here {_mib(g['predicted'])} MiB, "
            f"measured peak allocated {_mib(g['allocated'])} MiB: {100 * g['error']:+.1f} %; its reserved peak "
            f"{_mib(g['reserved'])} MiB, {100 * g['reserve']:.1f} % over the allocated"
        )
        rows.append({"trainer": "on record", **g})
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Save and verify seconds for sharded state (DCP, every rank its part) vs one file, same size.

Two gloo ranks under torchrun on this host's CPU, the same MLP + AdamW (sized by --width and
--layers) trained through the Session both ways, interleaved (ABAB) so drift hits both:

- one file: the model under DDP, `Session(sharded=False)`: rank 0 writes the whole state in one
  `state.pt` (async snapshot, then serialised by the pusher), pushes it, verifies it;
- sharded: the model under FSDP2 (`fully_shard`), `Session(sharded=True)`: every rank writes its
  shard through torch.distributed.checkpoint plus its own `rank-<r>.pt`, rank 0 the manifest
  over all of them; pushed and verified as one checkpoint (the verify also reads `.metadata` and
  holds the manifest to every shard it names).

Per checkpoint, from the legs' own events: `save` seconds (the training loop's critical path),
`serialized` (one file only: off the critical path), `push` and `verify` seconds, bytes.
The first checkpoint of each leg (cold) is left out of the medians.

    .venv/bin/python bench/sharded_save.py [--width 1024 --layers 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")

TRAINER = """
import sys
import torch, torch.nn as nn
from runtime.session import Session
mode, width, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sess = Session(ckpt_every=2, total_steps=8, sharded=(mode == "sharded"))
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
if mode == "sharded":
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
else:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
sess.track(model=model, optimizer=opt)
sess.resume()
while sess.running():
    loss = model(torch.randn(4, width)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sess.step(loss=loss)
sys.exit(sess.finish())
"""


def leg(work: Path, mode: str, width: int, layers: int, tag: str) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = work / tag
    folder.mkdir()
    (folder / "train.py").write_text(TRAINER)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "LAUNCHER_RUN_ID": tag,
        "LAUNCHER_STORE": (work / "store").as_uri(),
        "LAUNCHER_MAX_STEPS": "8",
    }
    proc = subprocess.run(
        [
            str(TORCHRUN),
            "--standalone",
            f"--master_port={port}",
            "--nproc_per_node=2",
            "train.py",
            mode,
            str(width),
            str(layers),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    events = [json.loads(line[line.find('{"event": ') :]) for line in proc.stdout.splitlines() if '{"event": ' in line]
    if proc.returncode != 0:
        raise SystemExit(f"{mode} leg failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return [e for e in events if e.get("rank", 0) == 0]


def per_checkpoint(events: list[dict]) -> dict[str, list[float]]:
    """Seconds by phase, per checkpoint after the leg's first; bytes of the last."""
    out: dict[str, list[float]] = {"save": [], "serialized": [], "push": [], "verify": [], "bytes": []}
    first = min(e["step"] for e in events if e["event"] == "save")
    for e in events:
        if e["event"] in ("save", "serialized", "push", "verify") and e.get("step", first) > first:
            out[e["event"]].append(float(e["seconds"]))
        if e["event"] == "push":
            out["bytes"].append(float(e["bytes"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {m: {} for m in ("one file", "sharded")}
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        for r in range(args.repeats):
            for mode, name in (("onefile", "one file"), ("sharded", "sharded")):
                got = per_checkpoint(leg(Path(tmp), mode, args.width, args.layers, f"{mode}-{r}"))
                for key, values in got.items():
                    rows[name].setdefault(key, []).extend(values)
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"{params / 1e6:.1f}M params + AdamW, 2 gloo ranks on CPU, {args.repeats} legs per mode, "
        f"checkpoint every 2 steps; medians over the warm checkpoints (n = count)"
    )
    print(f"{'mode':<10}{'MiB':>8}{'save s':>9}{'serialise s':>13}{'push s':>9}{'verify s':>10}{'n':>4}")
    for name, r in rows.items():
        med = {k: (statistics.median(v) if v else float("nan")) for k, v in r.items()}
        print(
            f"{name:<10}{med['bytes'] / 2**20:>8.0f}{med['save']:>9.3f}{med['serialized']:>13.3f}"
            f"{med['push']:>9.3f}{med['verify']:>10.3f}{len(r['save']):>4}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

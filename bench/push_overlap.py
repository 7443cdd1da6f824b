"""Step time while a checkpoint push is in flight vs without (goal: <= 1.03x).

One process trains the reference GPT on CPU and measures each step's wall
time in two phases, interleaved in one run: steps with the pusher idle, and
steps while the background Pusher runs the whole storage cycle (upload ->
ranged verify -> delete local -> prune) of a checkpoint of --ckpt-mib MiB.

    .venv/bin/python bench/push_overlap.py [--store local|hub] [--ckpt-mib 256] [--threads 1]

On a GPU the training thread mostly waits for the device, so the upload's CPU
work (copy, sha256, HTTP) overlaps for free; on a small CPU machine it competes
for cores with the training itself, which is the worst case measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from runtime import events  # noqa: E402
from runtime.checkpoint.cycle import Pusher  # noqa: E402
from runtime.reference.model import GPT, GPTConfig  # noqa: E402
from runtime.store import FileEntry, Manifest, checkpoint_name, open_store  # noqa: E402


def make_checkpoint(root: Path, step: int, mib: int) -> tuple[Path, Manifest]:
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    path = folder / "state.pt"
    digest = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(mib):
            block = os.urandom(1 << 20)
            digest.update(block)
            fh.write(block)
    return folder, Manifest(folder.name, step, (FileEntry("state.pt", mib << 20, digest.hexdigest()),))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", choices=("local", "hub"), default="local")
    p.add_argument("--ckpt-mib", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for training")
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args()
    torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block=128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, size=(16, 128)))

    def step() -> float:
        began = time.perf_counter()
        loss = model(x, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - began

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = None
        if ns.store == "hub":
            os.environ["HF_HUB_DISABLE_XET"] = "1"
            from tests.fakes.hub_server import HubServer

            server = HubServer(token="hf_bench")
            server.start()
            from runtime.store.hub import HubStore

            store = HubStore("hf://bench/ckpts", "runs/bench", token="hf_bench", endpoint=server.url)
        else:
            store = open_store((root / "store").as_uri(), "runs/bench")
        sink = open(os.devnull, "w")  # noqa: SIM115 - the pusher's event lines are not the measurement
        events.sys.stdout = sink
        for _ in range(10):
            step()  # warm-up
        idle, busy = [], []
        for r in range(ns.rounds):
            idle += [step() for _ in range(30)]
            folder, manifest = make_checkpoint(root / "local", 100 + r, ns.ckpt_mib)
            pusher = Pusher(store, keep=1)
            pusher.submit(folder, manifest)
            began = time.perf_counter()
            while pusher.queue.unfinished_tasks:
                busy.append(step())
            cycle_s = time.perf_counter() - began
            pusher.drain()
            assert pusher.verified(100 + r), pusher.failures
        events.sys.stdout = sys.__stdout__
        if server is not None:
            server.stop()
    ratio = statistics.median(busy) / statistics.median(idle)
    print(
        "| store | ckpt MiB | torch threads | idle step ms (median, n) | step ms during push (median, n) | ratio |"
        " cycle s |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {ns.store} | {ns.ckpt_mib} | {ns.threads} | {statistics.median(idle) * 1e3:.1f} ({len(idle)}) | "
        f"{statistics.median(busy) * 1e3:.1f} ({len(busy)}) | {ratio:.3f}x | {cycle_s:.1f} |"
    )


if __name__ == "__main__":
    main()

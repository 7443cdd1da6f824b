"""The step-time breakdown's own cost, side by side, in one run.

The reference trainer's loop (data, forward/backward, optimizer, each lapped)
through `Session`, three ways, interleaved in blocks (rotating order) so drift
hits all alike:

- off:    `Session(breakdown=False)`: `lap()` does nothing;
- events: the breakdown as it is now: host time per lap, plus on a GPU one CUDA
          event per lap, read after the step's own sync (the loss read) -- no
          extra host sync;
- synced: the breakdown as it was: `torch.cuda.synchronize()` before every lap
          (three per step), which stalls the host until the GPU drains.

On a CPU there is no device to sync, so `events` and `synced` cost the same and
the figure is the laps' own bookkeeping; the difference the sync made shows only
on a GPU (`--device cuda`, a bigger model with `--n-embd 768 --n-layer 12`).

    .venv/bin/python bench/breakdown_overhead.py [--steps 200] [--blocks 6] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from runtime.reference.cursor import DataOrder, Position  # noqa: E402
from runtime.reference.data import VOCAB, make_corpus, open_tokens  # noqa: E402
from runtime.reference.model import GPT, GPTConfig  # noqa: E402
from runtime.session import Session  # noqa: E402


class SyncedSession(Session):
    """The old breakdown: a full device sync before every lap."""

    def lap(self, phase: str) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        super().lap(phase)


def run_block(sess: Session, data: Position, model: GPT, opt: torch.optim.Optimizer, n: int) -> float:
    device = sess.device
    began = time.perf_counter()
    for _ in range(n):
        sess.running()
        x, y, first = data.next_batch()
        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        sess.lap("data")
        loss = model(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sess.lap("compute")
        opt.step()
        sess.lap("optimizer")
        sess.step(loss=loss, batch=x, tokens=x.size, sample_index=first)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return (time.perf_counter() - began) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="steps per block")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.manual_seed(0)
        make_corpus(work / "tokens.bin", 400_000, 0)
        tokens = open_tokens(work / "tokens.bin")
        data = Position(DataOrder(int(tokens.size), a.block, a.batch, 0), tokens)
        model = GPT(GPTConfig(VOCAB, a.block, a.n_layer, max(1, a.n_embd // 64), a.n_embd)).to(a.device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        os.environ.update(LAUNCHER_MAX_STEPS=str(10**8), LAUNCHER_STORE=(work / "store").as_uri())
        sink = open(work / "events.log", "w")  # noqa: SIM115 - the leg's stdout
        sessions = {}
        with redirect_stdout(sink):
            for name, cls, on in (("off", Session, False), ("events", Session, True), ("synced", SyncedSession, True)):
                sess = cls(
                    ckpt_every=10**9,
                    workdir=work / name,
                    device=a.device,
                    metrics_every=10**9,
                    breakdown=on,
                    count_flops=False,
                )
                sess.track(model=model, optimizer=opt)
                sess.resume()
                sessions[name] = sess
            run_block(sessions["off"], data, model, opt, 30)  # warm-up
            times: dict[str, list[float]] = {k: [] for k in sessions}
            names = list(sessions)
            for i in range(a.blocks):
                for name in names[i % 3 :] + names[: i % 3]:
                    times[name].append(run_block(sessions[name], data, model, opt, a.steps))
        sink.close()
    base = statistics.median(times["off"])
    print(
        f"device {a.device}, model {a.n_layer} x {a.n_embd}, block {a.block}, batch {a.batch}; "
        f"steps per block {a.steps}, blocks {a.blocks}"
    )
    print(f"{'breakdown':<10}{'median step':>14}{'vs off':>10}   blocks (ms)")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(
            f"{name:<10}{m * 1e3:>11.3f} ms{100 * (m - base) / base:>+9.2f} %   "
            f"{', '.join(f'{t * 1e3:.2f}' for t in ts)}"
        )
    ev, sy = statistics.median(times["events"]), statistics.median(times["synced"])
    print(
        f"breakdown overhead now: {(ev - base) * 1e3:+.3f} ms per step ({100 * (ev - base) / base:+.2f} %); "
        f"with a sync per lap: {(sy - base) * 1e3:+.3f} ms ({100 * (sy - base) / base:+.2f} %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The leg API's cost per step, side by side with a bare loop, in one run.

The reference trainer's model and data (small GPT, block 64, batch 8, CPU), the
same steps two ways, interleaved in blocks so drift hits both alike:

- bare: fetch the batch, forward, backward, clip, optimizer and scheduler step;
- session: the same on its own copy of the model, plus what `Session` adds per
  step -- the stop decision (`running()`), the phase laps, the forward pre-hook
  hashing what the model was fed, the optimizer's step post-hook, the `batch=`
  cross-check and printing the `step` event (to a file, as a leg's stdout is a
  pipe to the log). Checkpoints are off in both (their cost is
  bench/push_overlap.py's subject).

Also: `batch_digest` alone on the reference batch (4 KiB of token ids) and on a
154 MB image-sized batch (hashed in 64 sampled windows) against a full sha256;
and the state digests of one checkpoint (`runtime.session.step_evidence.state_digests`,
computed on the pusher's thread from the snapshot) of a 1 GB state, beside
`torch.save` of the same state to this machine's disk.

    .venv/bin/python bench/session_overhead.py [--steps 300] [--blocks 6]

Goal: session overhead <= 2 % of the reference trainer's CPU step.
"""

from __future__ import annotations

import argparse
import hashlib
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
from runtime.session.batches import batch_digest  # noqa: E402


def build(work: Path):  # noqa: ANN201
    torch.manual_seed(0)
    make_corpus(work / "tokens.bin", 200_000, 0)
    tokens = open_tokens(work / "tokens.bin")
    data = Position(DataOrder(int(tokens.size), 64, 8, 0), tokens)
    model = GPT(GPTConfig(VOCAB, 64, 2, 2, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return data, model, opt, sched


def digest_cost(work: Path) -> tuple[float, float]:
    """(state digests, torch.save) seconds for one checkpoint of a 1 GB state."""
    from runtime.session.step_evidence import state_digests

    state = {
        "model": {f"w{i}": torch.rand(64 << 20) for i in range(4)},  # 4 x 256 MB
        "extra": {"step": 1},
        "rng": [{"torch": torch.get_rng_state()}],
    }
    t = time.perf_counter()
    state_digests(state, list(state))
    digest_s = time.perf_counter() - t
    t = time.perf_counter()
    torch.save(state, work / "state.pt")
    os.sync()
    save_s = time.perf_counter() - t
    (work / "state.pt").unlink()
    return digest_s, save_s


def train_step(data, model, opt, sched):  # noqa: ANN001, ANN201
    x, y, first = data.next_batch()
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return x, loss, first


def bare(parts, n: int) -> float:  # noqa: ANN001
    began = time.perf_counter()
    for _ in range(n):
        train_step(*parts)
    return (time.perf_counter() - began) / n


def with_session(parts, sess: Session, n: int) -> float:  # noqa: ANN001
    began = time.perf_counter()
    for _ in range(n):
        sess.running()
        x, loss, first = train_step(*parts)
        sess.lap("compute")
        sess.step(loss=loss, batch=x, tokens=512, sample_index=first)
    return (time.perf_counter() - began) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per block")
    p.add_argument("--blocks", type=int, default=6)
    a = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        parts = build(work)
        tracked = build(work)  # the session's own copy: its hooks must not run in the bare loop
        os.environ.update(LAUNCHER_MAX_STEPS=str(10**8), LAUNCHER_STORE=(work / "store").as_uri())
        sink = open(work / "events.log", "w")  # noqa: SIM115 - the leg's stdout
        with redirect_stdout(sink):
            sess = Session(ckpt_every=10**9, workdir=work, device="cpu", metrics_every=10**9)
            sess.track(model=tracked[1], optimizer=tracked[2])
            sess.resume()
        bare(parts, 30)  # warm-up
        b, s = [], []
        for i in range(a.blocks):  # ABBA order: neither loop always runs first
            for which in (0, 1) if i % 2 == 0 else (1, 0):
                if which == 0:
                    b.append(bare(parts, a.steps))
                else:
                    with redirect_stdout(sink):
                        s.append(with_session(tracked, sess, a.steps))
        sink.close()
        digest_s, save_s = digest_cost(work)
    mb, ms = statistics.median(b), statistics.median(s)
    print(f"steps per block {a.steps}, blocks {a.blocks}, torch threads 1, CPU")
    print(f"{'loop':<10}{'median step':>14}{'blocks (ms)':>50}")
    print(f"{'bare':<10}{mb * 1e3:>11.3f} ms  {', '.join(f'{x * 1e3:.2f}' for x in b):>48}")
    print(f"{'session':<10}{ms * 1e3:>11.3f} ms  {', '.join(f'{x * 1e3:.2f}' for x in s):>48}")
    print(f"session overhead: {(ms - mb) * 1e3:+.3f} ms per step = {100 * (ms - mb) / mb:+.2f} % (goal <= 2 %)")

    x = torch.randint(0, 50_000, (8, 64))
    t = time.perf_counter()
    for _ in range(1000):
        batch_digest(x)
    small = (time.perf_counter() - t) / 1000
    big = torch.rand(256, 3, 224, 224)
    t = time.perf_counter()
    batch_digest(big)
    sampled = time.perf_counter() - t
    t = time.perf_counter()
    hashlib.sha256(big.numpy().tobytes()).hexdigest()
    full = time.perf_counter() - t
    print(
        f"batch_digest: reference batch (4 KiB) {small * 1e6:.1f} us; 154 MB image batch sampled "
        f"{sampled * 1e3:.2f} ms vs full sha256 {full * 1e3:.1f} ms"
    )
    print(
        f"state digests of a 1 GB checkpoint: {digest_s:.2f} s on the pusher's thread, beside torch.save of it "
        f"{save_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

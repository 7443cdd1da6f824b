"""Checkpoint time on the training loop's critical path: serialising inline vs a snapshot.

One process, one model + AdamW state (the reference GPT, sized by --n-embd and
--n-layer; 12 x 768 is ~85M params, ~1 GB of state with Adam's two moments),
checkpointed through two Sessions in one run, interleaved (ABAB) so drift hits both:

- sync  (`sess.async_save = False`, the old path): the state's live tensors are
  torch.save'd and hashed into the manifest inside `checkpoint()`;
- async (the default): `checkpoint()` copies the state into reused host buffers
  (pinned ones on a GPU) and returns; the Pusher's worker serialises it
  (`serialized` event) and then runs the storage cycle.

Per checkpoint: the `save` event's seconds (the critical path), the `serialized`
seconds (off it), push and verify (off it in both). Each checkpoint waits for the
previous cycle to finish first, so no `push_wait` is in the numbers; the first
checkpoint per mode (cold: buffers allocated, pages faulted) is shown apart.

    .venv/bin/python bench/async_save.py [--n-embd 512 --n-layer 8] [--repeats 3] [--device auto]

Default: ~25M params (~0.3 GB of state), under 2 min on a 2-core CPU; the
~1 GB case: --n-embd 768 --n-layer 12.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402

from runtime.reference.model import GPT, GPTConfig  # noqa: E402
from runtime.session import Session, resolve_device  # noqa: E402


def build(n_embd: int, n_layer: int, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 64, n_layer, max(1, n_embd // 64), n_embd)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # one step materialises Adam's moments (no forward needed)
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def session(
    work: Path, name: str, model: torch.nn.Module, opt: torch.optim.Optimizer, device: str, async_save: bool
) -> Session:
    os.environ.update(
        LAUNCHER_RUN_ID=f"bench-{name}", LAUNCHER_STORE=(work / f"store-{name}").as_uri(), LAUNCHER_MAX_STEPS=str(10**8)
    )
    sess = Session(ckpt_every=10**9, keep=1, workdir=work / f"work-{name}", device=device, metrics_every=10**9)
    sess.async_save = async_save
    sess.track(model=model, optimizer=opt)
    sess.resume()
    return sess


def nudge(model: torch.nn.Module) -> None:
    """The next step's in-place update (the snapshot must not see it; here it just keeps the data moving)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.999)


def checkpoint(sess: Session, step: int) -> None:
    sess.step_count = step
    sess.checkpoint()
    while sess.pusher.queue.unfinished_tasks:  # the whole cycle, before the next one: no push_wait
        time.sleep(0.01)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="checkpoints per mode after the cold one")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    for var in ("LAUNCHER_DEADLINE", "LAUNCHER_FILES_SHA256", "LAUNCHER_STORE_KEY"):
        os.environ.pop(var, None)
    model, opt = build(a.n_embd, a.n_layer, device)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = work / "events.log"
        began = time.perf_counter()
        with open(log, "w") as sink, redirect_stdout(sink):
            sessions = {
                "sync": session(work, "sync", model, opt, device, False),
                "async": session(work, "async", model, opt, device, True),
            }
            step = 0
            for r in range(1 + a.repeats):
                for name in ("sync", "async") if r % 2 == 0 else ("async", "sync"):  # ABBA
                    step += 1
                    nudge(model)
                    checkpoint(sessions[name], step)
            for sess in sessions.values():
                sess.pusher.drain()
            pool = sessions["async"].saver.pool
            allocations = pool.allocations if pool is not None else 0
        wall = time.perf_counter() - began
        evs = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"event"')]
    rows = {}
    for name in ("sync", "async"):
        by_kind: dict[str, list[dict]] = {}
        steps = {e["step"] for e in evs if e["event"] == "save" and e["async_save"] == (name == "async")}
        for e in evs:
            if e.get("step") in steps and e["event"] in ("save", "serialized", "push", "verify"):
                by_kind.setdefault(e["event"], []).append(e)
        ordered = {k: sorted(v, key=lambda e: e["step"]) for k, v in by_kind.items()}
        saves = [e["seconds"] for e in ordered["save"]]
        ser = [e["seconds"] for e in ordered.get("serialized", [])]
        rows[name] = {
            "cold": saves[0],
            "warm": saves[1:],
            "ser": ser[1:] or [0.0],
            "push": statistics.median(e["seconds"] for e in ordered["push"][1:]),
            "verify": statistics.median(e["seconds"] for e in ordered["verify"][1:]),
            "bytes": ordered["push"][-1]["bytes"],
        }
    print(
        f"{params / 1e6:.1f}M params + AdamW on {device}: checkpoint {rows['sync']['bytes'] / 2**20:,.0f} MiB; "
        f"torch threads {torch.get_num_threads()}; {a.repeats} warm checkpoints per mode (+1 cold); {wall:.0f} s"
    )
    print(
        f"{'mode':<7}{'critical path s':>17}{'(cold)':>9}{'warm runs':>26}{'serialise s':>13}{'push s':>9}"
        f"{'verify s':>10}"
    )
    for name, r in rows.items():
        warm = ", ".join(f"{x:.3f}" for x in r["warm"])
        ser = f"{statistics.median(r['ser']):.3f}" if name == "async" else "(inline)"
        print(
            f"{name:<7}{statistics.median(r['warm']):>17.3f}{r['cold']:>9.3f}{warm:>26}{ser:>13}"
            f"{r['push']:>9.3f}{r['verify']:>10.3f}"
        )
    sync, asyn = statistics.median(rows["sync"]["warm"]), statistics.median(rows["async"]["warm"])
    print(
        f"critical path per checkpoint: {sync:.3f} s inline -> {asyn:.3f} s with a snapshot "
        f"({sync / asyn:.1f}x less; {statistics.median(rows['async']['ser']):.3f} s of serialisation moved to the "
        f"worker); {allocations} snapshot buffers allocated over {a.repeats + 1} checkpoints (one per state "
        f"storage, reused)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

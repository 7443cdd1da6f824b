"""Reference trainer: a small GPT on deterministic data, with exact resume.

This is the file users copy (`launcher init` writes it as train.py). Read it
top to bottom: parse -> guard -> build -> resume from the store -> train -> push.

It speaks the leg contract of docs/design.md:
  LAUNCHER_RUN_ID, LAUNCHER_LEG, LAUNCHER_RUNG  who this leg is
  LAUNCHER_STORE     checkpoint store URI (file:///abs/dir or hf://owner/repo);
                     this run's checkpoints live under runs/<run id>/ in it
  LAUNCHER_MAX_STEPS stop after this many optimizer steps (counted from 0,
                     across legs: a resumed leg continues toward it)
  LAUNCHER_DEADLINE  unix seconds: push a final checkpoint and stop before it
  LAUNCHER_DEADLINE_AFTER_RESUME  (optional) seconds: the deadline is also no later
                     than this long after the resume (the Session applies it)
  LAUNCHER_HOLD_AT_STEP  (optional) step: wait there until the deadline is due
                     (the Session applies it: a rehearsal lands its deadline at a known step)
  LAUNCHER_HOLD_UNTIL    (optional) sigterm: end that wait when the SIGTERM comes instead
  LAUNCHER_HOLD_DEADLINE_S  (optional) seconds: on reaching that step, place the deadline this
                     long (plus the stop margin) ahead, if sooner: the wait is that long
  LAUNCHER_FILES_SHA256  the reviewed files' sha256: refuse to run stale code
and prints one JSON event per line (runtime.events): the evidence. All of that
is the leg API's job (runtime.session.Session); this file is what a trainer of
your own looks like on it: build, track, resume, loop, finish.

Runs alone (`python train.py --max-steps 20` trains into ./store) or under
torchrun (`torchrun --nproc_per_node=2 train.py`): every rank trains its slice
of each batch, only rank 0 pushes, every rank prints its own diagnostics.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np
import torch

from runtime.hashing import sha256_file
from runtime.measure.flops import transformer_flops_per_token
from runtime.reference.cursor import DataOrder, Position
from runtime.reference.data import VOCAB, make_corpus, open_tokens
from runtime.reference.model import GPT, GPTConfig
from runtime.session import Session
from runtime.session.world import RankTimeout


def build_parser() -> argparse.ArgumentParser:
    """The trainer's flags; rung 0 parses the launch command line with this."""
    p = argparse.ArgumentParser(description="preflight reference trainer (small GPT)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block", type=int, default=64, help="context length in tokens")
    p.add_argument("--batch", type=int, default=8, help="sequences per step per rank")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--schedule", choices=("cosine", "linear"), default="cosine")
    p.add_argument("--warmup", type=int, default=10, help="linear warm-up steps")
    p.add_argument(
        "--total-steps",
        type=int,
        default=1000,
        help="the whole run's length (not a leg's): the schedule's horizon and the ETA's target",
    )
    p.add_argument("--ckpt-every", type=int, default=10, help="push a checkpoint every N steps")
    p.add_argument("--keep", type=int, default=2, help="verified checkpoints prune keeps")
    p.add_argument("--verify-bytes", type=int, default=2 << 20, help="read-back budget per verify (bytes)")
    p.add_argument("--metrics-every", type=int, default=10, help="steps per memory/rate window")
    p.add_argument("--data-tokens", type=int, default=200_000, help="size of the generated corpus")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--max-steps", type=int, default=None, help="overrides LAUNCHER_MAX_STEPS")
    p.add_argument("--workdir", default=".", help="the leg's local disk")
    p.add_argument(
        "--data-delay",
        type=float,
        default=0.0,
        help="seconds slept per batch: simulates a slow input pipeline (tests, drills)",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: autocast the forward pass to bf16 (weights and optimizer state stay fp32)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the first steps compile)")
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block's activations in the backward instead of keeping them (memory for compute)",
    )
    p.add_argument(
        "--sync-save",
        action="store_true",
        help="write each checkpoint on the critical path instead of snapshotting it and writing it in "
        "the background (for comparison)",
    )
    p.add_argument(
        "--health-every",
        type=float,
        default=30.0,
        help="seconds between `health` events (disk, RAM, GPU memory per process)",
    )
    return p


def lr_factor(step: int, warmup: int, total: int, schedule: str = "cosine") -> float:
    """Linear warm-up, then cosine (or linear) decay to 10 % of peak: a pure
    function of the step, so a resumed run can be checked against it."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - 0.9 * progress
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sess = Session(
            ckpt_every=args.ckpt_every,
            keep=args.keep,
            workdir=args.workdir,
            device=args.device,
            total_steps=args.total_steps,
            max_steps=args.max_steps,
            verify_bytes=args.verify_bytes,
            metrics_every=args.metrics_every,
            health_every=args.health_every,
            async_save=not args.sync_save,
            lr_schedule=lambda s: args.lr * lr_factor(s, args.warmup, args.total_steps, args.schedule),
        )
        try:
            return train(args, sess)
        except RankTimeout as err:  # every rank says what it waited for
            return sess.rank_timeout(err)
    except SystemExit as stop:  # the session refused (exit 3) or stopped on a non-finite loss (exit 1)
        return int(stop.code or 0)


def train(args: argparse.Namespace, sess: Session) -> int:
    # --- build: data, model, optimizer, schedule (all seeded) ----------------
    world, device = sess.world, sess.device
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    corpus = sess.work / "data" / "tokens.bin"
    if world.local_rank == 0:
        make_corpus(corpus, args.data_tokens, args.seed)
    world.barrier("local rank 0 writing the corpus")
    tokens = open_tokens(corpus)
    order = DataOrder(int(tokens.size), args.block, args.batch, args.seed, world.world_size)
    data = Position(order, tokens, world.rank)
    raw = GPT(GPTConfig(VOCAB, args.block, args.n_layer, args.n_head, args.n_embd)).to(device)
    raw.recompute = args.activation_checkpointing
    model = raw
    if world.distributed:
        model = torch.nn.parallel.DistributedDataParallel(raw, device_ids=[device] if "cuda" in device else None)
    forward = torch.compile(model) if args.compile else model
    autocast = torch.autocast("cuda" if "cuda" in device else "cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    # 6N + 12 L d T, N without the position table: shown beside the session's own count
    sess.flops_formula = transformer_flops_per_token(
        sum(p.numel() for p in raw.parameters()) - raw.pos.weight.numel(), args.n_layer, args.n_embd, args.block
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.total_steps, args.schedule))
    tokens_per_step = order.global_batch * args.block

    # --- resume from the newest verified checkpoint, then train ----------------
    sess.track(model=raw, optimizer=opt, scheduler=sched, cursor=data)
    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))
    model.train()
    while sess.running():
        x, y, first_sample = data.next_batch()
        if args.data_delay:
            time.sleep(args.data_delay)
        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        sess.lap("data")
        with autocast:
            loss = forward(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        sess.lap("compute")
        opt.step()
        sched.step()
        sess.lap("optimizer")
        sess.step(loss=loss, batch=x, tokens=tokens_per_step, sample_index=first_sample)
    return sess.finish()


if __name__ == "__main__":
    sys.exit(main())

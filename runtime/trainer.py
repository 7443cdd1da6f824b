"""Reference trainer: a small GPT on deterministic data, with exact resume.

This is the file users copy (`launcher init` writes it as train.py). Read it
top to bottom: parse -> build -> resume from the store -> train -> push.

It speaks the leg contract of DESIGN.md:
  LAUNCHER_RUN_ID, LAUNCHER_LEG, LAUNCHER_RUNG  who this leg is
  LAUNCHER_STORE     checkpoint store URI (file:///abs/dir); this run's
                     checkpoints live under runs/<run id>/ in it
  LAUNCHER_MAX_STEPS stop after this many optimizer steps (counted from 0,
                     across legs: a resumed leg continues toward it)
  LAUNCHER_DEADLINE  unix seconds: push a final checkpoint and stop before it
and prints one JSON event per line (runtime.events): the evidence.

Run alone: `python train.py --max-steps 20` trains into ./store.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from runtime import events
from runtime.checkpoint import load_local, save_local
from runtime.cursor import CursorMismatch, DataOrder
from runtime.cycle import Pusher, newest_verified
from runtime.data import VOCAB, make_corpus, open_tokens
from runtime.model import GPT, GPTConfig
from runtime.store import StoreError, open_store

EXIT_VERIFY_FAILED = 1
EXIT_REFUSED = 3


def build_parser() -> argparse.ArgumentParser:
    """The trainer's flags; rung 0 parses the launch command line with this."""
    p = argparse.ArgumentParser(description="preflight reference trainer (small GPT)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block", type=int, default=64, help="context length in tokens")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=10, help="linear warm-up steps")
    p.add_argument("--lr-steps", type=int, default=1000, help="schedule length (the whole run, not a leg)")
    p.add_argument("--ckpt-every", type=int, default=10, help="push a checkpoint every N steps")
    p.add_argument("--keep", type=int, default=2, help="verified checkpoints prune keeps")
    p.add_argument("--verify-bytes", type=int, default=2 << 20, help="read-back budget per verify (bytes)")
    p.add_argument("--data-tokens", type=int, default=200_000, help="size of the generated corpus")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--max-steps", type=int, default=None, help="overrides LAUNCHER_MAX_STEPS")
    p.add_argument("--workdir", default=".", help="the leg's local disk")
    return p


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine to 10% of peak: a pure function of the step,
    so a resumed run can be checked against what it would have been."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_id = os.environ.get("LAUNCHER_RUN_ID", "local")
    max_steps = args.max_steps or int(os.environ.get("LAUNCHER_MAX_STEPS", "50"))
    deadline = float(os.environ.get("LAUNCHER_DEADLINE", "inf"))
    work = Path(args.workdir).resolve()
    store = open_store(os.environ.get("LAUNCHER_STORE", (work / "store").as_uri()), f"runs/{run_id}")

    # --- build: data, model, optimizer, schedule (all seeded) ----------------
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    data_sha = make_corpus(work / "data" / "tokens.bin", args.data_tokens, args.seed)
    tokens = open_tokens(work / "data" / "tokens.bin")
    order = DataOrder(int(tokens.size), args.block, args.batch, args.seed)
    model = GPT(GPTConfig(VOCAB, args.block, args.n_layer, args.n_head, args.n_embd)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.lr_steps))
    n_params = sum(p.numel() for p in model.parameters())
    events.emit("start", run_id=run_id, leg=int(os.environ.get("LAUNCHER_LEG", "0")),
                rung=os.environ.get("LAUNCHER_RUNG", "none"), device=device, torch=torch.__version__,
                params=n_params, data_sha256=data_sha, data_tokens=int(tokens.size), max_steps=max_steps,
                store=store.uri, argv=sys.argv[1:] if argv is None else argv)

    # --- resume: only from the newest *verified* checkpoint in the store -----
    step = 0
    try:
        latest = newest_verified(store)
    except StoreError as err:  # an auth error must not read as "nothing here": stop, say why
        events.emit("stop", reason="store_error", step=0, error=f"{type(err).__name__}: {err}")
        return EXIT_REFUSED
    if latest is not None:
        folder = store.fetch(latest.name, work / "restore")
        state, manifest = load_local(folder, map_location=device)
        shutil.rmtree(folder)
        try:
            cursor = order.check_cursor(tokens, state["cursor"])
        except CursorMismatch as err:
            events.emit("stop", reason="cursor_mismatch", step=state["step"], error=str(err))
            return EXIT_REFUSED
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        step = state["step"]
        events.emit("resume", from_step=step, checkpoint=manifest.name, sample_index=cursor["sample_index"],
                    batch_hash=order.batch_hash(tokens, step), lr=opt.param_groups[0]["lr"],
                    lr_expected=args.lr * lr_factor(step, args.warmup, args.lr_steps),
                    tokens_consumed=cursor["tokens_consumed"], epoch=cursor["epoch"])

    # SIGTERM = graceful stop: finish the step, push, verify, then exit.
    stop_requested = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append("sigterm"))

    pusher = Pusher(store, keep=args.keep, verify_budget=args.verify_bytes)

    def checkpoint(at_step: int) -> None:
        """Serialize the state now (on the critical path, so it is consistent), then hand
        the storage cycle to the background pusher: training goes on while it uploads."""
        began = time.perf_counter()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "rng": rng_state(), "step": at_step, "cursor": order.cursor(tokens, at_step)}
        folder, manifest = save_local(state, work / "ckpt", at_step, {"run_id": run_id, "params": n_params})
        blocked = pusher.submit(folder, manifest)
        events.emit("save", step=at_step, bytes=manifest.total_bytes, seconds=round(time.perf_counter() - began, 4),
                    blocked_s=round(blocked, 4))

    # --- train ---------------------------------------------------------------
    model.train()
    reason, step_s = "max_steps", 0.0
    resumed_at = pushed_at = step  # the newest step the store holds for this run
    while step < max_steps:
        if time.time() + max(5.0, 2 * pusher.last_cycle_s + 3 * step_s) >= deadline:
            reason = "deadline"
            break
        began = time.perf_counter()
        x, y, first_sample = order.batch_at(tokens, step)
        lr = opt.param_groups[0]["lr"]
        loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        step_s = time.perf_counter() - began
        n_tok = x.size
        mem = torch.cuda.max_memory_allocated() if device == "cuda" else None
        events.emit("step", step=step, loss=round(loss.item(), 6), lr=lr, sample_index=first_sample,
                    tokens=step * n_tok, tok_s=round(n_tok / step_s, 1), step_s=round(step_s, 4),
                    mem_max_bytes=mem)
        if stop_requested:
            reason = stop_requested[0]
            break
        if step % args.ckpt_every == 0:
            checkpoint(step)
            pushed_at = step

    events.emit("stop", reason=reason, step=step)
    if step > pushed_at:  # final checkpoint: whatever stopped us, the work is kept
        checkpoint(step)
    pusher.drain()  # the leg ends only once every push went through its cycle
    final_ok = step == resumed_at or pusher.verified(step)
    events.emit("done", step=step, final_checkpoint_verified=final_ok)
    return 0 if final_ok else EXIT_VERIFY_FAILED


if __name__ == "__main__":
    sys.exit(main())

"""Reference trainer: a small GPT on deterministic data, with exact resume.

This is the file users copy (`launcher init` writes it as train.py). Read it
top to bottom: parse -> guard -> build -> resume from the store -> train -> push.

It speaks the leg contract of DESIGN.md:
  LAUNCHER_RUN_ID, LAUNCHER_LEG, LAUNCHER_RUNG  who this leg is
  LAUNCHER_STORE     checkpoint store URI (file:///abs/dir or hf://owner/repo);
                     this run's checkpoints live under runs/<run id>/ in it
  LAUNCHER_MAX_STEPS stop after this many optimizer steps (counted from 0,
                     across legs: a resumed leg continues toward it)
  LAUNCHER_DEADLINE  unix seconds: push a final checkpoint and stop before it
  LAUNCHER_FILES_SHA256  the reviewed files' sha256: refuse to run stale code
and prints one JSON event per line (runtime.events): the evidence.

Runs alone (`python train.py --max-steps 20` trains into ./store) or under
torchrun (`torchrun --nproc_per_node=2 train.py`): every rank trains its slice
of each batch, only rank 0 pushes, every rank prints its own diagnostics.
"""

from __future__ import annotations

import argparse
import hashlib
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
from runtime.cycle import Pusher
from runtime.data import VOCAB, make_corpus, open_tokens
from runtime.dist import RankTimeout, World, init_world
from runtime.metrics import host_rss_bytes, sustained_rate
from runtime.model import GPT, GPTConfig
from runtime.health import Health
from runtime.resume import restore_newest
from runtime.state import rng_state, set_rng_state, stale_files
from runtime.store import StoreError, open_store

EXIT_FAILED = 1    # final checkpoint not verified, non-finite loss, a rank timed out
EXIT_REFUSED = 3   # stale code, a cursor that does not match the data, a store that refuses us
STOP_CODES = {1: "sigterm", 2: "deadline"}  # agreed across ranks by all-reduce(MAX)


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
    p.add_argument("--total-steps", type=int, default=1000,
                   help="the whole run's length (not a leg's): the schedule's horizon and the ETA's target")
    p.add_argument("--ckpt-every", type=int, default=10, help="push a checkpoint every N steps")
    p.add_argument("--keep", type=int, default=2, help="verified checkpoints prune keeps")
    p.add_argument("--verify-bytes", type=int, default=2 << 20, help="read-back budget per verify (bytes)")
    p.add_argument("--metrics-every", type=int, default=10, help="steps per memory/rate window")
    p.add_argument("--data-tokens", type=int, default=200_000, help="size of the generated corpus")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--max-steps", type=int, default=None, help="overrides LAUNCHER_MAX_STEPS")
    p.add_argument("--workdir", default=".", help="the leg's local disk")
    p.add_argument("--data-delay", type=float, default=0.0,
                   help="seconds slept per batch: simulates a slow input pipeline (tests, drills)")
    p.add_argument("--health-every", type=float, default=30.0,
                   help="seconds between `health` events (disk, RAM, GPU memory per process)")
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


def device_memory(device: str) -> tuple[int, int, int]:
    """(allocated, reserved, peak since the last call): a window, not a lifetime peak."""
    if device.startswith("cuda"):
        out = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        return out
    rss = host_rss_bytes()
    return rss, rss, rss


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    world = init_world(device)
    if device == "cuda":
        device = f"cuda:{world.local_rank}"
        torch.cuda.set_device(device)
    try:
        return train(args, world, device)
    except RankTimeout as err:  # every rank says what it waited for
        events.emit("stop", reason="rank_timeout", error=str(err))
        return EXIT_FAILED
    finally:
        world.close()


def train(args: argparse.Namespace, world: World, device: str) -> int:
    run_id = os.environ.get("LAUNCHER_RUN_ID", "local")
    max_steps = args.max_steps or int(os.environ.get("LAUNCHER_MAX_STEPS", "50"))
    deadline = float(os.environ.get("LAUNCHER_DEADLINE", "inf"))
    work = Path(args.workdir).resolve()

    # --- guard: run only the reviewed bytes ---------------------------------
    stale = stale_files(os.environ.get("LAUNCHER_FILES_SHA256"), Path.cwd())
    if stale:
        events.emit("stop", reason="stale_code", step=0, error=f"differ from review: {', '.join(stale)}")
        return EXIT_REFUSED

    # --- build: data, model, optimizer, schedule (all seeded) ----------------
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    corpus = work / "data" / "tokens.bin"
    if world.local_rank == 0:
        make_corpus(corpus, args.data_tokens, args.seed)
    world.barrier("local rank 0 writing the corpus")
    tokens = open_tokens(corpus)
    order = DataOrder(int(tokens.size), args.block, args.batch, args.seed, world.world_size)
    model = GPT(GPTConfig(VOCAB, args.block, args.n_layer, args.n_head, args.n_embd)).to(device)
    raw = model
    if world.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if "cuda" in device else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, args.warmup, args.total_steps, args.schedule))
    n_params = sum(p.numel() for p in raw.parameters())
    tokens_per_step = order.global_batch * args.block
    store = open_store(os.environ.get("LAUNCHER_STORE", (work / "store").as_uri()), f"runs/{run_id}")
    events.emit("start", run_id=run_id, leg=int(os.environ.get("LAUNCHER_LEG", "0")),
                rung=os.environ.get("LAUNCHER_RUNG", "none"), device=device, torch=torch.__version__,
                world_size=world.world_size, params=n_params, data_sha256=_sha256(corpus),
                data_tokens=int(tokens.size), max_steps=max_steps, total_steps=args.total_steps, store=store.uri)

    # --- resume: rank 0 picks the newest *verified* checkpoint that fetches, checks
    # and loads (a damaged one is skipped with a `resume_skip` event); all load it --
    choice, state = None, None
    restore = work / "restore"
    if world.is_main:
        try:
            restored = restore_newest(store, restore, map_location=device, keep_files=True)
            state = restored.state
            choice = ("ok", restored.info.name if restored.info else None, restored.skipped)
        except StoreError as err:  # an auth error must not read as "nothing here"
            choice = ("error", f"{type(err).__name__}: {err}", [])
    status, name, skipped = world.broadcast(choice)
    if status == "error":
        events.emit("stop", reason="store_error", step=0, error=name)
        return EXIT_REFUSED
    step = 0
    if name is not None:
        if world.local_rank == 0 and not world.is_main:
            store.fetch(name, restore)  # once per node: the node's disk is shared by its ranks
        world.barrier(f"local rank 0 fetching {name} from the store")
        if state is None:
            state, _ = load_local(restore / name, map_location=device, fetched=True)
        world.barrier(f"every rank loading {name}")
        if world.local_rank == 0:
            shutil.rmtree(restore)
        try:
            cursor = order.check_cursor(tokens, state["cursor"])
        except CursorMismatch as err:
            events.emit("stop", reason="cursor_mismatch", step=state["step"], error=str(err))
            return EXIT_REFUSED
        raw.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"][world.rank])
        step = state["step"]
        events.emit("resume", from_step=step, checkpoint=name, sample_index=cursor["sample_index"],
                    rank_sample_index=order.first_sample(step, world.rank),
                    batch_hash=cursor["next_batch_sha256"], lr=opt.param_groups[0]["lr"],  # re-hashed by check_cursor
                    lr_expected=args.lr * lr_factor(step, args.warmup, args.total_steps, args.schedule),
                    tokens_consumed=cursor["tokens_consumed"], epoch=cursor["epoch"])

    # SIGTERM = graceful stop: finish the step, push, verify, then exit.
    sigterm: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: sigterm.append(True))
    pusher = Pusher(store, keep=args.keep, verify_budget=args.verify_bytes,
                    replace=frozenset(skipped)) if world.is_main else None

    def checkpoint(at_step: int) -> None:
        """Serialize the state now (on the critical path, so it is consistent), then hand
        the storage cycle to the background pusher: training goes on while it uploads."""
        began = time.perf_counter()
        rngs = world.gather(rng_state())  # collective: every rank reaches this at the same step
        if pusher is None:
            return
        state = {"model": raw.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "rng": rngs, "step": at_step, "cursor": order.cursor(tokens, at_step)}
        folder, manifest = save_local(state, work / "ckpt", at_step, {"run_id": run_id, "params": n_params})
        blocked = pusher.submit(folder, manifest)
        events.emit("save", step=at_step, bytes=manifest.total_bytes, seconds=round(time.perf_counter() - began, 4),
                    blocked_s=round(blocked, 4))

    # --- train ---------------------------------------------------------------
    model.train()
    reason, step_s, mem_max = "max_steps", 0.0, None
    resumed_at = pushed_at = step  # the newest step the store holds for this run
    history: list[tuple[int, float, float]] = []  # (step, tokens this leg, time): the rate window
    # Where each step's time goes, on the critical path (background pushes are not in it):
    # data wait, forward+backward, optimizer, cross-rank sync, checkpoint saves since the last step.
    sync_device = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    ckpt_s = 0.0
    health = Health(work, device, args.health_every) if world.local_rank == 0 else None
    while step < max_steps:
        t0 = time.perf_counter()
        margin = max(5.0, 2 * (pusher.last_cycle_s if pusher else 0.0) + 3 * step_s)
        local_stop = 2 if time.time() + margin >= deadline else (1 if sigterm else 0)
        stop_code = int(world.max(local_stop))  # one decision for every rank
        if stop_code:
            reason = STOP_CODES[stop_code]
            break
        t1 = began = time.perf_counter()
        x, y, first_sample = order.batch_at(tokens, step, world.rank)
        if args.data_delay:
            time.sleep(args.data_delay)
        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        sync_device()
        t2 = time.perf_counter()
        lr = opt.param_groups[0]["lr"]
        loss = model(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        sync_device()
        t3 = time.perf_counter()
        opt.step()
        sched.step()
        sync_device()
        t4 = time.perf_counter()
        step += 1
        local_loss = loss.item()
        global_loss = world.mean(local_loss)
        t5 = time.perf_counter()
        step_s = t5 - began
        phases = {"data": t2 - t1, "compute": t3 - t2, "optimizer": t4 - t3, "sync": (t5 - t4) + (t1 - t0),
                  "ckpt": ckpt_s}
        if not math.isfinite(global_loss):  # never push a poisoned state
            events.emit("stop", reason="nonfinite_loss", step=step, loss=global_loss)
            if pusher:
                pusher.drain()
            return EXIT_FAILED
        history.append((step, (step - resumed_at) * tokens_per_step, time.time()))
        if step % args.metrics_every == 0:
            mem_max = _emit_window(world, device, step, history, args.total_steps, tokens_per_step)
            if health is not None:
                health.maybe_emit(step)
        events.emit("step", step=step, loss=round(global_loss, 6), loss_local=round(local_loss, 6), lr=lr,
                    sample_index=first_sample, tokens=step * tokens_per_step,
                    tok_s=round(tokens_per_step / step_s, 1), step_s=round(step_s, 4), mem_max_bytes=mem_max,
                    phases={k: round(v, 5) for k, v in phases.items()})
        ckpt_s = 0.0
        if step % args.ckpt_every == 0:
            t_ckpt = time.perf_counter()
            checkpoint(step)
            ckpt_s = time.perf_counter() - t_ckpt
            pushed_at = step

    events.emit("stop", reason=reason, step=step)
    if step > pushed_at:  # final checkpoint: whatever stopped us, the work is kept
        checkpoint(step)
    final_ok = True
    if pusher is not None:
        pusher.drain()  # the leg ends only once every push went through its cycle
        final_ok = step == resumed_at or pusher.verified(step)
    world.barrier("rank 0 finishing its pushes")
    final_ok = bool(world.broadcast(final_ok))  # only rank 0 can know; every rank exits the same way
    events.emit("done", step=step, final_checkpoint_verified=final_ok)
    return 0 if final_ok else EXIT_FAILED


def _emit_window(world: World, device: str, step: int, history: list[tuple[int, float, float]],
                 total_steps: int, tokens_per_step: int) -> float:
    """Per window: memory (cross-rank MAX by all-reduce) and the sustained rate + ETA."""
    allocated, reserved, peak = device_memory(device)
    peak_max = world.max(peak)
    events.emit("memory", step=step, kind="cuda" if device.startswith("cuda") else "host_rss",
                allocated=allocated, reserved=reserved, peak=peak,
                allocated_max=world.max(allocated), reserved_max=world.max(reserved), peak_max=peak_max)
    rate = sustained_rate(history)
    if rate is not None and world.is_main:
        eta = max(0, total_steps - step) * tokens_per_step / rate.tok_s
        events.emit("rate", step=step, tok_s=round(rate.tok_s, 1), window_first=rate.first_step,
                    window_last=rate.last_step, seconds=round(rate.seconds, 3), rel_err=rate.rel_err,
                    total_steps=total_steps,
                    eta_s=round(eta, 1))
    return peak_max


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    sys.exit(main())

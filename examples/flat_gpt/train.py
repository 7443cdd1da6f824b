"""A flat training script in the shape of many public GPT trainers: configuration
read at module level, training at import time, a `while True` loop with a
hand-written warm-up + cosine LR, random batches drawn with torch.randint, and
its own checkpoint in out_dir. Nothing here knows about preflight."""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

from runtime.session import Session

parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=200)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--block_size", type=int, default=32)
parser.add_argument("--n_embd", type=int, default=48)
parser.add_argument("--learning_rate", type=float, default=3e-3)
parser.add_argument("--warmup_iters", type=int, default=10)
parser.add_argument("--eval_interval", type=int, default=50)
parser.add_argument("--out_dir", default="out")
parser.add_argument("--ckpt_every", type=int, default=5)
args = parser.parse_args()

torch.manual_seed(1337)
# the data: a fixed pseudo-text, tokenised by character
text = "".join(chr(97 + (i * i + 3 * i) % 23) for i in range(40_000))
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    d = train_data if split == "train" else val_data
    ix = torch.randint(len(d) - args.block_size, (args.batch_size,))
    x = torch.stack([d[i:i + args.block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + args.block_size] for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(len(vocab), args.n_embd)
        self.pos = nn.Embedding(args.block_size, args.n_embd)
        self.blocks = nn.Sequential(Block(args.n_embd), Block(args.n_embd))
        self.head = nn.Linear(args.n_embd, len(vocab))

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.blocks(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1)


def get_lr(it):
    if it < args.warmup_iters:
        return args.learning_rate * (it + 1) / args.warmup_iters
    ratio = (it - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters)
    return 0.1 * args.learning_rate + 0.45 * args.learning_rate * (1 + math.cos(math.pi * min(1.0, ratio)))


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {split: sum(model(*get_batch(split)).item() for _ in range(5)) / 5 for split in ("train", "val")}
    model.train()
    return out


iter_num, best_val_loss = 0, 1e9
os.makedirs(args.out_dir, exist_ok=True)
sess = Session(ckpt_every=args.ckpt_every, total_steps=args.max_iters, lr_schedule=get_lr)
sess.track(model=model, optimizer=optimizer)
iter_num = sess.resume()
while sess.running():
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % args.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
            torch.save({"model": model.state_dict(), "iter_num": iter_num}, os.path.join(args.out_dir, "ckpt.pt"))
    X, Y = get_batch("train")
    loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    sess.step(loss=loss, batch=X, lr=lr, tokens=X.numel())
    iter_num += 1
sys.exit(sess.finish())

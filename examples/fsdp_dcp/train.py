"""An FSDP2 language model on a toy corpus, as a torchrun script is usually written: the model
and its AdamW sharded over the ranks with `fully_shard`, a DistributedSampler per rank, and a
checkpoint every N steps through torch.distributed.checkpoint into ./ckpt, loaded at start if
there is one. Nothing here knows about preflight."""

import argparse
import sys

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import Subset, TensorDataset

from runtime.session import EpochLoader, Session

parser = argparse.ArgumentParser(description="FSDP2 toy language model")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--ckpt-every", type=int, default=10)
args = parser.parse_args()

sess = Session(ckpt_every=args.ckpt_every, total_steps=args.steps)  # joins the torchrun world
rank, world = sess.world.rank, sess.world.world_size
torch.manual_seed(0)
text = ("the quick brown fox jumps over the lazy dog and runs far away " * 200).encode()
ids = torch.tensor(list(text), dtype=torch.long)
rows = ids[: len(ids) // (args.seq + 1) * (args.seq + 1)].view(-1, args.seq + 1)
data = TensorDataset(rows[:, :-1], rows[:, 1:])
loader = EpochLoader(Subset(data, range(rank, len(data), world)), batch_size=args.batch, seed=0)

model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 256))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sess.track(model=model, optimizer=opt, loader=loader)  # sharded: saved through DCP by every rank
sess.resume()

for epoch in loader.epochs(10**6):  # until the session stops it (LAUNCHER_MAX_STEPS, the deadline)
    for x, y in loader:
        if not sess.running():
            break
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        sess.step(loss=loss, batch=x, tokens=x.numel() * world, epoch=epoch)
    if not sess.running():
        break
sys.exit(sess.finish())

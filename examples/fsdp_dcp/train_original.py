"""An FSDP2 language model on a toy corpus, as a torchrun script is usually written: the model
and its AdamW sharded over the ranks with `fully_shard`, a DistributedSampler per rank, and a
checkpoint every N steps through torch.distributed.checkpoint into ./ckpt, loaded at start if
there is one. Nothing here knows about preflight."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="FSDP2 toy language model")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--ckpt-every", type=int, default=10)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
text = ("the quick brown fox jumps over the lazy dog and runs far away " * 200).encode()
ids = torch.tensor(list(text), dtype=torch.long)
rows = ids[: len(ids) // (args.seq + 1) * (args.seq + 1)].view(-1, args.seq + 1)
data = TensorDataset(rows[:, :-1], rows[:, 1:])
sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)

model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 256))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
step = 0
if os.path.isdir("ckpt"):
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id="ckpt")
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

epoch = 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
        if step % args.ckpt_every == 0:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id="ckpt")
        if step >= args.steps:
            break
    epoch += 1
dist.destroy_process_group()

"""A torchrun script whose data comes through torchdata's StatefulDataLoader with worker
processes, as such scripts are usually written: a map-style dataset of token windows, a
DistributedSampler per rank, 2 workers (persistent or not), a small MLP language model, AdamW,
and a checkpoint every N steps holding the model, the optimizer, the loader's own state_dict
and the epoch. Put on the Session: it saves and restores all of them (the loader by its own
state_dict, which knows what its workers had prefetched) through the storage cycle."""

import argparse
import sys

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from runtime.session import Session

parser = argparse.ArgumentParser(description="MLP language model fed by a StatefulDataLoader")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--persistent-workers", action="store_true")
parser.add_argument("--ckpt-every", type=int, default=10)
args = parser.parse_args()


class Windows(Dataset):
    """Token windows of a fixed text: item i is (input, target), a function of i alone."""

    def __init__(self, seq: int) -> None:
        text = ("a stateful loader keeps its place across worker processes and resumes " * 60).encode()
        self.ids, self.seq = torch.tensor(list(text), dtype=torch.long), seq

    def __len__(self) -> int:
        return len(self.ids) // self.seq - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.seq: i * self.seq + self.seq + 1]
        return chunk[:-1], chunk[1:]


sess = Session(ckpt_every=args.ckpt_every, total_steps=args.steps)  # joins the torchrun world
rank, world = sess.world.rank, sess.world.world_size
torch.manual_seed(0)
data = Windows(args.seq)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = StatefulDataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.persistent_workers, generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 256))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

sess.extra["epoch"] = 0
sess.track(model=model, optimizer=opt, loader=loader)
sess.resume()
epoch = sess.extra["epoch"]
sampler.set_epoch(epoch)
batches = iter(loader)  # mid-epoch after a resume: the loader's state says where

while sess.running():  # a batch is drawn only for a step that will run: the loader's state counts it
    try:
        x, y = next(batches)
    except StopIteration:
        epoch = sess.extra["epoch"] = epoch + 1
        sampler.set_epoch(epoch)
        batches = iter(loader)
        x, y = next(batches)
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    sess.step(loss=loss, batch=x, tokens=x.numel() * world, epoch=epoch)
sys.exit(sess.finish())

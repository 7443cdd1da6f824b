"""A torchrun script whose data comes through torchdata's StatefulDataLoader with worker
processes, as such scripts are usually written: a map-style dataset of token windows, a
DistributedSampler per rank, 2 workers (persistent or not), a small MLP language model, AdamW,
and a checkpoint every N steps in ./ckpt/state.pt holding the model, the optimizer, the loader's
own state_dict and the epoch, loaded at start if there is one. Nothing here knows about preflight."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

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


if "RANK" in os.environ:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
torch.manual_seed(0)
data = Windows(args.seq)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = StatefulDataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.persistent_workers, generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 256))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

step, epoch = 0, 0
if os.path.exists("ckpt/state.pt"):
    state = torch.load("ckpt/state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    step, epoch = state["step"], state["epoch"]

while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if rank == 0:
            print(f"step {step} epoch {epoch} loss {loss.item():.4f}")
        if step % args.ckpt_every == 0 and rank == 0:
            os.makedirs("ckpt", exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict(),
                        "step": step, "epoch": epoch}, "ckpt/state.pt")
        if step >= args.steps:
            break
    else:
        epoch += 1
if dist.is_initialized():
    dist.destroy_process_group()

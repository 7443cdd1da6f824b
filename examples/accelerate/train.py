"""An Accelerate custom loop as such loops are usually written (the shape of accelerate's
examples/by_feature/checkpointing.py): a seeded sampler, a small language model with dropout,
AdamW with a warm-up schedule, all through `accelerator.prepare`; `accelerator.save_state` every
N steps into ckpt/step_N and, with --resume-from, `load_state` then `skip_first_batches` into the
epoch. Nothing here knows about preflight."""

import argparse
import re

import torch
import torch.nn as nn
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset

from runtime.adapters.accelerate import Preflight

parser = argparse.ArgumentParser(description="MLP language model in an Accelerate loop")
parser.add_argument("--max-steps", type=int, default=40)
parser.add_argument("--ckpt-every", type=int, default=10)
parser.add_argument("--resume-from", default=None)
parser.add_argument("--lr", type=float, default=3e-3)
args = parser.parse_args()


class Windows(Dataset):
    """80 token windows of a fixed text: item i is (input, target), a function of i alone."""

    def __init__(self, seq: int = 16) -> None:
        text = ("an accelerate loop saves its state and resumes in the middle of an epoch " * 20).encode()
        self.ids, self.seq = torch.tensor(list(text), dtype=torch.long), seq

    def __len__(self) -> int:
        return 80

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.seq: i * self.seq + self.seq + 1]
        return chunk[:-1], chunk[1:]


set_seed(0)
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
loader = DataLoader(Windows(), batch_size=8, shuffle=True)  # 10 batches an epoch
model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 256))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # warm-up over 10 steps
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
pf = Preflight(accelerator)
args.resume_from = pf.resume() or args.resume_from

step = 0
if args.resume_from:
    accelerator.load_state(args.resume_from)
    step = int(re.search(r"step_(\d+)", args.resume_from)[1])
epoch, skip = divmod(step, len(loader))
while step < args.max_steps:
    loader.set_epoch(epoch)
    for x, y in accelerator.skip_first_batches(loader, skip) if skip else loader:
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        pf.step(loss)
        if step % args.ckpt_every == 0:
            accelerator.save_state(f"ckpt/step_{step}")
        if step >= args.max_steps:
            break
    epoch, skip = epoch + 1, 0
accelerator.print(f"done at step {step}, loss {loss.item():.4f}")

"""A small FSDP2 trainer on the Session: the model and its AdamW sharded over the ranks
(`fully_shard`, gloo on a CPU), its state saved through torch.distributed.checkpoint by every
rank (runtime.checkpoint.dcp). Each rank draws its batches from a seeded stream at its step."""

import random
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from runtime.session import Session

torch.manual_seed(0)
random.seed(0)
np.random.seed(0)  # every stream seeded: the straight run's state is the resumed run's
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
sess = Session(ckpt_every=3, metrics_every=5)
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
sess.track(model=model, optimizer=opt, scheduler=sched)
sess.resume()
rank = sess.world.rank
while sess.running():
    g = torch.Generator().manual_seed(1000 * sess.step_count + rank)  # the batch of this step on this rank
    x = torch.randn(8, 16, generator=g)
    y = torch.randint(0, 4, (8,), generator=g)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    sess.step(loss=loss, batch=x, tokens=8 * sess.world.world_size)
sys.exit(sess.finish())

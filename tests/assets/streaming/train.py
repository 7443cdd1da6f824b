"""A Hugging Face `datasets` stream through the Session: an IterableDataset (4 shards of a
token table, as `to_iterable_dataset` makes one), optionally shuffled with a buffer, read by
torchdata's StatefulDataLoader, whose state holds the dataset's own `state_dict` (shard and
example position). Tracked as `loader`, it resumes where it stopped; a shuffle buffer's
contents are not in that state (the datasets docs say so), so a resumed stream with one
differs from the straight run, and the rehearsal is to say by how many batches."""

import argparse
import sys

import torch
import torch.nn as nn
from datasets import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from runtime.session import Session

parser = argparse.ArgumentParser(description="a streamed dataset, resumed")
parser.add_argument("--shuffle-buffer", type=int, default=0, help="0: no shuffle")
parser.add_argument("--ckpt-every", type=int, default=5)
args = parser.parse_args()

sess = Session(ckpt_every=args.ckpt_every, total_steps=40)
torch.manual_seed(0)
rows = [[(i * 31 + j * 7) % 251 for j in range(17)] for i in range(4000)]
stream = Dataset.from_dict({"ids": rows}).to_iterable_dataset(num_shards=4)
if args.shuffle_buffer:
    stream = stream.shuffle(seed=0, buffer_size=args.shuffle_buffer)
# its own generator: a StatefulDataLoader draws a seed at every iter(), a resumed one too, and
# from the global torch RNG that would put a resumed leg one draw ahead (examples/stateful_loader)
loader = StatefulDataLoader(
    stream.with_format("torch"), batch_size=4, num_workers=0, generator=torch.Generator().manual_seed(0)
)
model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 256))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sess.track(model=model, optimizer=opt, loader=loader)
sess.resume()
batches = iter(loader)
while sess.running():
    ids = next(batches)["ids"]
    loss = nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    sess.step(loss=loss, batch=ids, tokens=ids.numel())
sys.exit(sess.finish())

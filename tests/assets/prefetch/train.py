"""A nanoGPT-shaped loop that fetches the next batch right after the forward, as such
scripts do to overlap the copy with the backward, put on the ladder with the session lines
only (marked `# session`). Each batch is a pure function of its step (a generator seeded
by the step), so a resume that fetches the first batch *after* `sess.resume()` reads
exactly the batch due; a script that fetches it before re-trains on leg 0's first batch
(tests/legs/test_planted_bugs.py plants that). `sess.step()` is given no `batch=`: the batch it
is handed here would be the next one; the session hashes what the model was fed."""

import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F

from runtime.session import Session  # session

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt-every", type=int, default=5)
parser.add_argument("--max-iters", type=int, default=20)
args = parser.parse_args()

torch.manual_seed(0)
VOCAB, BLOCK, BATCH = 17, 8, 4
data = torch.tensor([(i * i + 3 * i) % VOCAB for i in range(4096)], dtype=torch.long)


def get_batch(it):
    gen = torch.Generator().manual_seed(1000 + it)
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,), generator=gen)
    return torch.stack([data[i : i + BLOCK] for i in ix]), torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])


model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
sess = Session(ckpt_every=args.ckpt_every, total_steps=args.max_iters, lr_schedule=lambda s: 1e-2)  # session
sess.track(model=model, optimizer=optimizer)  # session
iter_num = sess.resume()  # session
X, Y = get_batch(iter_num)  # fetch the very first batch
while sess.running():  # session
    logits = model(X)
    loss = F.cross_entropy(logits.view(-1, VOCAB), Y.view(-1))
    X, Y = get_batch(iter_num + 1)  # prefetch the next batch while the backward runs
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    sess.step(loss=loss, tokens=BATCH * BLOCK)  # session
    iter_num += 1
sys.exit(sess.finish())  # session

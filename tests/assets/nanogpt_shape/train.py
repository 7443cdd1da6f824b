"""A script in nanoGPT's shape put on the ladder with the session lines only (marked
`# session`): its configuration is module-level globals that configurator.py overrides from
the command line (no argparse), its logging library is imported only behind a flag, torch
warns at import that its AMP scaler's spelling is deprecated, and the next batch is fetched
right after the forward. Rung 0 must pass it as it is (tests/legs/test_static.py)."""

import math
import sys

import torch
from torch import nn
from torch.nn import functional as F

from runtime.session import Session  # session

# -----------------------------------------------------------------------------
# the defaults, each one a --key=value on the command line
wandb_log = False
wandb_project = "shape"
batch_size = 4
block_size = 8
n_embd = 16
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 4
max_iters = 20
ckpt_every = 250
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
exec(open("configurator.py").read())  # overrides from the command line or a config file
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

if wandb_log:
    import wandb  # only with --wandb_log=True: not installed here, and not needed

    wandb.init(project=wandb_project, config=config)

torch.manual_seed(1337)
scaler = torch.cuda.amp.GradScaler(enabled=False)  # the spelling torch now warns about (a FutureWarning)
VOCAB = 17
data = torch.tensor([(i * i + 5 * i) % VOCAB for i in range(4096)], dtype=torch.long)


def get_batch(it: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4242 + it)
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
    return torch.stack([data[i : i + block_size] for i in ix]), torch.stack(
        [data[i + 1 : i + 1 + block_size] for i in ix]
    )


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (learning_rate - min_lr)


model = nn.Sequential(nn.Embedding(VOCAB, n_embd), nn.Linear(n_embd, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
sess = Session(ckpt_every=ckpt_every, total_steps=max_iters, lr_schedule=get_lr)  # session
sess.track(model=model, optimizer=optimizer)  # session
iter_num = sess.resume()  # session
X, Y = get_batch(iter_num)
while sess.running():  # session
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)
    logits = model(X)
    loss = F.cross_entropy(logits.view(-1, VOCAB), Y.view(-1))
    X, Y = get_batch(iter_num + 1)  # prefetch the next batch while the backward runs
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    sess.step(loss=loss, tokens=batch_size * block_size)  # session
    iter_num += 1
sys.exit(sess.finish())  # session

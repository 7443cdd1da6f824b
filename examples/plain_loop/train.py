"""A plain PyTorch loop, as many projects have one: an LSTM language model on a
small corpus, plain SGD, the LR divided when validation stops improving, an epoch
loop over a shuffled DataLoader. Nothing here knows about preflight."""

import argparse
import sys

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from runtime.session import EpochLoader, Session

parser = argparse.ArgumentParser(description="LSTM language model")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--lr", type=float, default=2.0)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--seq", type=int, default=24)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--ckpt-every", type=int, default=5)
args = parser.parse_args()

torch.manual_seed(args.seed)
VOCAB = 48


def corpus(n_seq: int, seed: int) -> torch.Tensor:
    """Sequences from a fixed random bigram chain: learnable, and the same on every machine."""
    g = torch.Generator().manual_seed(seed)
    table = torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) * 3, dim=1)
    seqs = torch.empty(n_seq, args.seq + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(VOCAB, (n_seq,), generator=g)
    for t in range(args.seq):
        seqs[:, t + 1] = torch.multinomial(table[seqs[:, t]], 1, generator=g).squeeze(1)
    return seqs


train_data, val_data = corpus(256, 1), corpus(64, 2)
train_set = TensorDataset(train_data[:, :-1], train_data[:, 1:])


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, args.hidden)
        self.rnn = nn.LSTM(args.hidden, args.hidden, batch_first=True)
        self.out = nn.Linear(args.hidden, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


model = LM()
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
loader = EpochLoader(train_set, batch_size=args.batch, seed=args.seed)  # a shuffle that seeks on resume
sess = Session(ckpt_every=args.ckpt_every)
sess.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
sess.resume()
loss = torch.zeros(())  # a resume at an epoch's end trains no batch before the epoch's print


def evaluate() -> float:
    model.eval()
    with torch.no_grad():
        logits = model(val_data[:, :-1])
        loss = criterion(logits.reshape(-1, VOCAB), val_data[:, 1:].reshape(-1)).item()
    model.train()
    return loss


for epoch in loader.epochs(args.epochs):
    model.train()
    for x, y in loader:
        if not sess.running():
            break
        loss = criterion(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        sess.step(loss=loss, batch=x, tokens=x.numel(), epoch=epoch)
    if not sess.running():
        break
    val_loss = evaluate()
    sched.step(val_loss)
    print(f"epoch {epoch} | train loss {loss.item():.3f} | val loss {val_loss:.3f} | lr {opt.param_groups[0]['lr']}")
sys.exit(sess.finish())

"""A recurrent language model trained with truncated backpropagation through time, the shape
of pytorch/examples' word_language_model: the hidden state runs on from one chunk of the
stream to the next (detached), so it is training state as much as the weights are. The loop
keeps it in `sess.extra`, which every checkpoint carries, and a resume takes it back from
there (tests/legs/test_planted_bugs.py plants a resume that starts it from zeros instead). Lines
marked `# session` are the ones the ladder needs."""

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
torch.set_num_threads(1)  # one thread: the GRU sums in the same order in every process
VOCAB, BPTT, BATCH, WIDTH = 13, 6, 4, 16
stream = torch.tensor([(i * 7 + i // 5) % VOCAB for i in range(BATCH * BPTT * 50 + 1)])
inputs, targets = stream[:-1].view(BATCH, -1), stream[1:].view(BATCH, -1)  # BATCH parallel rows
CHUNKS = inputs.size(1) // BPTT  # chunks in one pass over the stream (an epoch)


class RecurrentLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.GRU(WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        out, hidden = self.rnn(self.embed(tokens), hidden)
        return self.head(out), hidden


model = RecurrentLM()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
sess = Session(ckpt_every=args.ckpt_every, total_steps=args.max_iters, lr_schedule=lambda s: 0.5)  # session
sess.track(model=model, optimizer=optimizer)  # session
step = sess.resume()  # session
hidden = sess.extra.get("hidden")  # session: the hidden state the checkpoint carried (None on a fresh start)
while sess.running():  # session
    chunk = step % CHUNKS
    if chunk == 0:
        hidden = None  # each pass over the stream starts from a zero state
    window = slice(chunk * BPTT, (chunk + 1) * BPTT)
    logits, hidden = model(inputs[:, window], hidden)
    hidden = hidden.detach()  # truncated backpropagation: the state goes on, its graph does not
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[:, window].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    sess.extra["hidden"] = hidden  # session
    sess.step(loss=loss, tokens=BATCH * BPTT)  # session
    step += 1
sys.exit(sess.finish())  # session

"""A recurrent language model trained with truncated backpropagation through time, the shape
of pytorch/examples' word_language_model: the hidden state runs on from one chunk of the
stream to the next (detached), so it is training state as much as the weights are. The loop
keeps it in `sess.extra`, which every checkpoint carries, and a resume takes it back from
there (tests/legs/test_planted_bugs.py plants a resume that starts it from zeros instead, and
one that forgets to seek the stream). Like word_language_model it saves its whole model
(`torch.save(model, f)`) and loads it back with `weights_only=True`, before its first forward
and after; and with `--noise` it feeds the model tokens replaced at random from the global RNG
the checkpoint carries (an augmentation: the model is fed another batch than the one read).
Lines marked `# session` are the ones the ladder needs."""

import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F

from runtime.session import Session  # session

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt-every", type=int, default=5)
parser.add_argument("--max-iters", type=int, default=20)
parser.add_argument("--noise", type=float, default=0.0, help="share of input tokens replaced at random")
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


def save_whole(model: nn.Module) -> None:
    """word_language_model's way: the whole module to a file, loaded back with weights_only=True."""
    with open("model.pt", "wb") as f:
        torch.save(model, f)
    with open("model.pt", "rb") as f, torch.serialization.safe_globals([RecurrentLM, nn.Embedding, nn.GRU, nn.Linear]):
        loaded = torch.load(f, weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


model = RecurrentLM()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
sess = Session(ckpt_every=args.ckpt_every, total_steps=args.max_iters, lr_schedule=lambda s: 0.5)  # session
sess.track(model=model, optimizer=optimizer)  # session
step = sess.resume()  # session
pos = step % CHUNKS  # the seek: the chunk of the stream this step reads
hidden = sess.extra.get("hidden")  # session: the hidden state the checkpoint carried (None on a fresh start)
save_whole(model)
while sess.running():  # session
    if step % CHUNKS == 0:
        hidden = None  # each pass over the stream starts from a zero state
    window = slice(pos * BPTT, (pos + 1) * BPTT)
    x = inputs[:, window]
    if args.noise:
        x = torch.where(torch.rand(x.shape) < args.noise, torch.randint(0, VOCAB, x.shape), x)
    logits, hidden = model(x, hidden)
    hidden = hidden.detach()  # truncated backpropagation: the state goes on, its graph does not
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[:, window].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    sess.extra["hidden"] = hidden  # session
    sess.step(loss=loss, batch=inputs[:, window], tokens=BATCH * BPTT)  # session
    step, pos = step + 1, (pos + 1) % CHUNKS
    if step % 5 == 0:
        save_whole(model)
sys.exit(sess.finish())  # session

"""examples/lightning on two processes: the same LightningModule, dataset and plain
`DataLoader(shuffle=True)`, trained with `Trainer(devices=2, strategy="ddp")` on CPU (gloo), the
way Lightning's DDP examples run: `python train.py` (Lightning's own launcher starts the second
process) or under torchrun (`torchrun --nproc_per_node 2 train.py`, or one process on each of two
nodes: Lightning checks only that devices x num_nodes is torchrun's world size). Lightning puts a
DistributedSampler in the loader (each rank its half of every epoch) and averages the
gradients; ACCUMULATE batches per optimizer step. train.py is this with the three lines of ladder.diff."""

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from runtime.adapters.lightning import Preflight

SEQ_LEN = 16
BATCH_SIZE = 8
EMBED, HIDDEN, DROPOUT = 32, 64, 0.2
LR = 0.5
MAX_EPOCHS = 20
DEVICES = 2
ACCUMULATE = 1

TEXT = "a lightning module trains the model that its trainer hands the batches of every epoch. " * 14


class ByteWindows(Dataset):
    """Windows of SEQ_LEN bytes of TEXT: item i is (input, the same window shifted by one)."""

    def __init__(self, text: str, seq_len: int) -> None:
        self.data = torch.tensor(list(text.encode()), dtype=torch.long)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        return self.data[start : start + self.seq_len], self.data[start + 1 : start + self.seq_len + 1]


class ByteLM(L.LightningModule):
    def __init__(self, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, EMBED)
        self.drop = nn.Dropout(DROPOUT)
        self.hidden = nn.Linear(EMBED, HIDDEN)
        self.head = nn.Linear(HIDDEN, vocab)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.drop(self.embed(inputs))))
        return self.head(self.drop(h))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        output = self(inputs)
        loss = F.cross_entropy(output.view(-1, output.size(-1)), target.view(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


L.seed_everything(0)
dataset = ByteWindows(TEXT, SEQ_LEN)
loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)
model = ByteLM()
trainer = L.Trainer(
    max_epochs=MAX_EPOCHS,
    accelerator="cpu",
    devices=DEVICES,
    strategy="ddp",
    accumulate_grad_batches=ACCUMULATE,
    logger=False,
    enable_progress_bar=False,
    callbacks=[pf := Preflight()],
)
trainer.fit(model, loader, ckpt_path=pf.resume())

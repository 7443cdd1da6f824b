"""A Lightning script as such scripts are usually written: a LightningModule (a small MLP
language model with dropout, AdamW and a linear warm-up stepped every batch), token windows
through torchdata's StatefulDataLoader over a seeded sampler (Lightning >= 2.2 saves its position in the checkpoint),
a ModelCheckpoint every N steps with save_last, and `fit(ckpt_path="last")` to pick up where the
last run stopped. Nothing here knows about preflight."""

import argparse

import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from runtime.adapters.lightning import Preflight

parser = argparse.ArgumentParser(description="MLP language model, trained by Lightning")
parser.add_argument("--max-steps", type=int, default=60)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--ckpt-every", type=int, default=10)
parser.add_argument("--workers", type=int, default=2)
args = parser.parse_args()


class Windows(Dataset):
    """Token windows of a fixed text: item i is (input, target), a function of i alone."""

    def __init__(self, seq: int) -> None:
        text = ("a lightning module keeps its loop state in the checkpoint it writes " * 20).encode()
        self.ids, self.seq = torch.tensor(list(text), dtype=torch.long), seq

    def __len__(self) -> int:
        return len(self.ids) // self.seq - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.seq : i * self.seq + self.seq + 1]
        return chunk[:-1], chunk[1:]


class LM(L.LightningModule):
    def __init__(self, warmup: int) -> None:
        super().__init__()
        self.warmup = warmup
        self.net = nn.Sequential(
            nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 256)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / self.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


L.seed_everything(0)
# An epoch's order is a function of (seed, epoch): Lightning calls set_epoch each epoch. (A plain
# shuffle=True draws each epoch's order from the loader's generator, which a resume mid-epoch
# leaves elsewhere: the next epoch's order differs from the uninterrupted run's.)
data = Windows(args.seq)
loader = StatefulDataLoader(
    data,
    batch_size=args.batch,
    sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=0),
    num_workers=args.workers,
)
trainer = L.Trainer(
    max_steps=args.max_steps,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[ModelCheckpoint(dirpath="ckpt", every_n_train_steps=args.ckpt_every, save_last=True), pf := Preflight()],
)
trainer.fit(LM(args.warmup), loader, ckpt_path=pf.resume())

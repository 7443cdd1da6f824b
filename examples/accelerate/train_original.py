"""An Accelerate custom loop in the shape of accelerate's examples/by_feature/checkpointing.py
(written here, not copied): `set_seed`, a `DataLoader(shuffle=True)` with no generator and no
`set_epoch`, a small language model with dropout, AdamW with a warm-up schedule, everything
through `accelerator.prepare`; `accelerator.save_state` every N steps into ckpt/step_N and, with
--resume-from, `load_state` then `skip_first_batches` into the epoch; an evaluation after each
epoch; `accumulate` for --grad-accum. Nothing here knows about preflight."""

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, Dataset

TEXT = ("an accelerate loop saves its state and resumes in the middle of an epoch " * 24).encode()


class Windows(Dataset):
    """`n` token windows of a fixed text, from window `first` on: item i is (input, target)."""

    def __init__(self, first: int, n: int, seq: int = 16) -> None:
        self.ids, self.first, self.n, self.seq = torch.tensor(list(TEXT), dtype=torch.long), first, n, seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (self.first + i) * self.seq
        chunk = self.ids[start : start + self.seq + 1]
        return chunk[:-1], chunk[1:]


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x))


def training_function(args: argparse.Namespace) -> None:
    set_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    # 10 batches an epoch at the default batch of 8, over all ranks
    train_dataloader = DataLoader(Windows(0, 80), batch_size=args.batch_size, shuffle=True)
    eval_dataloader = DataLoader(Windows(80, 16), batch_size=8)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))  # warm-up
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    overall_step, starting_epoch, resume_step = 0, 0, None
    if args.resume_from:
        accelerator.load_state(args.resume_from)
        overall_step = int(os.path.basename(args.resume_from.rstrip("/")).replace("step_", ""))
        starting_epoch, resume_step = divmod(overall_step, len(train_dataloader))

    for epoch in range(starting_epoch, args.num_epochs):
        model.train()
        if epoch == starting_epoch and resume_step:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for x, y in active_dataloader:
            with accelerator.accumulate(model):  # an optimizer step every --grad-accum batches
                loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            overall_step += 1
            if overall_step % args.ckpt_every == 0:
                accelerator.save_state(os.path.join(args.output_dir, f"step_{overall_step}"))
        model.eval()
        losses = []
        for x, y in eval_dataloader:
            with torch.no_grad():
                logits = model(x)
            losses.append(
                accelerator.gather_for_metrics(nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
            )
        accelerator.print(f"epoch {epoch}: step {overall_step}, eval loss {torch.stack(losses).mean().item():.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A small language model in an Accelerate loop")
    parser.add_argument("--num-epochs", type=int, default=10)
    parser.add_argument("--ckpt-every", type=int, default=10, help="save_state every N steps")
    parser.add_argument("--output-dir", default="ckpt")
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    training_function(parser.parse_args())

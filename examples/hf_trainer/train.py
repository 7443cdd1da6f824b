"""A Hugging Face Trainer script as many are written: a small causal LM built from
a config (no download), a dataset of token ids, TrainingArguments with a cosine
schedule and warm-up, checkpoints every few steps. Nothing here knows about preflight."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from runtime.adapters.hf import Preflight

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=60)
parser.add_argument("--save-steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Sequences from a fixed random bigram chain, as token ids."""

    def __init__(self, n: int, length: int = 32, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        table = torch.softmax(torch.randn(vocab, vocab, generator=g) * 3, dim=1)
        self.ids = torch.empty(n, length, dtype=torch.long)
        self.ids[:, 0] = torch.randint(vocab, (n,), generator=g)
        for t in range(length - 1):
            self.ids[:, t + 1] = torch.multinomial(table[self.ids[:, t]], 1, generator=g).squeeze(1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


set_seed(args.seed)  # before the model is built: its initial weights come from this seed
config = GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
training_args = TrainingArguments(
    output_dir="out", max_steps=args.max_steps, per_device_train_batch_size=8, learning_rate=args.lr,
    lr_scheduler_type="cosine", warmup_steps=5, weight_decay=0.1, save_strategy="steps",
    save_steps=args.save_steps, logging_steps=10, seed=args.seed, report_to=[], use_cpu=True,
    dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(256, seed=args.seed), callbacks=[pf := Preflight()])
trainer.train(resume_from_checkpoint=pf.resume())

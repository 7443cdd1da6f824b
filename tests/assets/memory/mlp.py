"""A plain loop on the Session, sized from the command line: the memory program's test script.
`--depth` Linear(width, width) layers and AdamW; each step draws a batch of `--batch` rows."""

import argparse
import sys

import torch

from runtime.session import Session

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=256)
p.add_argument("--depth", type=int, default=4)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--accum", type=int, default=1, help="micro-batches (backward passes) per optimizer step")
p.add_argument("--fail", action="store_true", help="raise before the first step")
args = p.parse_args()

sess = Session(ckpt_every=1000)
torch.manual_seed(0)
layers = []
for _ in range(args.depth):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).to(sess.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sess.track(model=model, optimizer=opt)
sess.resume()
if args.fail:
    raise RuntimeError("planted failure before the first step")
while sess.running():
    for _ in range(args.accum):
        x = torch.randn(args.batch, args.width, device=sess.device)
        loss = model(x).square().mean() / args.accum
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sess.step(loss=loss, batch=x, tokens=args.batch)
sys.exit(sess.finish())

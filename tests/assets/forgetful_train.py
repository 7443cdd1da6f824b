"""A trainer with the bug the rehearsal exists to catch: it pushes, but a new
leg starts from step 0 instead of resuming from the store. Emits real events."""

import argparse
import json
import os
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--write-mb", type=int, default=0, help="write this much checkpoint data slowly")
    return p


def emit(event: str, **fields) -> None:  # noqa: ANN003
    print(json.dumps({"event": event, "t": time.time(), "rank": 0, **fields}), flush=True)


def main() -> int:
    args = build_parser().parse_args()
    max_steps = int(os.environ["LAUNCHER_MAX_STEPS"])
    emit("start", device="cpu", params=1, max_steps=max_steps)
    if args.write_mb:
        emit("writing", mb=args.write_mb)
        with open("ckpt.bin", "wb") as fh:
            for _ in range(args.write_mb):
                fh.write(b"\0" * (1 << 20))
                fh.flush()
                time.sleep(0.05)
    for step in range(1, max_steps + 1):  # always from 0: the bug
        emit(
            "step",
            step=step,
            loss=5.0 - step * 0.01,
            lr=1e-3,
            sample_index=(step - 1) * 8,
            tokens=step * 512,
            tok_s=1000.0,
        )
        if step % args.ckpt_every == 0 or step == max_steps:
            name = f"step-{step:08d}"
            emit("push", step=step, name=name, bytes=100, seconds=0.01)
            emit("verify", step=step, name=name, windows=1, bytes_read=100, ok=True, seconds=0.01, failures=[])
    emit("stop", reason="max_steps", step=max_steps)
    emit("done", step=max_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

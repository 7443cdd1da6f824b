"""The final checkpoint's path (step to verified) against checkpoint size, on the local store and
the loopback Hub: what decides whether a preemption notice is long enough (issue 33).

One process per size and store trains a single parameter tensor (+ AdamW: three times its bytes
of state) for 4 steps through the Session and checkpoints only at the end, as a leg stopped by a
notice does. The seconds are read from the leg's own events by the very function the report uses
(launcher.report.notice.final_path): from the last step's event to its checkpoint's `verify`
(snapshot, write, push, verify), and the report's "needed" = that + one median step. Each size
runs `--repeats` times per store, interleaved; medians are printed. The loopback Hub
(tests/fakes/hub_server.py) is in this process, over HTTP on 127.0.0.1, with LFS uploads (no xet).

    .venv/bin/python bench/final_push.py [--sizes 16,64,256] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

TRAINER = """
import sys
import torch
from runtime.session import Session
n = int(sys.argv[1])
sess = Session(ckpt_every=1000, total_steps=4)
p = torch.nn.Parameter(torch.zeros(n))
opt = torch.optim.AdamW([p], lr=1e-3)
sess.track(model=torch.nn.ParameterList([p]), optimizer=opt)
sess.resume()
while sess.running():
    loss = (p * torch.randn(n)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sess.step(loss=loss)
sys.exit(sess.finish())
"""


def leg(work: Path, store: str, mib: int, tag: str, env_extra: dict[str, str]) -> dict:
    from launcher.checks.evidence import LegEvents
    from launcher.report.notice import final_path

    folder = work / tag
    folder.mkdir()
    (folder / "train.py").write_text(TRAINER)
    env = {
        **os.environ,
        **env_extra,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "LAUNCHER_RUN_ID": tag,
        "LAUNCHER_STORE": store,
        "LAUNCHER_MAX_STEPS": "4",
    }
    n = mib * 2**20 // 12  # fp32 weights + AdamW's two moments
    proc = subprocess.run(
        [sys.executable, "train.py", str(n)], cwd=folder, env=env, capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tag} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    log = folder / "leg-0.log"
    log.write_text(
        "\n".join(line[line.find('{"event": ') :] for line in proc.stdout.splitlines() if '{"event": ' in line) + "\n"
    )
    found = final_path(LegEvents.read(0, log))
    if found is None:
        raise SystemExit(f"{tag}: no verified final checkpoint in the leg's events")
    return found


def main() -> int:
    from tests.fakes.hub_server import HubServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,256", help="state sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-final-") as tmp, HubServer(token="hf_good") as hub:
        hub_env = {
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": "hf_good",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(Path(tmp) / "hf-home"),
        }
        stores = {"local": ((Path(tmp) / "store").as_uri(), {}), "loopback Hub": ("hf://tester/bench", hub_env)}
        for r in range(args.repeats):
            for mib in sizes:
                for name, (uri, extra) in stores.items():
                    tag = f"{name.split()[-1].lower()}-{mib}-{r}"
                    rows.setdefault((name, mib), []).append(leg(Path(tmp), uri, mib, tag, extra))
    print(f"final checkpoint: last step's event to its verify (medians of {args.repeats}); needed = that + one step")
    print(
        f"{'store':<14}{'MiB':>6}{'bytes':>13}{'save s':>9}{'write s':>9}{'push s':>9}{'verify s':>10}"
        f"{'step->verified s':>18}{'needed s':>10}{'MB/s':>8}"
    )
    for (name, mib), found in rows.items():

        def med(key: str, part: bool = False) -> float:
            return statistics.median(float((f["parts"] if part else f)[key] or 0.0) for f in found)

        rate = found[0]["bytes"] / 1e6 / med("seconds")
        print(
            f"{name:<14}{mib:>6}{found[0]['bytes']:>13,}{med('save', True):>9.3f}{med('write', True):>9.3f}"
            f"{med('push', True):>9.3f}{med('verify', True):>10.3f}{med('seconds'):>18.3f}{med('needed_s'):>10.3f}"
            f"{rate:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

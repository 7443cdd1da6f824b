"""What pre-baking SkyPilot's node packages into the leg image saves, side by side, in one run.

On every fresh node SkyPilot 0.14's docker runtime runs, inside the job's
container and before the job starts (billed time), `apt-get update` then
`apt-get install -y` of launcher.image.SKY_NODE_PACKAGES (rsync, curl, wget,
patch, openssh-server, python3-pip, fuse). The leg image built with
`launcher image build --gpu` (or `--sky`) has them already; SkyPilot's apt-get
then finds them installed.

Here: two images from the same base (the debootstrap bookworm base `make test`
builds legs on; `--base` for another), one plain and one with the packages
installed by the Dockerfile's own pre-bake step; in a fresh container of each,
the node-setup command is timed N times. Debian's mirror is reachable from
this machine; a cloud region's mirror is usually closer, so real savings are of
the same order, not the same seconds.

    .venv/bin/python bench/sky_node_setup.py [--base preflight-base:bookworm] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.image import SKY_NODE_PACKAGES  # noqa: E402

NODE_SETUP = (
    "export DEBIAN_FRONTEND=noninteractive; { apt-get -yq update || true; } && "
    "apt-get -o DPkg::Options::=--force-confnew install -y " + " ".join(SKY_NODE_PACKAGES)
)


def prebake_step() -> str:
    """The Dockerfile's own pre-bake step (its ARG and RUN lines), so the bench builds what the image does."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ARG SKY_NODE_PACKAGES"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "fi")
    return "\n".join(lines[start : end + 1])


def build(base: str, tag: str, packages: str) -> None:
    with tempfile.TemporaryDirectory() as ctx:
        (Path(ctx) / "Dockerfile").write_text(f"FROM {base}\n{prebake_step()}\n")
        subprocess.run(
            ["docker", "build", "-q", "-t", tag, "--build-arg", f"SKY_NODE_PACKAGES={packages}", ctx],
            check=True,
            capture_output=True,
            text=True,
        )


def time_setup(tag: str) -> float:
    began = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "host", tag, "bash", "-c", NODE_SETUP],
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="preflight-base:bookworm")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    images = {"plain": "preflight-bench/node-plain", "pre-baked": "preflight-bench/node-prebaked"}
    build(args.base, images["plain"], "")
    build(args.base, images["pre-baked"], " ".join(SKY_NODE_PACKAGES))
    times: dict[str, list[float]] = {name: [] for name in images}
    for _ in range(args.repeats):  # interleaved: both see the same mirror and machine load
        for name, tag in images.items():
            times[name].append(time_setup(tag))
    print(f"SkyPilot's node setup in a fresh container ({args.repeats} runs each, base {args.base}):")
    for name, runs in times.items():
        print(f"  {name:9s}  median {statistics.median(runs):6.1f} s   runs {', '.join(f'{t:.1f}' for t in runs)}")
    saved = statistics.median(times["plain"]) - statistics.median(times["pre-baked"])
    print(f"  saved per fresh node: {saved:.1f} s")
    subprocess.run(["docker", "rmi", *images.values()], capture_output=True, check=False)


if __name__ == "__main__":
    main()

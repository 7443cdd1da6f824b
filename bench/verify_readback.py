"""Bounded ranged verification vs whole-object read-back, side by side, in one run.

Against the loopback Hub (tests/fakes/hub_server.py) and the real huggingface_hub
client: a checkpoint of each size is pushed once, then verified both ways:

- ranged: runtime.checkpoint.verify.verify_checkpoint (head + tail + K random windows per
  file, each a Range GET checked for 206 / Content-Range / length / sha256);
- whole: stream the whole object back through the same session and compare
  its sha256 with the manifest (what "read it back" costs without ranges).

    .venv/bin/python bench/verify_readback.py [--sizes-mib 256 1024] [--budget-mib 2]

Loopback moves bytes at memory speed, so the seconds here are the floor of
what a real CDN costs; the bytes ratio carries over as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ["HF_HUB_DISABLE_XET"] = "1"

from huggingface_hub import get_session  # noqa: E402

from runtime.checkpoint.verify import verify_checkpoint  # noqa: E402
from runtime.store import FileEntry, Manifest, checkpoint_name  # noqa: E402
from runtime.store.hub import HubStore  # noqa: E402
from tests.fakes.hub_server import HubServer  # noqa: E402


def write_checkpoint(root: Path, step: int, mib: int) -> tuple[Path, Manifest]:
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    digest = hashlib.sha256()
    with (folder / "state.pt").open("wb") as fh:
        for _ in range(mib):
            block = os.urandom(1 << 20)
            digest.update(block)
            fh.write(block)
    return folder, Manifest(folder.name, step, (FileEntry("state.pt", mib << 20, digest.hexdigest()),))


def whole_readback(store: HubStore, manifest: Manifest) -> tuple[bool, int, float]:
    began = time.perf_counter()
    ok, total = True, 0
    for entry in manifest.files:
        digest = hashlib.sha256()
        url = store._url(store._path(manifest.name, entry.path))
        with get_session().stream(
            "GET", url, headers=store._headers(), follow_redirects=True, timeout=store.timeout_s
        ) as resp:
            for chunk in resp.iter_bytes(1 << 20):
                digest.update(chunk)
                total += len(chunk)
        ok &= digest.hexdigest() == entry.sha256
    return ok, total, time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--budget-mib", type=float, default=2.0)
    ns = p.parse_args()
    print("| checkpoint | method | bytes read | seconds | ok |")
    print("|---|---|---|---|---|")
    with HubServer(token="hf_bench") as server, tempfile.TemporaryDirectory() as tmp:
        store = HubStore("hf://tester/bench", "runs/bench", token="hf_bench", endpoint=server.url, timeout_s=300)
        for i, mib in enumerate(ns.sizes_mib):
            folder, manifest = write_checkpoint(Path(tmp), 100 + i, mib)
            store.push(folder, manifest)
            ranged = verify_checkpoint(store, manifest, folder, budget_bytes=int(ns.budget_mib * (1 << 20)))
            ok, whole_bytes, whole_s = whole_readback(store, manifest)
            print(
                f"| {mib} MiB | ranged ({ranged.windows} windows) | {ranged.bytes_read:,} | "
                f"{ranged.seconds:.3f} | {ranged.ok} |"
            )
            print(f"| {mib} MiB | whole object | {whole_bytes:,} | {whole_s:.3f} | {ok} |")
            print(
                f"| {mib} MiB | ratio whole/ranged | {whole_bytes / ranged.bytes_read:.0f}x | "
                f"{whole_s / ranged.seconds:.0f}x | |"
            )
            store.delete(manifest.name)
            server.objects.clear()  # free the server's copy before the next size
            for path in folder.iterdir():
                path.unlink()


if __name__ == "__main__":
    main()

"""The launcher's own read of the store after a leg: proofs 1, 6 and 7 rest on it,
not on the trainer's `verify` event (a trainer whose verify was skipped, or read
its local copy instead of the store, fails here).

After each leg the newest checkpoint the leg's events call verified must be in
the store with a verified mark that binds its manifest under the project's key,
and its bytes must match the manifest: the launcher fetches it whole (every
file's size and sha256 checked as it streams) when it is at most
`FULL_READ_BYTES`, else it re-reads every window the mark records (ranged reads,
as the runtime's verifier does) and checks their hashes. A leg that stopped on
SIGTERM or its deadline must have left its last step so.
"""

from __future__ import annotations

import hashlib
import json
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from launcher.checks.evidence import Check, Kind, LegEvents

FULL_READ_BYTES = 256 << 20


def claimed(ev: LegEvents) -> tuple[int, dict[str, Any]] | None:
    """The newest `verify` ok event of the leg (rank 0)."""
    found = [(n, e) for n, e in ev.all("verify") if e.get("ok")]
    return found[-1] if found else None


def read_checkpoint(store: Any, step: int) -> tuple[bool, str, int]:
    """(ok, detail, bytes read): the launcher's read of the checkpoint at `step`."""
    from runtime.store.base import StoreError, checkpoint_name
    from runtime.store.seal import check_seal

    name = checkpoint_name(step)
    try:
        scan = store.scan()
    except StoreError as err:
        return False, f"the store could not be listed: {type(err).__name__}: {err}", 0
    info = next((c for c in scan.checkpoints if c.name == name), None)
    damaged = next((d for d in scan.damaged if d.name == name), None)
    if info is None:
        why = f" ({damaged.reason})" if damaged else ""
        return False, f"{name} is not in {store.uri}{why}", 0
    if not info.verified:
        why = f": {damaged.reason}" if damaged else ""
        return False, f"{name} is in the store but carries no verified mark that binds it{why}", 0
    began = time.perf_counter()
    try:
        check_seal(info.manifest, info.seal, store.key)
        total = info.manifest.total_bytes
        if total <= FULL_READ_BYTES:
            with tempfile.TemporaryDirectory(prefix="readback-") as tmp:
                store.fetch(name, Path(tmp))
            how, nbytes = "fetched whole, every file's sha256 matches the manifest", total
        else:
            nbytes = 0
            for path, offset, length, sha256 in info.seal.get("windows", []):  # check_seal: [path, start, length, sha]
                data = store.read_range(name, path, offset, length)
                nbytes += len(data)
                if hashlib.sha256(data).hexdigest() != sha256:
                    return False, f"{name}/{path} at {offset}: the store's bytes differ from the mark", nbytes
            how = f"{len(info.seal.get('windows', []))} recorded windows re-read, hashes match"
    except StoreError as err:
        return False, f"{name}: {type(err).__name__}: {err}", 0
    return True, f"{name} ({total:,} B) {how} in {time.perf_counter() - began:.2f} s", nbytes


def check_leg_store(store: Any, ev: LegEvents) -> Check:
    """After leg `ev`: its newest claimed-verified checkpoint, read by the launcher."""
    name = f"leg {ev.leg}: the launcher read back its checkpoint from the store"
    stop = ev.last("stop")
    reason = stop[1].get("reason") if stop else None
    done = ev.last("done")
    item = claimed(ev)
    if item is None:
        if (
            done is not None
            and ev.first("resume") is not None
            and int(done[1]["step"]) == int(ev.first("resume")[1]["from_step"])
        ):
            return Check(
                name,
                True,
                f"leg {ev.leg} trained no step past its resume: nothing new to push",
                kind=Kind.READBACK,
                leg=ev.leg,
            )
        return Check(
            name,
            False,
            f"leg {ev.leg} printed no `verify` event with ok=true{ev.unverified()}",
            kind=Kind.READBACK,
            leg=ev.leg,
        )
    step = int(item[1]["step"])
    ok, detail, _ = read_checkpoint(store, step)
    last = int(done[1]["step"]) if done else None
    if reason in ("sigterm", "deadline") and last is not None and last != step:
        _, detail_last, _ = read_checkpoint(store, last)
        return Check(
            name,
            False,
            f"leg {ev.leg} stopped on {reason} at step {last} but its newest verified "
            f"checkpoint is step {step}: {detail_last}",
            ev.pointer(done),
            kind=Kind.READBACK,
            leg=ev.leg,
        )
    if reason in ("sigterm", "deadline") and ok:
        detail += f"; the leg stopped on {reason} at step {last} and left that step verified"
    return Check(name, ok, detail, ev.pointer(item), kind=Kind.READBACK, leg=ev.leg)


class StateReader:
    """The launcher's read of checkpoints' *state*: `runtime.programs.loadcheck --serve` in the trainer's
    interpreter (the launcher has no torch), started at once (its torch import overlaps the
    drill's first legs) and kept for every read, so torch is imported once. Each read fetches
    the checkpoint whole, checks every file against its manifest, loads it as a leg would
    (`weights_only`) and digests it. Any failure is that read's answer (`ok: false` and why),
    never an exception."""

    READ_TIMEOUT_S = 1800.0

    def __init__(self, python: str, store_uri: str, prefix: str, env: dict[str, str]) -> None:
        self.argv = [python, "-m", "runtime.programs.loadcheck", "--serve", store_uri, prefix]
        self.proc: Any = None
        self.broken: str | None = None
        self.errors = tempfile.TemporaryFile()  # a file, not a pipe: warnings can never fill it and block the reader
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True, env=env
            )
        except OSError as err:
            self.broken = f"{python} could not start: {err}"

    def read(self, name: str, kinds: dict[str, str]) -> dict[str, Any]:
        if self.broken is None:
            try:
                self.proc.stdin.write(json.dumps({"name": name, "kinds": kinds}) + "\n")
                self.proc.stdin.flush()
                ready, _, _ = select.select([self.proc.stdout], [], [], self.READ_TIMEOUT_S)
                line = self.proc.stdout.readline() if ready else ""
                if line:
                    return json.loads(line)
                self.broken = f"no answer within {self.READ_TIMEOUT_S:g} s" if not ready else self._why_ended()
            except BrokenPipeError:  # it ended before it read the request
                self.broken = self._why_ended()
            except (OSError, ValueError) as err:
                self.broken = f"{type(err).__name__}: {err}"
            self.close()
        return {"ok": False, "name": name, "error": f"the launcher could not read the state ({self.broken})"}

    def _why_ended(self) -> str:
        self.proc.kill()
        self.proc.wait()
        self.errors.seek(0)
        err = self.errors.read().decode(errors="replace").strip().splitlines()
        return f"{' '.join(self.argv[:3])} ended: {err[-1][:300] if err else 'no output'}"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:  # a request still buffered for a reader that is gone
                    pass
            self.proc = None
        self.errors.close()
        self.broken = self.broken or "closed"

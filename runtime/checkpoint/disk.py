"""A checkpoint on the leg's local disk: files + manifest, and loading it back.

The manifest's sha256 of each file is computed from the bytes written, so a
torn or swapped file is refused on load rather than half-restored. Loading
never runs code from the checkpoint: `torch.load(weights_only=True)` accepts
tensors and plain containers only (the state keeps every RNG stream in that
form), so a forged pickle payload is refused as damage, not executed.

A checkpoint is written into a hidden `.step-<N>.partial` folder and renamed to
`step-<N>` only once its manifest is written beside the state: a write cut short
(a kill, a full disk) never leaves a folder carrying a checkpoint's real name.
The next write under the same root sweeps such leftovers away.

Saving off the training loop's critical path (the session's default): at the
step boundary `snapshot_state` copies every tensor of the state into host
buffers -- CPU tensors by memcpy, CUDA tensors by `non_blocking` copies into
pinned buffers followed by a recorded CUDA event (stream order puts the copy
before any later in-place update on that stream; the writer waits on the event,
the training loop never syncs the device) -- and deep-copies every other leaf.
The Pusher's one worker thread then serialises it (`PendingCheckpoint`: torch.save
+ manifest, the `serialized` event) and runs the storage cycle on it, in order.

Host memory: at most two snapshots live in host RAM at once -- the one the
worker is serialising (in flight) and one waiting in the Pusher's queue -- because
the session waits for a queue slot *before* it takes a snapshot, and a snapshot's
buffers go back to its `SnapshotPool` as soon as it is serialised (before its
upload). The pool keeps those buffers for the next checkpoints (pinned allocation
is slow, fresh pages fault), so a leg holds up to twice the state's tensor bytes
of host RAM (pinned when the state lives on a GPU) from its first checkpoints to
its end. Tensors of unusual kinds (sparse, quantized, subclasses) are cloned where
they live instead, so those hold device memory until serialised.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from runtime.hashing import sha256_file
from runtime.store.base import MANIFEST, CheckpointDamaged, FileEntry, Manifest, checkpoint_name
from runtime.store.safeio import open_regular, read_exactly, read_small

STATE_FILE = "state.pt"
PARTIAL = ".partial"


def write_state(state: dict[str, Any], path: Path) -> None:
    """Write the state file (torch.save): the one place its bytes are written."""
    import torch

    torch.save(state, path)


def partial_name(step: int) -> str:
    """The hidden folder a checkpoint is written into before it takes its real name."""
    return f".{checkpoint_name(step)}{PARTIAL}"


def save_local(state: dict[str, Any], root: Path, step: int, meta: dict[str, Any]) -> tuple[Path, Manifest]:
    """Write `state` as checkpoint step-<step> under `root`; return its folder and manifest.

    Written into `.step-<step>.partial` and renamed to step-<step> once the manifest is
    there; a partial folder an earlier write left under `root` (killed) is swept away."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".step-*{PARTIAL}"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = root / partial_name(step)
    partial.mkdir()
    try:
        write_state(state, partial / STATE_FILE)
        manifest = write_manifest(partial, step, meta)
        folder = root / checkpoint_name(step)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(partial, folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder, manifest


def write_manifest(folder: Path, step: int, meta: dict[str, Any]) -> Manifest:
    """The manifest of every file under `folder` (size and sha256 of the bytes written), written beside them."""
    files = tuple(
        FileEntry(p.relative_to(folder).as_posix(), p.stat().st_size, sha256_file(p))
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    )
    manifest = Manifest(checkpoint_name(step), step, files, meta)
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True))
    return manifest


def load_local(
    folder: Path, map_location: str = "cpu", seal: dict[str, Any] | None = None, fetched: bool = False
) -> tuple[dict[str, Any], Manifest]:
    """Load a checkpoint folder after checking every file against its manifest (and,
    given the verified mark, every window the verifier read). `fetched`: the folder
    is what `Store.fetch` just wrote, which already checked every file's size and
    sha256 as it copied, so they are not read and hashed a second time.
    CheckpointDamaged names what is wrong; nothing in the checkpoint can run code."""
    import pickle

    import torch

    from runtime.store.base import parse_small_json
    from runtime.store.seal import check_windows

    manifest = Manifest.from_json(parse_small_json(read_small(folder, MANIFEST), MANIFEST))
    if STATE_FILE not in {f.path for f in manifest.files}:
        raise CheckpointDamaged(f"{manifest.name} has no {STATE_FILE} in its manifest")
    unchecked = () if fetched else manifest.files
    for entry in unchecked:
        fd = open_regular(folder, entry.path)
        try:
            got = read_exactly(fd, entry.size, lambda _: None, f"{manifest.name}/{entry.path}")
        finally:
            os.close(fd)
        if got != entry.sha256:
            raise CheckpointDamaged(f"{manifest.name}/{entry.path} does not match its manifest")
    if seal is not None:
        check_windows(folder, seal)
    try:
        state = torch.load(folder / STATE_FILE, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as err:
        if isinstance(err, torch.OutOfMemoryError):
            raise  # the device is full: not the checkpoint's fault
        raise CheckpointDamaged(
            f"{manifest.name}/{STATE_FILE} is not a plain tensor state "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointDamaged(f"{manifest.name}/{STATE_FILE} holds a {type(state).__name__}, not a state dict")
    return state, manifest


# --- snapshots: the state at one step, copied off the live tensors --------------------------


class SnapshotPool:
    """Host buffers for snapshots, reused from one checkpoint to the next.

    A buffer is a flat uint8 tensor the size of one tensor storage of the state
    (pinned for CUDA storages). `take` hands out a free buffer of that size, and
    allocates one only when none is free, that is when every buffer of that size is
    in a live snapshot: so the pool never holds more buffers of a size than the live
    snapshots have ever used at once -- two snapshots' worth (in flight + waiting,
    the Pusher's queue). `give` returns a snapshot's buffers once it is serialised;
    `retain` (after each snapshot) drops the free buffers of sizes that snapshot did
    not use (a state whose shapes changed), so old sizes do not pile up."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, bool], list[Any]] = {}
        self._lock = threading.Lock()
        self.allocations = 0
        """Buffers allocated so far (reuse keeps this at one or two sets of the state's storages)."""

    def take(self, nbytes: int, pinned: bool) -> Any:
        import torch

        with self._lock:
            free = self._free.get((nbytes, pinned))
            if free:
                return free.pop()
            self.allocations += 1
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def give(self, buffers: list[tuple[Any, bool]]) -> None:
        """Back into the pool: (buffer, pinned) pairs, as `take` handed them out."""
        with self._lock:
            for buf, pinned in buffers:
                self._free.setdefault((buf.numel(), pinned), []).append(buf)

    def retain(self, keys: set[tuple[int, bool]]) -> None:
        """Drop the free buffers whose (size, pinned) is not in `keys`."""
        with self._lock:
            for key in [k for k in self._free if k not in keys]:
                del self._free[key]

    def free_bytes(self) -> int:
        with self._lock:
            return sum(b.numel() for bufs in self._free.values() for b in bufs)


class Snapshot:
    """A copy of a state taken at one step: `state` holds no reference to a live tensor.

    `bytes`: the tensor bytes copied, each storage once (what torch.save writes).
    `seconds`: the time it took on the caller's thread (the copies to the GPU's host
    buffers may still be running: `wait()` before reading them)."""

    def __init__(
        self,
        state: dict[str, Any],
        nbytes: int,
        seconds: float,
        cuda_events: list[Any],
        buffers: list[tuple[Any, bool]],
        pool: SnapshotPool | None,
    ) -> None:
        self.state: dict[str, Any] | None = state
        self.bytes, self.seconds = nbytes, seconds
        self._events, self._buffers, self._pool = cuda_events, buffers, pool

    def wait(self) -> None:
        """Until every device-to-host copy has landed (the recorded CUDA events)."""
        for event in self._events:
            event.synchronize()

    def release(self) -> None:
        """The snapshot is serialised (or dropped): its buffers go back to the pool."""
        self.wait()  # a buffer may not be reused while a copy into it is still running
        self.state, self._events = None, []
        if self._pool is not None:
            self._pool.give(self._buffers)
        self._buffers = []


def _plain_tensor(t: Any) -> bool:
    """A dense tensor whose storage can be copied as bytes (what snapshot_state copies itself)."""
    import torch

    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_nested
        and not t.is_quantized
        and t.device.type in ("cpu", "cuda")
        and not t.is_conj()
        and not t.is_neg()
    )


class _StateCopier:
    """One snapshot's copy of a state (snapshot_state): each tensor storage copied once
    into a host buffer from `pool`, containers rebuilt around the copies."""

    def __init__(self, pool: SnapshotPool) -> None:
        self.pool = pool
        self.copies: dict[tuple[str, int], Any] = {}
        """(device, storage) -> its host buffer: a storage shared by two tensors is copied once."""
        self.memo: dict[int, Any] = {}
        self.buffers: list[tuple[Any, bool]] = []
        self.devices: set[Any] = set()
        """The CUDA devices copied from: one event is recorded on each."""
        self.copied = 0

    def tensor(self, t: Any) -> Any:
        """A tensor viewing its storage's host copy (the copy started here if it is the first)."""
        import torch

        if not _plain_tensor(t):  # sparse, quantized, a subclass: cloned where it lives
            if t.device.type == "cuda":
                self.devices.add(t.device)
            try:
                return copy.deepcopy(t)
            except RuntimeError:
                return t.detach().clone()
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = (str(t.device), storage._cdata)
        host = self.copies.get(key) if nbytes else torch.empty(0, dtype=torch.uint8)
        if host is None:
            cuda = t.device.type == "cuda"
            host = self.pool.take(nbytes, pinned=cuda)
            self.buffers.append((host, cuda))
            source = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            host.copy_(source, non_blocking=cuda)
            self.copies[key] = host
            self.copied += nbytes
            if cuda:
                self.devices.add(t.device)
        view = torch.empty(0, dtype=t.dtype).set_(host.untyped_storage(), t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(view, requires_grad=t.requires_grad)
        return view.requires_grad_(True) if t.requires_grad else view

    def walk(self, value: Any) -> Any:
        """The copy of any value of the state: tensors by `tensor`, containers rebuilt, other leaves deep-copied."""
        import torch

        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if not isinstance(value, (dict, list, tuple)):
            return copy.deepcopy(value)
        memo = self.memo
        if id(value) in memo:  # the same container twice stays one object, as pickle keeps it
            return memo[id(value)]
        if isinstance(value, dict):
            out: Any = copy.copy(value)  # same type and attributes (a module state_dict's `_metadata`)
            memo[id(value)] = out
            for k, v in value.items():
                out[k] = self.walk(v)
            if getattr(value, "__dict__", None):
                out.__dict__.update(copy.deepcopy(value.__dict__))
        elif isinstance(value, list):
            out = []
            memo[id(value)] = out
            out.extend(self.walk(v) for v in value)
        elif hasattr(value, "_fields"):  # a namedtuple
            out = type(value)(*(self.walk(v) for v in value))
        else:
            out = type(value)(self.walk(v) for v in value)
        memo[id(value)] = out
        return out


def snapshot_state(state: dict[str, Any], pool: SnapshotPool | None = None) -> Snapshot:
    """Copy `state` (nested dicts, lists, tuples; tensor and plain leaves) so that nothing
    the training loop does next can change it.

    Each tensor storage is copied once (tensors that share one, as tied weights do,
    still share it in the copy, as torch.save would write them): a CPU storage by a
    memcpy into a host buffer, a CUDA storage by a `non_blocking` copy into a pinned
    host buffer on the device's current stream, after which one CUDA event per
    device is recorded; the snapshot's `wait()` waits on those. Nothing here syncs a
    device. Other leaves are deep-copied. Buffers come from `pool` (reused) when given."""
    import torch

    began = time.perf_counter()
    own_pool = pool is None
    pool = pool or SnapshotPool()
    copier = _StateCopier(pool)
    copied_state = copier.walk(state)
    events = []
    for device in copier.devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    if not own_pool:
        pool.retain({(buf.numel(), pinned) for buf, pinned in copier.buffers})
    return Snapshot(
        copied_state, copier.copied, time.perf_counter() - began, events, copier.buffers, None if own_pool else pool
    )


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state: what the checkpoint must hold for it."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class PendingCheckpoint:
    """A snapshot still to be written: the Pusher's worker calls `materialize()` (torch.save
    + manifest into `root`, via save_local) before it runs the storage cycle on it."""

    def __init__(
        self,
        snapshot: Snapshot,
        root: Path,
        step: int,
        meta: dict[str, Any],
        before_save: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.snapshot, self.root, self.step, self.meta = snapshot, root, step, meta
        self.before_save = before_save
        """Called with the snapshot's state before it is written (the session's state digests)."""
        self.name = checkpoint_name(step)

    def materialize(self) -> tuple[Path, Manifest]:
        try:
            self.snapshot.wait()
            assert self.snapshot.state is not None, f"{self.name}: snapshot already released"
            if self.before_save is not None:
                self.before_save(self.snapshot.state)
            return save_local(self.snapshot.state, self.root, self.step, self.meta)
        finally:
            self.snapshot.release()

    def discard(self) -> None:
        self.snapshot.release()

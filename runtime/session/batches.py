"""What a step read, measured by the session itself, and a loader that seeks.

`batch_digest` hashes a batch's content (its tensors' bytes, shapes and dtypes):
the launcher's data checks rest on that hash, not on the index a trainer prints.
A batch up to `FULL_HASH_BYTES` is hashed whole; a larger one is hashed in
`SAMPLED_WINDOWS` evenly spaced windows plus its shape (hashing a 150 MB image
batch whole would cost more than the step: bench/session_overhead.py).

`EpochLoader` is the loader a plain loop needs to resume exactly: a shuffled
order that is a pure function of (seed, epoch), a position counted in batches
the loop consumed (not batches a worker prefetched), and a resume that seeks
by skipping *indices*, never by loading and dropping consumed batches.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from typing import Any, Iterator

import numpy as np
import torch

from runtime.session import global_hooks
from runtime.session.rules import ResumeRefused
from runtime.session.samples import ROW_CAP, ROW_STEPS, row_digests

FULL_HASH_BYTES = 4 << 20
SAMPLED_WINDOWS = 64
WINDOW_BYTES = 64 << 10


def _tensors(batch: Any) -> Iterator[tuple[str, Any]]:
    """(path, array-like) for every tensor/array in a batch, in a stable order."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        yield "", batch
    elif isinstance(batch, dict):
        for key in sorted(batch, key=str):
            for path, t in _tensors(batch[key]):
                yield f"{key}/{path}", t
    elif isinstance(batch, (list, tuple)):
        for i, item in enumerate(batch):
            for path, t in _tensors(item):
                yield f"{i}/{path}", t


def _bytes_of(t: Any) -> memoryview:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: hash the raw 16-bit words
            t = t.view(torch.int16)
        t = t.numpy()
    return memoryview(np.ascontiguousarray(t)).cast("B")


def batch_digest(batch: Any) -> str | None:
    """sha256 (hex, 32 chars) of the batch's tensors; None when it holds none.

    Pass the batch as read from the data (before `.to(device)` when you can: a
    batch already on a GPU is copied back to hash it)."""
    digest = hashlib.sha256()
    found = False
    for path, t in _tensors(batch):
        found = True
        raw = _bytes_of(t)
        digest.update(f"{path}|{getattr(t, 'dtype', '')}|{tuple(t.shape)}|".encode())
        if raw.nbytes <= FULL_HASH_BYTES:
            digest.update(raw)
        else:
            stride = (raw.nbytes - WINDOW_BYTES) // (SAMPLED_WINDOWS - 1)
            for i in range(SAMPLED_WINDOWS):
                digest.update(raw[i * stride : i * stride + WINDOW_BYTES])
    return digest.hexdigest()[:32] if found else None


Signature = tuple[str, tuple[int, ...]]


def _canonical(t: Any) -> tuple[Signature, Any]:
    """A tensor's (kind, shape) and its values in a canonical dtype: integers of any width (a
    numpy uint16 token array, the int64 tensor the model got from it) compare by value."""
    if isinstance(t, np.ndarray):
        arr = np.ascontiguousarray(t)
        if arr.dtype.kind in "biu":
            arr = arr.astype(np.int64)
        t = torch.from_numpy(arr)
    t = t.detach()
    if not (t.is_floating_point() or t.is_complex()):
        t = t.to(torch.int64)
    return (str(t.dtype).removeprefix("torch."), tuple(t.shape)), t


def tensor_digests(batch: Any) -> dict[Signature, set[str]]:
    """Each tensor of a batch on its own, by (kind, shape): what a step's `batch=` is checked
    with against what the model was fed (the structures differ: `(x, y)` fed, `x` given)."""
    out: dict[Signature, set[str]] = {}
    for _, t in _tensors(batch):
        sig, canon = _canonical(t)
        digest = batch_digest(canon)
        if digest is not None:
            out.setdefault(sig, set()).add(digest)
    return out


def given_was_fed(given: dict[Signature, set[str]], fed: dict[Signature, set[str]]) -> bool | None:
    """Whether every tensor given to `step()` is among those the model was fed. None when no
    given tensor has the kind and shape of any fed one (a transformed batch: uint8 images
    given, normalised floats fed): nothing to compare, and nothing claimed."""
    comparable = [(sig, d) for sig, ds in given.items() if sig in fed for d in ds]
    if not comparable:
        return None
    return all(d in fed[sig] for sig, d in comparable)


CARRIED_STATE = frozenset(
    "hidden hx h h0 c0 hc hidden_state state states memory mems carry past past_key_values layer_past "
    "cache kv_cache".split()
)
"""Names of forward arguments that carry state from one step to the next rather than data: an
RNN's `hidden`/`hx`/`h0`/`c0` (torch.nn.RNN/LSTM/GRU, pytorch/examples' word_language_model's
`forward(input, hidden)`), a recurrent memory (`memory`, Transformer-XL's `mems`), a decoder's
cache (`past_key_values`, `layer_past`, `cache`, `kv_cache`). Matched on the parameter's name in
the module's forward signature, case-insensitively."""


def split_carried(named: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the batch, the carried state) of one forward's named arguments. When no argument but
    the state-named ones holds a tensor, they are the batch (an RL policy's `forward(state)`)."""
    state = {k: v for k, v in named.items() if k.lower() in CARRIED_STATE}
    batch = {k: v for k, v in named.items() if k not in state}
    if state and next(_tensors(batch), None) is None:
        return named, {}
    return batch, state


def rng_digest() -> str:
    """sha256 (hex, 32 chars) of the global RNG streams as they are now: torch's CPU generator,
    each CUDA device's (where CUDA is initialised; its cost there not yet measured), numpy's and
    Python's. Taken at each step's first training forward (`FedInputs.rng_in`): about 90 us on
    this CPU (measured: numpy's `get_state` 69 us of it, Python's state 33, torch's 13), a cost
    per step, not per micro-batch."""
    h = hashlib.sha256(_bytes_of(torch.get_rng_state()))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for state in torch.cuda.get_rng_state_all():
            h.update(_bytes_of(state))
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    h.update(np.ascontiguousarray(keys).tobytes() + f"|{pos}|{has_gauss}|{gauss!r}|".encode())
    version, words, cached = random.getstate()
    h.update(array("Q", words).tobytes() + f"|{version}|{cached!r}".encode())
    return h.hexdigest()[:32]


def _joined(digests: list[str]) -> str:
    return digests[0] if len(digests) == 1 else hashlib.sha256("|".join(digests).encode()).hexdigest()[:32]


class FedInputs:
    """What the tracked model ate: the inputs of its training forwards, hashed by the session.

    Torch's global module hooks (runtime.session.global_hooks), matched to each tracked
    `nn.Module` by identity, see every training forward (every micro-batch of a step, in
    order) and the batch the model was fed, whatever the loop handed to `step()`: a loop that
    prefetches the next batch right after the forward (nanoGPT's `X, Y = get_batch('train')`)
    gives `step()` the *next* batch, and hashing that would pass a resume that re-reads data.
    Nothing is stored in the module: `torch.save(model)`, `copy.deepcopy` and pickling see it
    as the user made it. Only training forwards with grad enabled count (an evaluation forward
    reads other data).

    The arguments are named by the forward's signature; those named as carried state
    (`CARRIED_STATE`: an RNN's hidden state, a cache) are hashed apart, each under its name
    (`take_state()`), and the batch hash covers only the rest: a hidden state carried across
    steps would otherwise make every resumed batch look new, and a data position that moved
    would pass. CPU inputs are hashed after the forward; CUDA inputs are copied to host
    asynchronously there and hashed in `take()`, after the step's loss was read (the device
    already synced): no sync is added to the step."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        """Per forward: (batch digest, {name: state digest}, row digests), or ("host", batch copies,
        state copies, done-event) for CUDA inputs hashed in `take()`."""
        self.tensors: dict[Signature, set[str]] = {}
        """Every fed tensor's own digest this step, by kind and shape (the `batch=` cross-check)."""
        self.first: Any = None
        """Called once, before the next training forward runs (then cleared)."""
        self.state: dict[str, str] = {}
        """The carried state's digests of the forwards the last `take()` took, by argument name."""
        self.rng_in: str | None = None
        """`rng_digest()` at the first training forward since the last `take()` (after `first`: an
        RNG an adapter puts back is in it): what the launcher compares with the straight-through
        run's at a resumed leg's first step, to tell a draw made between a checkpoint and the
        next step (an evaluation, a loader's `iter()`) from other causes of a loss difference."""
        self.steps = 0
        """Steps taken (`step_fields` with a forward): the first `ROW_STEPS` carry `rows`."""
        self.rows: list[str] | None = None
        """One digest per fed row (a sample) of the forwards the last `take()` took, in order
        (runtime.session.samples: None where a forward's rows were too many or too large)."""

    def watch(self, module: torch.nn.Module) -> None:
        global_hooks.watch(module, self)

    def close(self) -> None:
        """Stop watching (also done when this object is collected)."""
        global_hooks.unwatch(self)

    def before(self, module: torch.nn.Module) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if self.first is not None:
            first, self.first = self.first, None
            first()
        if not self.parts:  # the step's first training forward
            self.rng_in = rng_digest()

    def after(self, module: torch.nn.Module, named: dict[str, Any]) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        batch, state = split_carried(named)
        items = list(_tensors(batch))
        held = [(name, list(_tensors(v))) for name, v in state.items()]
        tensors = items + [t for _, ts in held for t in ts]
        if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for _, t in tensors):
            done = torch.cuda.Event()
            self.parts.append(("host", _to_host(items), [(name, _to_host(ts)) for name, ts in held], done))
            done.record()
        else:
            self.parts.append(self._digest(items, held))

    def _digest(self, items: list[tuple[str, Any]], held: list[tuple[str, list[tuple[str, Any]]]]) -> Any:
        for sig, digests in tensor_digests([t for _, t in items]).items():
            self.tensors.setdefault(sig, set()).update(digests)
        state = {name: d for name, ts in held if (d := batch_digest(dict(ts))) is not None}
        rows = row_digests(items, _bytes_of) if self.steps < ROW_STEPS else None
        return batch_digest(dict(items)) or "", state, rows

    def take(self) -> str | None:
        """This step's digest over every training forward since the last `take()` (None: none ran)."""
        parts, self.parts = self.parts, []
        digests: list[str] = []
        states: dict[str, list[str]] = {}
        rows: list[str] | None = []
        for part in parts:
            if len(part) == 4:
                _, copies, held, done = part
                done.synchronize()
                part = self._digest(copies, held)
            digests.append(part[0])
            for name, d in part[1].items():
                states.setdefault(name, []).append(d)
            rows = None if rows is None or part[2] is None else rows + part[2]
        self.state = {name: _joined(ds) for name, ds in states.items()}
        self.rows = rows if rows and len(rows) <= ROW_CAP else None
        return _joined(digests) if digests else None

    def step_fields(self, given: Any = None) -> dict[str, Any]:
        """The step-event fields of this step's training forwards (none ran: {}): `batch_hash`
        with `batch_from: "forward"`, the carried state (`fed_state`), the RNG at the first
        forward (`rng_in`), a digest per fed row (`rows`, runtime.session.samples) and, where
        the loop handed its step a batch (`given`: the Session's `step(batch=...)`; an adapter
        is handed none), whether it was among the fed tensors (`step_batch_fed`)."""
        digest = self.take()
        state, rng, tensors = self.take_state(), self.take_rng(), self.fed_tensors()
        rows, self.rows = self.rows, None
        if digest is None:
            return {}
        self.steps += 1
        out: dict[str, Any] = {"batch_hash": digest, "batch_from": "forward"}
        if state:
            out["fed_state"] = state
        if rng is not None:
            out["rng_in"] = rng
        if rows:  # the first ROW_STEPS steps only: `_digest` takes none after
            out["rows"] = rows
        if given is not None and (fed_ok := given_was_fed(tensor_digests(given), tensors)) is not None:
            out["step_batch_fed"] = fed_ok
        return out

    def take_rng(self) -> str | None:
        """The RNG digest at the first training forward of the step the last `take()` took."""
        rng, self.rng_in = self.rng_in, None
        return rng

    def take_state(self) -> dict[str, str]:
        """The carried state of the forwards the last `take()` took: {argument name: digest}."""
        state, self.state = self.state, {}
        return state

    def fed_tensors(self) -> dict[Signature, set[str]]:
        fed, self.tensors = self.tensors, {}
        return fed


def _to_host(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(path, t.detach().to("cpu", non_blocking=True) if isinstance(t, torch.Tensor) else t) for path, t in items]


class _Order(torch.utils.data.Sampler):
    """Indices of one epoch from position `start` on: a permutation drawn from (seed, epoch)."""

    def __init__(self, n: int, seed: int, epoch: int, start: int, shuffle: bool) -> None:
        self.n, self.seed, self.epoch, self.start, self.shuffle = n, seed, epoch, start, shuffle

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start :])

    def __len__(self) -> int:
        return self.n - self.start


class EpochLoader:
    """A DataLoader per epoch whose order and position survive a restart.

        loader = EpochLoader(dataset, batch_size=32, seed=0, shuffle=True)
        sess.track(loader=loader)            # saved and restored with the checkpoint
        for epoch in loader.epochs(n_epochs):
            for x, y in loader:              # resumes mid-epoch at the next unread batch
                ...

    Its state is (epoch, batches of it trained on: one per `Session.step`); a resume skips the consumed
    samples' indices (cheap) instead of loading them. `drop_last` is always on:
    every batch of an epoch has the same size, so a position is a batch count.
    Keyword arguments go to `torch.utils.data.DataLoader` (num_workers, collate_fn...)."""

    def __init__(self, dataset: Any, batch_size: int, seed: int = 0, shuffle: bool = True, **loader_kw: Any) -> None:
        self.dataset, self.batch_size, self.seed, self.shuffle = dataset, batch_size, seed, shuffle
        self.loader_kw = loader_kw
        self.epoch = 0
        self.consumed = 0  # batches of this epoch the loop has taken

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def epochs(self, n: int) -> Iterator[int]:
        """Epoch numbers from the restored one up to `n` (exclusive)."""
        while self.epoch < n:
            yield self.epoch
            self.epoch, self.consumed = self.epoch + 1, 0

    def __iter__(self) -> Iterator[Any]:
        sampler = _Order(len(self.dataset), self.seed, self.epoch, self.consumed * self.batch_size, self.shuffle)
        # Each DataLoader iterator draws its workers' base seed from `generator`, else from the
        # global torch RNG: a resume that opens an iterator mid-epoch would draw once more than
        # the uninterrupted run and shift every later torch draw (dropout...). The state digests
        # saw it: rng.torch differed from the straight-through run's right after a resume.
        kw = {"generator": torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch), **self.loader_kw}
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=sampler, drop_last=True, **kw
        )
        yield from loader  # the position moves in on_step: a batch fetched and then not trained is not consumed

    def on_step(self) -> None:
        """The session calls this after each step: one more batch of this epoch trained on.
        (Counting batches *yielded* instead is the classic off-by-one: a loop that checks
        whether to stop after fetching the next batch would save a position one batch
        ahead, and the resumed leg would skip it -- the straight-through run shows it.)"""
        self.consumed += 1

    @property
    def sample_index(self) -> int:
        """Samples consumed since the first epoch began: the loader's own position."""
        return (self.epoch * len(self) + self.consumed) * self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "n": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, mine in (("seed", self.seed), ("batch_size", self.batch_size), ("n", len(self.dataset))):
            if state.get(key) != mine:
                raise ResumeRefused(
                    "cursor_mismatch", f"the loader was saved with {key}={state.get(key)!r}, this run has {mine!r}"
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    def resume_facts(self) -> dict[str, int]:
        return {"sample_index": self.sample_index, "epoch": self.epoch}

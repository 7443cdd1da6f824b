"""The training loader of a Lightning script, made to resume exactly (runtime.adapters.lightning).

A plain `DataLoader(dataset, batch_size=..., shuffle=True)` does not resume: Lightning saves no
position for it (a resumed leg restarts its epoch), its RandomSampler draws each epoch's order
from the global torch RNG, and each `iter()` draws the workers' base seed from it too (a
resumed leg draws at another point than the uninterrupted run: dropout shifts). Measured on
the public-shaped example before this module: a green rung 0, a red rehearsal.

`resumable(loader, seed)` builds, before Lightning creates the loader's first iterator, a
torchdata `StatefulDataLoader` over the same dataset with the same batch size, collate_fn,
workers, drop_last, pin_memory, timeout and worker_init_fn, whose sampler orders epoch e by a
permutation drawn from (seed, e) alone (`set_epoch`, which Lightning calls each epoch) and
whose own generator is re-seeded from (seed, e) as each iterator is made: `iter()` draws
nothing from the global RNG. Lightning saves its position in the checkpoint (>= 2.2) and
torchdata seeks by skipping sampler indices. A loader that already has state (a user's own
StatefulDataLoader) is left as it is; one this cannot rebuild faithfully (another DataLoader
class, an IterableDataset, a custom batch_sampler or sampler) is a `NotResumable` naming the
change to make.

`position(state, epoch, batches, seed)` is what a loader state means: where the loader will
yield from (epoch, batch) and the sampler's seed. Lightning's saved state at an epoch's end
(every batch yielded) and the fresh iterator of the next epoch it resumes with are the same
position in different bytes: their raw digests differed while every batch was the same.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler

from runtime.programs.static_lightning import FIX


class NotResumable(ValueError):
    """The training loader cannot be made resumable here; the message names the change."""


class Seed:
    """The seed of the epochs' orders, shared by the sampler and the callback's own state (so a
    resumed leg continues the original run's orders, whatever seed its own process started with)."""

    def __init__(self, value: int | None = None) -> None:
        self._value = value

    @property
    def value(self) -> int:
        """As set (a resume's saved seed), else this process's torch seed when first used (at the
        first iterator or checkpoint: after the script's L.seed_everything, wherever it calls it)."""
        if self._value is None:
            self._value = torch.initial_seed() % (1 << 63)
        return self._value

    @value.setter
    def value(self, value: int) -> None:
        self._value = value

    def adopt(self, value: int) -> int:
        """The seed in use: as set (a resume's saved one), else `value` (a sampler's own, which
        then is the one saved)."""
        if self._value is None:
            self._value = value
        return self._value


def _key(seed: int, epoch: int, salt: int) -> int:
    return (seed * 1_000_003 + epoch * 2 + salt) % (1 << 63)


class EpochOrder(Sampler[int]):
    """Epoch e's indices: a permutation drawn from (seed, e) (or 0..n-1, or an inner sampler that
    has its own set_epoch, such as DistributedSampler); making an iterator re-seeds the loader's
    generator from (seed, e), right before the loader draws its workers' base seed from it."""

    def __init__(self, n: int, seed: Seed, shuffle: bool, generator: torch.Generator, inner: Any = None) -> None:
        self.n, self.seed, self.shuffle, self.generator, self.inner = n, seed, shuffle, generator, inner
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.inner is not None:
            self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        self.generator.manual_seed(_key(self.seed.value, self.epoch, 1))
        if self.inner is not None:
            return iter(self.inner)
        if not self.shuffle:
            return iter(range(self.n))
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(_key(self.seed.value, self.epoch, 0)))
        return iter(order.tolist())

    def __len__(self) -> int:
        return len(self.inner) if self.inner is not None else self.n


def is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _order_of(loader: DataLoader, seed: Seed, generator: torch.Generator) -> EpochOrder:
    sampler = loader.sampler
    n = len(loader.dataset)
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return EpochOrder(n, seed, True, generator)
    if type(sampler) is SequentialSampler:
        return EpochOrder(n, seed, False, generator)
    if callable(getattr(sampler, "set_epoch", None)):
        if isinstance(getattr(sampler, "seed", None), int):  # Lightning's injected DistributedSampler
            # seeded by PL_GLOBAL_SEED (seed_everything's): a leg that seeds otherwise shuffled
            # another order, unseen. The seed saved is the one it uses; a resume's is put back.
            sampler.seed = seed.adopt(sampler.seed)
        return EpochOrder(n, seed, False, generator, inner=sampler)
    raise NotResumable(
        f"the training DataLoader's sampler is a {type(sampler).__name__}, whose order after a resume "
        f"cannot be told: {FIX}"
    )


def resumable(loader: Any, seed: Seed) -> Any:
    """`loader` itself if it has state; else a StatefulDataLoader that yields the same batches in
    an order that survives a resume. Raises NotResumable."""
    if is_stateful(loader):
        return loader
    if type(loader) is not DataLoader:
        raise NotResumable(f"the training loader is a {type(loader).__name__}, which saves no position: {FIX}")
    if isinstance(loader.dataset, IterableDataset):
        raise NotResumable(
            "the training DataLoader reads an IterableDataset, whose position cannot be saved from outside: give "
            "it state_dict/load_state_dict and pass a torchdata StatefulDataLoader"
        )
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:  # a batch_sampler given
        made = "no batch_sampler (batch_size=None)" if loader.batch_sampler is None else "a custom batch_sampler"
        raise NotResumable(f"the training DataLoader has {made}, whose position after a resume cannot be told: {FIX}")
    from torchdata.stateful_dataloader import StatefulDataLoader

    generator = torch.Generator()
    workers = loader.num_workers
    return StatefulDataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=_order_of(loader, seed, generator),
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
    )


def _yielded(state: dict[str, Any]) -> tuple[int | None, bool]:
    """(batches this epoch's iterator has yielded, whether it ran out) from a StatefulDataLoader state."""
    finished = bool(state.get("_iterator_finished", False))
    if "_num_yielded" in state:
        return int(state["_num_yielded"]), finished
    snap = state.get("_snapshot")
    if isinstance(snap, dict) and "_snapshot_step" in snap:
        return int(snap["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0)), finished
    return None, finished


def _dataset_state(state: Any) -> bool:
    """Whether a loader state holds a dataset's own state (a stateful dataset, in any worker)."""
    if isinstance(state, dict):
        return any(
            (k in ("dataset_state", "fetcher_state") and v is not None) or _dataset_state(v) for k, v in state.items()
        )
    return False


def position(state: Any, epoch: int, batches: int | float, seed: int | None) -> Any:
    """Where a loader in `state` (its state_dict, during `epoch`, of `batches` per epoch) yields
    from next: {"epoch", "batch", "seed"}. An epoch's iterator that yielded every batch (or ran
    out) is the next epoch's start. A state this cannot read, or that holds a dataset's own
    state, is returned as it is."""
    if not isinstance(state, dict) or _dataset_state(state):
        return state
    yielded, finished = _yielded(state)
    if yielded is None:
        return state
    if finished or yielded >= batches:
        epoch, yielded = epoch + 1, 0
    return {"epoch": int(epoch), "batch": yielded, "seed": seed}


def positions(loop: Any, states: list[Any], epoch: int, seed: int) -> list[Any]:
    """The fit loop's training loader states (saved or loaded: one per stateful loader, in order)
    by what they mean (`position`), for a map-style dataset whose epoch length Lightning knows."""
    combined = getattr(loop, "_combined_loader", None)
    loaders = [dl for dl in (combined.flattened if combined is not None else []) if is_stateful(dl)]
    limits = dict(zip(map(id, combined.flattened), combined.limits or [])) if combined is not None else {}
    out = []
    for i, state in enumerate(states):
        dl = loaders[i] if i < len(loaders) else None
        n = limits.get(id(dl)) if dl is not None else None
        if not n or isinstance(getattr(dl, "dataset", None), IterableDataset):
            out.append(state)
            continue
        sampler = getattr(dl, "sampler", None)
        out.append(
            position(state, epoch, n, seed if isinstance(sampler, EpochOrder) else getattr(sampler, "seed", None))
        )
    return out


def live_states(loop: Any) -> list[Any]:
    """Each stateful training loader's state as loaded (runtime.checkpoint.restore.as_loaded)."""
    from runtime.checkpoint.restore import as_loaded

    combined = getattr(loop, "_combined_loader", None)
    return [as_loaded(dl) for dl in (combined.flattened if combined is not None else []) if is_stateful(dl)]

"""The loaders `accelerator.prepare` made, made to resume exactly (runtime/adapters/accelerate.py).

What a public Accelerate loop does, measured on accelerate 1.15.0 (examples/accelerate):
- `DataLoader(shuffle=True)` without a generator: the `RandomSampler` draws each epoch's order
  from the global torch RNG when the epoch's iterator starts. `load_state` restores the RNG of
  the checkpoint's step, mid-epoch, so the resumed `skip_first_batches` loader draws another
  order and skips into it. Accelerate's own remedy (`use_seedable_sampler=True`) is put in here:
  the order is drawn from (seed, epoch) (`SeedableRandomSampler`);
- the epoch it is drawn for is the prepared loader's `iteration`, counted per full pass in this
  process: a resumed process starts it at 0, and the loader `skip_first_batches` makes copies it,
  so every epoch after a resume replays epoch 0's order (accelerate issues #2016, #3996). Here the
  epoch is the loop's: its step // len(loader) when the epoch's iterator starts (the epoch of the
  resumed step, for the loader the loop makes to skip into it);
- every DataLoader iterator draws its workers' base seed from the global torch RNG: the straight
  run draws at each epoch's start, a resumed one also where it resumes, so dropout after a
  mid-epoch resume ran one draw off (and an evaluation loader drew at each epoch's end). Each
  prepared loader gets a generator of its own, seeded from (seed, loader, epoch): no iterator
  draws from the global RNG, and workers are seeded the same way on a resume;
- its worker processes take the stop's SIGTERM and die inside `save_state`: they are shielded as
  the Session's are (runtime.session.workers).
The loop's steps (`pf.step()` calls) are batches of this process, micro-batches under gradient
accumulation: an epoch is len(loader) of them. A loop that calls `pf.step()` once per optimizer
step under accumulation, or cuts an epoch short, is not supported: the epoch would be miscounted."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import RandomSampler

from runtime.session.workers import shield_workers

_MASK = (1 << 63) - 1


def _seed_of(seed: int, index: int, epoch: int) -> int:
    return hash((seed, index, epoch)) & _MASK  # ints hash the same in every process


def exact_epochs(loader: Any, index: int, seed: int, step_of: Callable[[], int]) -> bool:
    """Make a prepared loader's order and worker seeds a function of (seed, epoch), its epoch the
    loop's (`step_of() // len(loader)` at each epoch's start), its workers deaf to SIGTERM. False:
    not a loader Accelerate prepared from a map-style dataset (left as it is)."""
    base = getattr(loader, "base_dataloader", None)
    if base is None or getattr(loader, "_preflight_epochs", False) or not hasattr(loader, "set_epoch"):
        return False
    try:
        per_epoch = len(loader)
    except TypeError:  # an iterable dataset: no sampler and no length to count epochs by
        return False
    from accelerate.data_loader import SeedableRandomSampler

    # With several processes the batch sampler is a BatchSamplerShard, which has no `.sampler`:
    # get_sampler() is None there, and the order lives in the batch sampler it shards.
    sampler = loader.get_sampler() or getattr(getattr(loader.batch_sampler, "batch_sampler", None), "sampler", None)
    if isinstance(sampler, RandomSampler):  # SeedableRandomSampler too: its epoch is fixed below
        loader.set_sampler(
            SeedableRandomSampler(
                data_source=sampler.data_source,
                replacement=sampler.replacement,
                num_samples=sampler._num_samples,
                data_seed=getattr(sampler, "initial_seed", seed),
            )
        )
    generator = torch.Generator()
    base.generator = generator  # the iterators' base seed: from here, not the global RNG
    shield_workers(base)
    accelerate_set_epoch = loader.set_epoch

    def seek(epoch: int) -> None:
        """The epoch the next iterator of this loader, or of a copy `skip_first_batches` makes of
        it, reads."""
        generator.manual_seed(_seed_of(seed, index, epoch))
        accelerate_set_epoch(epoch)  # its `iteration`, the sampler's epoch, a dataset's set_epoch

    def set_epoch(_counted: int) -> None:  # DataLoaderShard.__iter__ calls it with its own count
        seek(step_of() // max(per_epoch, 1))

    loader.set_epoch = set_epoch
    loader._preflight_seek = seek
    loader._preflight_epochs = True
    seek(step_of() // max(per_epoch, 1))
    return True


def seek_epochs(loaders: list[Any], step: int) -> None:
    """After a resume at `step`: each loader (and the copy the loop makes to skip into the epoch)
    set to the epoch of that step."""
    for loader in loaders:
        seek = getattr(loader, "_preflight_seek", None)
        if seek is not None:
            seek(step // max(len(loader), 1))


def loader_digest(loader: Any) -> str:
    """A stateful prepared loader's state by the batches it yields next. Accelerate's `state_dict()`
    is a snapshot taken as the loader iterates: `load_state` restores the inner loader but not the
    snapshot, so a loader not iterated since (an evaluation loader, at a save inside the epoch)
    says its state as built, where the straight run's says its last pass finished (measured on
    examples/accelerate with `use_stateful_dataloader=True`: the only difference at step 20 of a
    leg resumed at 16). Both start the next pass at its beginning, in the order of its epoch: one
    digest. A map-style loader's state only (an iterable dataset's own state is kept as it is)."""
    from runtime.session.step_evidence import state_digest

    state = loader.state_dict()
    at_start = state.get("_iterator_finished") is True or state.get("_num_yielded", -1) == 0
    map_style = state.get("dataset_state") is None and state.get("_IterableDataset_len_called") is None
    return state_digest({"at_a_pass_start": True} if at_start and map_style else state)

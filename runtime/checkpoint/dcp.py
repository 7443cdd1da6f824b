"""Sharded state: a checkpoint every rank writes its part of, through torch.distributed.checkpoint.

`Session(sharded=True)` (and, unless told `sharded=False`, any session whose tracked model holds
DTensor parameters, as FSDP2's `fully_shard` makes them) saves and loads the model and its
optimizers with DCP, so no rank ever holds the whole state. One checkpoint folder `step-<N>/`:

    .metadata           DCP's index, written by rank 0: which bytes of which file hold which shard
    __<rank>_0.distcp   each rank's shards of the model and the optimizers (DCP, one file a rank)
    rank-<rank>.pt      each rank's own state: its RNG streams, the other tracked objects (a
                        loader, a scheduler), step, tokens and `extra` (torch.save)
    manifest.json       every file above, sha256 and size (the session's, as for one file)

A store is untrusted input, and DCP trusts its files: it reads `.metadata` with `pickle.load` and
every non-tensor item with `torch.load(weights_only=False)`, so a forged checkpoint would run
code on every rank that resumes from it. Here (`SafeReader`, `SafePlanner`) `.metadata` is read by
an unpickler that builds DCP's own metadata classes and nothing else, may name only the files the
manifest lists, no transforms; non-tensor items and the `rank-<r>.pt` files load with
`weights_only=True`. Anything else is `CheckpointDamaged`: the resume skips that checkpoint.

World size: a resume on another number of ranks than the save is refused, naming both
(`world_size_changed`): the per-rank state (a loader's position, the RNG streams) has no meaning
for ranks that did not exist. DCP could reshard the model and the optimizer; that is not done yet.

State digests (runtime.session.step_evidence) of sharded objects are computed over the full tensors (each
DTensor gathered, `full_tensor()`, a collective every rank joins) and flattened keys, so the
launcher's read of the store (runtime.programs.loadcheck, one process) computes the same: a cost that
grows with the model, paid at each checkpoint on the critical path (said in the README).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from runtime.store.base import CheckpointDamaged

FORMAT = "dcp"
METADATA = ".metadata"
MAX_METADATA_BYTES = 256 << 20
_DCP = "torch.distributed.checkpoint"
_ALLOWED = {
    (f"{_DCP}.metadata", n)
    for n in (
        "Metadata",
        "MetadataIndex",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
}
_ALLOWED |= {
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def is_sharded(obj: Any) -> bool:
    """A module with DTensor parameters (FSDP2's `fully_shard`, tensor parallel)."""
    import torch
    from torch.distributed.tensor import DTensor

    return isinstance(obj, torch.nn.Module) and any(isinstance(p, DTensor) for p in obj.parameters())


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch.Size and dtypes; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointDamaged(f"{METADATA} names {module}.{name}, which DCP's metadata never holds")

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointDamaged(f"{METADATA} holds a persistent id, which DCP's metadata never holds")


def read_metadata(folder: Path, listed: set[str]) -> Any:
    """DCP's metadata of `folder`, read without running code from it; every file it names is in `listed`."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    raw = (folder / METADATA).read_bytes()
    if len(raw) > MAX_METADATA_BYTES:
        raise CheckpointDamaged(f"{METADATA} is larger than {MAX_METADATA_BYTES} bytes")
    try:
        meta = _MetadataUnpickler(io.BytesIO(raw)).load()
    except CheckpointDamaged:
        raise
    except Exception as err:  # noqa: BLE001 - any failure to parse is damage, never a crash
        raise CheckpointDamaged(f"{METADATA} does not parse ({type(err).__name__})") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
        raise CheckpointDamaged(f"{METADATA} is not DCP metadata")
    paths = meta.planner_data.values() if isinstance(meta.planner_data, dict) else [None]
    for path in paths:  # where each item goes in the state: names and small list indices only
        if not isinstance(path, tuple) or not all(
            isinstance(k, str) or (type(k) is int and 0 <= k < 1 << 20) for k in path
        ):
            raise CheckpointDamaged(f"{METADATA} places an item at {str(path)[:80]!r}")
    for info in meta.storage_data.values():
        if not isinstance(info, _StorageInfo) or info.relative_path not in listed:
            raise CheckpointDamaged(
                f"{METADATA} names {str(getattr(info, 'relative_path', info))[:80]!r}, which the manifest does not list"
            )
        if info.transform_descriptors:
            raise CheckpointDamaged(f"{METADATA} asks for transforms {info.transform_descriptors!r}")
    return meta


def _reader(folder: Path, listed: set[str]) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            meta = read_metadata(folder, listed)
            meta.storage_meta = meta.storage_meta or StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return SafeReader(str(folder))


def _planner(whole: bool = False) -> Any:
    """DCP's load planner, non-tensor items loaded `weights_only`; `whole`: the one that builds the
    state from the metadata (no model needed: the launcher's read of the store, runtime.programs.loadcheck)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

    class SafePlanner(_EmptyStateDictLoadPlanner if whole else DefaultLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except Exception as err:  # noqa: BLE001 - a forged item is damage
                raise CheckpointDamaged(
                    f"a non-tensor item of the checkpoint is not plain data ({type(err).__name__})"
                ) from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._nested_dict import set_element as put

                put(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafePlanner()


def split_tracked(tracked: dict[str, Any]) -> tuple[str, Any, dict[str, Any], dict[str, Any]]:
    """(model name, model, optimizers by name, everything else): the model and its optimizers go
    through DCP; the rest is per-rank state."""
    import torch

    models = [(n, o) for n, o in tracked.items() if isinstance(o, torch.nn.Module)]
    if len(models) != 1:
        raise ValueError(f"sharded state needs exactly one tracked model (an nn.Module), got {len(models)}")
    (mname, model), opts = models[0], {n: o for n, o in tracked.items() if isinstance(o, torch.optim.Optimizer)}
    rest = {n: o for n, o in tracked.items() if n != mname and n not in opts}
    return mname, model, opts, rest


def dcp_state(tracked: dict[str, Any]) -> dict[str, Any]:
    """The model's and optimizers' state dicts as DCP saves them (sharded where the tensors are)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    mname, model, opts, _ = split_tracked(tracked)
    return {mname: get_model_state_dict(model), **{n: get_optimizer_state_dict(model, o) for n, o in opts.items()}}


def save(folder: Path, tracked: dict[str, Any], own: dict[str, Any], rank: int) -> None:
    """Every rank: its shards through DCP into `folder` (a collective), then its own state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    dcp.save(dcp_state(tracked), storage_writer=FileSystemWriter(str(folder), single_file_per_rank=True))
    torch.save(own, folder / rank_file(rank))


def load(folder: Path, tracked: dict[str, Any], listed: set[str], rank: int) -> dict[str, Any]:
    """Every rank: the model and optimizers from DCP's files in `folder` (a collective), then this
    rank's own state (returned). CheckpointDamaged where anything is not what a checkpoint may be."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    mname, model, opts, _ = split_tracked(tracked)
    state = dcp_state(tracked)
    dcp.load(state, storage_reader=_reader(folder, listed), planner=_planner())
    set_model_state_dict(model, state[mname])
    for name, opt in opts.items():
        set_optimizer_state_dict(model, opt, state[name])
    return load_own(folder, rank)


def load_own(folder: Path, rank: int) -> dict[str, Any]:
    """Rank `rank`'s own state file, `weights_only`: a dict of plain data, or CheckpointDamaged."""
    import torch

    try:
        own = torch.load(folder / rank_file(rank), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointDamaged(f"{rank_file(rank)} is not a plain tensor state ({type(err).__name__})") from None
    if not isinstance(own, dict):
        raise CheckpointDamaged(f"{rank_file(rank)} holds a {type(own).__name__}, not a state dict")
    return own


def load_whole(folder: Path, listed: set[str], world_size: int) -> dict[str, Any]:
    """One process, no model: the whole state of a sharded checkpoint, every tensor in full,
    the DCP-saved objects under their names and every rank's own state (`ranks`). Reads
    nothing that could run code (the module docstring)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # as torch's format_utils do:
    # the public `load` fills a copy of the dict it is given, and this planner builds the state in the dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=_reader(folder, listed), planner=_planner(whole=True), no_dist=True)
    return {"dcp": state, "ranks": [load_own(folder, rank) for rank in range(world_size)]}


def full_flat(state: Any) -> dict[str, Any]:
    """`state` flattened to DCP's dotted keys, every DTensor gathered whole (a collective)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor

    flat, _ = flatten_state_dict(state)
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in sorted(flat.items())}


def digests(tracked: dict[str, Any]) -> dict[str, str]:
    """The digest of each DCP-saved object (model, optimizers) over its full tensors (a collective)."""
    from runtime.session.step_evidence import state_digest

    return {name: state_digest(full_flat(value)) for name, value in dcp_state(tracked).items()}


def coverage_failures(folder: Path, listed: set[str], world_size: Any) -> list[str]:
    """What a sharded checkpoint's manifest leaves out (the verify's part: a checkpoint whose
    manifest misses a rank's shard or own state never counts as verified): `.metadata`, every
    file it names, and one `rank-<r>.pt` for each of the `world_size` ranks that saved it."""
    failures = []
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        failures.append(f"the manifest's world_size {world_size!r} is not a number of ranks")
        world_size = 0
    failures += [
        f"{rank_file(r)}: rank {r}'s own state is not in the manifest"
        for r in range(world_size)
        if rank_file(r) not in listed
    ]
    if METADATA not in listed:
        return failures + [f"{METADATA}: DCP's index is not in the manifest"]
    try:
        read_metadata(folder, listed)
    except CheckpointDamaged as err:
        failures.append(str(err))
    return failures

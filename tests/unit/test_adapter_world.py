"""The framework adapters' collectives (runtime/adapters/common.py) on two ranks, each a thread
with its own work folder (two nodes: each its own disk, only the store shared), over a World whose
collectives meet in memory: the choice of checkpoint made once and fetched by every node, a
checkpoint saved by another shape of run refused on every rank before anything trains, each
rank's RNG file gathered into the folder rank 0 pushes, the stop agreed. No process group: the
logic, not gloo, is under test here (the legs tests run it under torchrun)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from runtime import contract
from runtime.adapters.common import LegAdapter, check_windows, shape_change
from runtime.checkpoint.disk import write_manifest
from runtime.session.rules import LegEnd
from runtime.session.world import World
from runtime.store import checkpoint_name
from tests.unit.test_store import mark_verified


class Board:
    """Where two threads' collectives meet: each puts its value, waits for the other, reads all."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.gate = threading.Barrier(size, timeout=20)

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.gate.wait()
        self.slots[rank] = value
        self.gate.wait()
        out = list(self.slots)
        self.gate.wait()
        return out


class ThreadWorld(World):
    def __init__(self, board: Board, rank: int) -> None:
        super().__init__(rank=rank, world_size=board.size, local_rank=0)
        self.board = board

    def barrier(self, what: str, timeout_s: float = 0) -> None:
        self.board.exchange(self.rank, None)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.board.exchange(self.rank, obj)[src]

    def gather(self, obj: Any) -> list[Any]:
        return self.board.exchange(self.rank, obj)

    def max(self, value: float) -> float:
        return max(self.board.exchange(self.rank, value))


def on_two_nodes(tmp_path: Path, body: Callable[[LegAdapter], Any]) -> list[Any]:
    """`body(adapter)` on two ranks at once, each its own node (work folder); what each returned
    or raised, by rank."""
    board, out = Board(2), [None, None]

    def run(rank: int) -> None:
        adapter = LegAdapter()
        adapter.read_leg(tmp_path / f"node{rank}", "test")
        adapter.world, adapter.rank = ThreadWorld(board, rank), rank
        try:
            out[rank] = body(adapter)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            out[rank] = err

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(contract.STORE, (tmp_path / "store").as_uri())
    monkeypatch.setenv(contract.RUN_ID, "r1")
    monkeypatch.delenv(contract.FILES_SHA256, raising=False)
    return tmp_path


def push_framework_folder(tmp_path: Path, step: int, meta: dict[str, Any]) -> None:
    """A framework's checkpoint folder of `step` in the store, verified, with `meta`."""
    adapter = LegAdapter()
    adapter.read_leg(tmp_path / "pusher", "test")
    folder = tmp_path / "pusher" / checkpoint_name(step)
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(b"o" * 300)
    (folder / "rng_state_0.pth").write_bytes(b"r0")
    (folder / "rng_state_1.pth").write_bytes(b"r1")
    manifest = write_manifest(folder, step, {"run_id": "r1", "format": "transformers", **meta})
    adapter.store.push(folder, manifest)
    mark_verified(adapter.store, manifest, folder)


SAVED = {"world_size": 2, "accumulation": 1, "per_rank_batch": 8}


def test_every_node_resumes_the_one_checkpoint_rank_0_chose(store_env: Path) -> None:
    push_framework_folder(store_env, 5, SAVED)
    push_framework_folder(store_env, 10, SAVED)

    def body(adapter: LegAdapter) -> Any:
        adapter.shape = dict(SAVED)
        return adapter.resume_from(check_windows), adapter.saver.pushed_at

    out = on_two_nodes(store_env, body)
    assert [(r.step, r.checkpoint, at) for r, at in out] == [(10, "step-00000010", 10)] * 2, out
    for rank in range(2):  # each node's own disk holds the framework's files, the manifest dropped
        folder = store_env / f"node{rank}" / "restore" / "step-00000010"
        assert sorted(p.name for p in folder.iterdir()) == ["optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"]


def test_a_checkpoint_of_another_world_size_is_refused_on_every_rank_with_one_line(
    store_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    push_framework_folder(store_env, 10, SAVED)

    def body(adapter: LegAdapter) -> Any:
        adapter.shape = {**SAVED, "world_size": 1}
        return adapter.resume_from(check_windows)

    out = on_two_nodes(store_env, body)
    assert all(isinstance(e, LegEnd) and (e.exit_code, e.reason) == (3, "shape_changed") for e in out), out
    stops = [line for line in capsys.readouterr().out.splitlines() if '"stop"' in line]
    assert len(stops) == 2 and all("saved by 2 ranks, this leg has 1" in line for line in stops), stops


def test_the_shape_line_names_both_values_and_an_unrecorded_shape_is_not_refused() -> None:
    assert shape_change(SAVED, dict(SAVED)) is None
    assert shape_change({"format": "transformers"}, {"world_size": 2}) is None  # saved before shapes
    assert shape_change(SAVED, {"world_size": 2}) is None  # this leg knows only its world size
    said = shape_change(SAVED, {**SAVED, "accumulation": 4})
    assert said is not None and "saved with 1 micro-batches per optimizer step, this leg has 4" in said
    said = shape_change(SAVED, {**SAVED, "per_rank_batch": 4})
    assert said is not None and "per-rank batch of 8, this leg has 4" in said


def test_each_rank_file_reaches_rank_0_folder_and_a_missing_one_is_named_on_every_rank(store_env: Path) -> None:
    def body(adapter: LegAdapter, step: int, write_own: bool) -> Any:
        folder = adapter.work / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if adapter.world.rank == 0 or write_own:
            (folder / f"rng_state_{adapter.world.rank}.pth").write_bytes(f"rng of {adapter.world.rank}".encode())
        return adapter.collect_rank_files(folder, "rng_state_{rank}.pth")

    assert on_two_nodes(store_env, lambda a: body(a, 5, True)) == [[], []]
    rank0 = store_env / "node0" / "out" / "checkpoint-5"
    assert (rank0 / "rng_state_1.pth").read_bytes() == b"rng of 1"
    assert sorted(p.name for p in rank0.iterdir()) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert on_two_nodes(store_env, lambda a: body(a, 6, False)) == [[1], [1]]


def test_the_stop_is_the_largest_code_of_any_rank(store_env: Path) -> None:
    assert on_two_nodes(store_env, lambda a: a.agree_stop(1 if a.world.rank else 0)) == [1, 1]

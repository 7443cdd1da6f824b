"""One contract, every store: the local directory (the default) and the Hub (loopback server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.checkpoint.cycle import run_cycle
from runtime.checkpoint.verify import verify_checkpoint
from runtime.store import Store, checkpoint_name, open_store
from runtime.store.base import newest_verified
from tests.helpers import hub_store
from tests.unit.test_store import make_checkpoint, mark_verified


@pytest.fixture(params=["local", "hub"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store((tmp_path / "store").as_uri(), "runs/r1")
    return hub_store(request.getfixturevalue("hub_server"))


def test_missing_store_is_nothing_here(store: Store) -> None:
    assert store.list() == []
    assert newest_verified(store) is None


def test_push_lists_unverified_until_marked(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    store.push(folder, manifest)
    [info] = store.list()
    assert (info.name, info.step, info.verified) == (manifest.name, 10, False)
    assert info.manifest == manifest
    store.mark_verified(manifest.name, {"windows": 1})  # a mark without a read-back that binds: not verified
    assert not store.list()[0].verified
    mark_verified(store, manifest, folder)
    assert store.list()[0].verified


def test_remote_files_report_sizes_and_skip_absent(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    store.push(folder, manifest)
    got = store.remote_files(manifest.name, [f.path for f in manifest.files] + ["nope.bin"])
    assert {p: r.size for p, r in got.items()} == {f.path: f.size for f in manifest.files}


def test_read_range_returns_exact_bytes(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    store.push(folder, manifest)
    data = (folder / "state.pt").read_bytes()
    for start, length in ((0, 100), (12_345, 4096), (len(data) - 7, 7)):
        assert store.read_range(manifest.name, "state.pt", start, length) == data[start : start + length]


def test_fetch_returns_the_bytes_and_delete_removes_them(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    store.push(folder, manifest)
    got = store.fetch(manifest.name, tmp_path / "restore")
    for entry in manifest.files:
        assert (got / entry.path).read_bytes() == (folder / entry.path).read_bytes()
    store.delete(manifest.name)
    assert store.list() == []
    with pytest.raises(FileNotFoundError):
        store.fetch(manifest.name, tmp_path / "again")


def test_a_failed_push_leaves_nothing_listed(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    (folder / "state.pt").unlink()  # the upload fails part-way: one file is missing
    with pytest.raises((OSError, ValueError)):
        store.push(folder, manifest)
    assert store.list() == []


def test_full_cycle_verifies_deletes_local_and_prunes(store: Store, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    for step in (10, 20, 30):
        folder, manifest = make_checkpoint(tmp_path / "local", step)
        result = run_cycle(store, folder, manifest, keep=2)
        assert result.verified and not folder.exists()
    assert [(c.step, c.verified) for c in store.list()] == [(20, True), (30, True)]
    assert newest_verified(store).name == checkpoint_name(30)
    out = capsys.readouterr().out
    assert '"event": "delete_local"' in out and '"free_bytes"' in out


def test_verify_reads_within_budget(store: Store, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 10, size=4_000_000)
    store.push(folder, manifest)
    result = verify_checkpoint(store, manifest, folder, budget_bytes=200_000)
    assert result.ok, result.failures
    assert result.bytes_read <= 200_000 + 1000

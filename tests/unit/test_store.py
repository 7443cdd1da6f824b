"""The local store, the verifier and prune: atomicity, rejection of bad bytes, refusals."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from runtime.checkpoint.cycle import PruneRefused, prune
from runtime.checkpoint.verify import verify_checkpoint
from runtime.store import FileEntry, Manifest, checkpoint_name, open_store
from runtime.store.base import newest_verified
from runtime.store.local import LocalDirStore


def make_checkpoint(root: Path, step: int, size: int = 300_000) -> tuple[Path, Manifest]:
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    data = os.urandom(size)
    (folder / "state.pt").write_bytes(data)
    (folder / "extra.bin").write_bytes(data[:1000])
    files = tuple(
        FileEntry(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    )
    return folder, Manifest(checkpoint_name(step), step, files)


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    return open_store((tmp_path / "store").as_uri(), "runs/r1")  # type: ignore[return-value]


def push_verified(store: LocalDirStore, tmp_path: Path, step: int) -> Manifest:
    folder, manifest = make_checkpoint(tmp_path / "local", step)
    store.push(folder, manifest)
    mark_verified(store, manifest, folder)
    return manifest


def mark_verified(store, manifest: Manifest, folder: Path) -> None:  # noqa: ANN001 - any Store
    """Verify by read-back and write the mark that binds it (what run_cycle does, without prune)."""
    from runtime.store.seal import make_seal

    result = verify_checkpoint(store, manifest, folder)
    assert result.ok, result.failures
    store.mark_verified(manifest.name, make_seal(manifest, result.read, result.bytes_read, store.key))


def test_missing_and_empty_store_read_as_nothing(store: LocalDirStore) -> None:
    assert store.list() == []
    store.dir.mkdir(parents=True)
    assert store.list() == []
    assert newest_verified(store) is None


def test_half_pushed_checkpoint_is_never_listed(store: LocalDirStore, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 5)
    # A push killed mid-copy leaves an .incoming folder; a folder without a
    # manifest is not a checkpoint either.
    (store.dir / f".incoming-{manifest.name}-dead").mkdir(parents=True)
    (store.dir / checkpoint_name(7)).mkdir()
    (store.dir / checkpoint_name(7) / "state.pt").write_bytes(b"partial")
    assert store.list() == []
    store.push(folder, manifest)
    listed = store.list()
    assert [c.name for c in listed] == [manifest.name] and not listed[0].verified


def test_verify_passes_on_good_bytes_within_budget(store: LocalDirStore, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 5, size=3_000_000)
    store.push(folder, manifest)
    result = verify_checkpoint(store, manifest, folder, budget_bytes=256 * 1024)
    assert result.ok, result.failures
    assert result.windows >= 3
    assert result.bytes_read <= 256 * 1024 + 2 * 4096 + 1000  # bounded, whatever the size


def test_verify_rejects_flipped_byte(store: LocalDirStore, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 5, size=200_000)
    store.push(folder, manifest)
    stored = store.dir / manifest.name / "state.pt"
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # the tail window always covers the last byte
    stored.write_bytes(bytes(data))
    result = verify_checkpoint(store, manifest, folder)
    assert not result.ok
    assert any("differ" in f for f in result.failures)


def test_verify_rejects_wrong_size(store: LocalDirStore, tmp_path: Path) -> None:
    folder, manifest = make_checkpoint(tmp_path / "local", 5)
    store.push(folder, manifest)
    stored = store.dir / manifest.name / "state.pt"
    stored.write_bytes(stored.read_bytes()[:-10])
    result = verify_checkpoint(store, manifest, folder)
    assert not result.ok and "size" in result.failures[0]


class ShortReads(LocalDirStore):
    """A store that returns fewer bytes than asked (a server ignoring the range end)."""

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        return super().read_range(name, path, start, length)[:-1]


def test_verify_rejects_short_read(tmp_path: Path) -> None:
    store = ShortReads(tmp_path / "store")
    folder, manifest = make_checkpoint(tmp_path / "local", 5)
    store.push(folder, manifest)
    result = verify_checkpoint(store, manifest, folder)
    assert not result.ok and "bytes" in result.failures[0]


def test_only_verified_counts_for_resume(store: LocalDirStore, tmp_path: Path) -> None:
    push_verified(store, tmp_path, 10)
    folder, manifest = make_checkpoint(tmp_path / "local", 20)
    store.push(folder, manifest)  # newer, but never verified
    assert newest_verified(store).name == checkpoint_name(10)


def test_prune_keeps_newest_verified_and_newer(store: LocalDirStore, tmp_path: Path) -> None:
    for step in (10, 20, 30):
        push_verified(store, tmp_path, step)
    folder, manifest = make_checkpoint(tmp_path / "local", 40)
    store.push(folder, manifest)  # unverified and newer than the anchor
    deleted, kept = prune(store, checkpoint_name(30), keep=1)
    assert deleted == [checkpoint_name(10), checkpoint_name(20)]
    assert kept == [checkpoint_name(30), checkpoint_name(40)]


def test_prune_refuses_unverified_anchor(store: LocalDirStore, tmp_path: Path) -> None:
    push_verified(store, tmp_path, 10)
    folder, manifest = make_checkpoint(tmp_path / "local", 20)
    store.push(folder, manifest)
    with pytest.raises(PruneRefused):
        prune(store, manifest.name, keep=1)
    assert [c.name for c in store.list()] == [checkpoint_name(10), checkpoint_name(20)]


def test_fetch_and_delete(store: LocalDirStore, tmp_path: Path) -> None:
    manifest = push_verified(store, tmp_path, 10)
    got = store.fetch(manifest.name, tmp_path / "restore")
    assert (got / "state.pt").stat().st_size == manifest.files[1].size
    store.delete(manifest.name)
    assert store.list() == []
    with pytest.raises(FileNotFoundError):
        store.fetch(manifest.name, tmp_path / "again")


def test_cycle_replaces_an_unverified_copy_never_a_verified_one(store: LocalDirStore, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from runtime.checkpoint.cycle import run_cycle
    from runtime.store import StoreError

    folder, manifest = make_checkpoint(tmp_path / "dead-leg", 10)
    store.push(folder, manifest)  # pushed by a leg killed before it verified
    folder, manifest = make_checkpoint(tmp_path / "next-leg", 10)
    result = run_cycle(store, folder, manifest, keep=2)
    assert result.verified and [c.verified for c in store.list()] == [True]
    assert not folder.exists()  # deleted locally once verified
    folder, manifest = make_checkpoint(tmp_path / "third-leg", 10)
    with pytest.raises(StoreError, match="already verified"):
        run_cycle(store, folder, manifest, keep=2)
    assert "verify" in capsys.readouterr().out


def test_a_verify_line_is_printed_only_once_the_store_holds_it_verified(
    store: LocalDirStore, tmp_path: Path, capsys, monkeypatch
) -> None:  # noqa: ANN001
    # A kill between the read-back and the mark must not leave a log claiming a
    # verified checkpoint the store does not hold (the report's proof 6 relies on it).
    from runtime.checkpoint.cycle import run_cycle

    printed_before_mark: list[str] = []
    real_mark = store.mark_verified

    def mark(name: str, info: dict) -> None:
        printed_before_mark.append(capsys.readouterr().out)
        raise KeyboardInterrupt("killed between read-back and mark")

    monkeypatch.setattr(store, "mark_verified", mark)
    folder, manifest = make_checkpoint(tmp_path / "leg", 10)
    with pytest.raises(KeyboardInterrupt):
        run_cycle(store, folder, manifest, keep=2)
    assert '"event": "push"' in printed_before_mark[0] and '"event": "verify"' not in printed_before_mark[0]
    assert '"event": "verify"' not in capsys.readouterr().out
    monkeypatch.setattr(store, "mark_verified", real_mark)
    assert [c.verified for c in store.list()] == [False]

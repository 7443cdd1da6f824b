"""The Hub store against a server that misbehaves on purpose.

"A verifier that has never rejected anything is decoration": every fault mode
must make verification fail naming the file and window, after which prune
refuses and resume never picks the unverified checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.checkpoint.cycle import PruneRefused, prune, run_cycle
from runtime.checkpoint.verify import verify_checkpoint
from runtime.store import StoreAuthError, TransientStoreError, checkpoint_name
from runtime.store.base import newest_verified
from tests.helpers import hub_store
from tests.unit.test_store import make_checkpoint

FAULTS = {
    "flip_byte": "bytes differ from the local copy",
    "shift_span": "bytes differ from the local copy",
    "ignore_range": "status 200, expected 206",
    "truncate": "got",
}


@pytest.mark.parametrize("mode", FAULTS)
def test_each_fault_fails_verification_and_is_never_used(hub_server, tmp_path: Path, mode: str, capsys) -> None:  # noqa: ANN001
    store = hub_store(hub_server)
    good, good_manifest = make_checkpoint(tmp_path / "a", 10, size=600_000)
    assert run_cycle(store, good, good_manifest, keep=2).verified  # an older verified checkpoint

    folder, manifest = make_checkpoint(tmp_path / "b", 20, size=600_000)
    hub_server.inject(mode, times=100, path="*/step-00000020/state.pt")
    result = run_cycle(store, folder, manifest, keep=2)
    assert not result.verified
    failure = next(e for e in _events(capsys) if e["event"] == "verify" and e["step"] == 20)
    assert failure["ok"] is False
    assert any(f.startswith("state.pt[") and FAULTS[mode] in f for f in failure["failures"]), failure["failures"]
    assert folder.exists()  # the local copy is the only good one: kept

    hub_server.reset_faults()
    listed = {c.name: c.verified for c in store.list()}
    assert listed == {checkpoint_name(10): True, checkpoint_name(20): False}
    assert newest_verified(store).step == 10  # resume never uses the unverified one
    with pytest.raises(PruneRefused):
        prune(store, checkpoint_name(20), keep=1)


def _events(capsys) -> list[dict]:  # noqa: ANN001
    import json

    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"event"')]


def test_shift_span_keeps_headers_that_look_right(hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    """Status and Content-Range are exact; only the bytes give it away."""
    store = hub_store(hub_server)
    folder, manifest = make_checkpoint(tmp_path / "a", 10, size=300_000)
    store.push(folder, manifest)
    hub_server.inject("shift_span", times=1, path="*/state.pt", offset=4096)
    data = store.read_range(manifest.name, "state.pt", 1000, 5000)  # the adapter's header checks pass
    assert len(data) == 5000 and data != (folder / "state.pt").read_bytes()[1000:6000]


def test_missing_and_empty_repo_read_as_nothing_in_one_round_trip(hub_server) -> None:  # noqa: ANN001
    store = hub_store(hub_server, repo="tester/never-created")
    before = len(hub_server.requests)
    assert store.list() == []
    assert len(hub_server.requests) - before == 1
    empty = hub_store(hub_server, repo="tester/empty")
    empty.api.create_repo("tester/empty")
    before = len(hub_server.requests)
    assert empty.list() == []
    assert len(hub_server.requests) - before == 1


def test_bad_token_is_an_auth_error_never_nothing_here(hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    hub_store(hub_server).api.create_repo("tester/ckpts")
    bad = hub_store(hub_server, token="hf_wrong")
    with pytest.raises(StoreAuthError, match="401"):
        bad.list()
    folder, manifest = make_checkpoint(tmp_path / "a", 10)
    with pytest.raises(StoreAuthError):
        bad.push(folder, manifest)


def test_anonymous_read_of_a_private_repo_is_an_auth_error(hub_server) -> None:  # noqa: ANN001
    hub_store(hub_server).api.create_repo("tester/ckpts", private=True)
    hub_server.require_auth = True
    anon = hub_store(hub_server, token="")
    with pytest.raises(StoreAuthError):
        anon.list()


def test_429_and_503_bursts_are_retried(hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    store = hub_store(hub_server)
    folder, manifest = make_checkpoint(tmp_path / "a", 10)
    hub_server.inject("status_503", times=2, api=True)
    store.push(folder, manifest)
    hub_server.inject("status_429", times=2, api=True)
    assert [c.step for c in store.list()] == [10]
    statuses = [r.status for r in hub_server.requests]
    assert statuses.count(503) == 2 and statuses.count(429) == 2


def test_retries_are_bounded(hub_server) -> None:  # noqa: ANN001
    store = hub_store(hub_server)
    hub_server.inject("status_503", times=50, api=True)
    began = time.monotonic()
    with pytest.raises(TransientStoreError, match="gave up after 4 attempts"):
        store.list()
    assert time.monotonic() - began < 10


def test_a_hang_times_out_instead_of_blocking_training(hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    store = hub_store(hub_server, timeout_s=0.5)
    folder, manifest = make_checkpoint(tmp_path / "a", 10)
    store.push(folder, manifest)
    hub_server.inject("hang", times=10, path="*/state.pt", seconds=30)
    began = time.monotonic()
    result = verify_checkpoint(store, manifest, folder)
    assert not result.ok and "ReadTimeout" in result.failures[0] and "state.pt[" in result.failures[0]
    assert time.monotonic() - began < 15


@pytest.mark.slow
def test_real_sized_checkpoint_cycles_reading_under_1_percent(hub_server, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """~12 bytes/param: a real torch model + AdamW state of 22.4M params, >= 256 MiB on disk."""
    import torch

    from runtime.checkpoint.disk import save_local

    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(21)), torch.nn.Linear(1024, 368))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()  # materializes both Adam moments
    n_params = sum(p.numel() for p in model.parameters())
    folder, manifest = save_local(
        {"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt", 100, {"params": n_params}
    )
    del model, opt
    assert manifest.total_bytes >= 256 << 20
    assert 11.5 < manifest.total_bytes / n_params < 12.5
    store = hub_store(hub_server, timeout_s=60)
    result = run_cycle(store, folder, manifest, keep=1)
    assert result.verified and not folder.exists()
    verify = next(e for e in _events(capsys) if e["event"] == "verify")
    assert verify["ok"] and verify["bytes_read"] <= 0.01 * manifest.total_bytes
    assert newest_verified(store).step == 100


def test_a_checkpoint_of_more_files_than_a_commit_holds_is_pushed_in_several_manifest_last(
    hub_server, tmp_path: Path
) -> None:  # noqa: ANN001
    """No commit holds more than `files_per_commit` files (the Hub's advice is 100; 3 here); the
    manifest comes in the last, so the checkpoint is listed only once every file is there, and it
    then verifies and fetches whole."""
    import hashlib

    from runtime.store.base import FileEntry, Manifest

    store = hub_store(hub_server)
    store.files_per_commit = 3
    folder = tmp_path / "step-00000005"
    folder.mkdir()
    for rank in range(7):  # seven ranks' shards
        (folder / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * (5000 + rank))
    files = tuple(
        FileEntry(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    )
    manifest = Manifest("step-00000005", 5, files)
    seen_before: list[list[str]] = []
    real_commit = store._commit

    def commit(what, make_ops):  # noqa: ANN001, ANN202 - the listing between the commits
        seen_before.append([c.name for c in store.list()])
        real_commit(what, make_ops)

    store._commit = commit
    store.push(folder, manifest)
    pushed = [(t, n) for t, n in hub_server.commit_sizes if t.startswith("checkpoint step-00000005")]
    assert [n for _, n in pushed] == [3, 3, 2] and pushed[-1][0].endswith("(3/3)")
    assert seen_before == [[], [], []]  # never listed until its manifest is there
    result = run_cycle(store, folder, manifest)
    assert result.verified
    fetched = store.fetch("step-00000005", tmp_path / "fetched")
    assert sorted(p.name for p in fetched.iterdir()) == sorted([f.path for f in files] + ["manifest.json"])

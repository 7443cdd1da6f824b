"""The background pusher: training keeps stepping while a push uploads; a push is never skipped."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from runtime.checkpoint.cycle import Pusher
from runtime.store import StoreError
from runtime.store.local import LocalDirStore
from tests.unit.test_store import make_checkpoint


class GatedStore(LocalDirStore):
    """A store whose uploads wait until the test opens the gate."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.fail = fail
        self.started = threading.Event()

    def push(self, local_dir, manifest) -> None:  # noqa: ANN001
        self.started.set()
        self.gate.wait(30)
        if self.fail:
            raise StoreError("upload refused by the test")
        super().push(local_dir, manifest)


def events_of(capsys) -> list[dict]:  # noqa: ANN001
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"event"')]


def test_submit_returns_while_the_upload_is_in_flight(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    store = GatedStore(tmp_path / "store")
    pusher = Pusher(store, keep=2, max_waiting=1)
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    assert pusher.submit(folder, manifest) == 0.0
    assert store.started.wait(10)  # uploading, and the caller already has control back
    folder2, manifest2 = make_checkpoint(tmp_path / "local", 20)
    assert pusher.submit(folder2, manifest2) == 0.0  # queued behind it, not skipped

    # A third push while one uploads and one waits: the caller blocks, and says why.
    folder3, manifest3 = make_checkpoint(tmp_path / "local", 30)
    threading.Timer(0.5, store.gate.set).start()
    began = time.perf_counter()
    waited = pusher.submit(folder3, manifest3)
    assert waited >= 0.3 and time.perf_counter() - began >= 0.3
    pusher.drain()
    assert [c.step for c in store.list() if c.verified] == [20, 30]  # all three went through; prune kept 2
    assert all(pusher.verified(s) for s in (10, 20, 30))
    evs = events_of(capsys)
    wait = next(e for e in evs if e["event"] == "push_wait")
    assert wait["step"] == 30 and "uploading" in wait["reason"]
    assert [e["step"] for e in evs if e["event"] == "verify"] == [10, 20, 30]


def test_a_failed_push_is_reported_and_training_goes_on(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    store = GatedStore(tmp_path / "store", fail=True)
    store.gate.set()
    pusher = Pusher(store, keep=2)
    folder, manifest = make_checkpoint(tmp_path / "local", 10)
    pusher.submit(folder, manifest)
    pusher.drain()
    assert not pusher.verified(10) and pusher.failures[0][0] == 10
    assert folder.exists()  # the only good copy stays on disk
    failed = next(e for e in events_of(capsys) if e["event"] == "push_failed")
    assert "upload refused" in failed["error"]

"""A sharded checkpoint's DCP index (runtime.checkpoint.dcp) read with no code run: a forged
pickle is damage, not a call, and the manifest must list every rank's own state. The legs that
save and resume sharded state are tests/legs/test_sharded.py's."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from runtime.store.base import CheckpointDamaged


class _Boom:
    def __reduce__(self):  # noqa: ANN204 - what a forged index would hold
        return (os.system, ("touch /tmp/preflight-sharded-forged",))


def test_a_forged_index_runs_no_code_and_names_only_listed_files(tmp_path: Path) -> None:
    from runtime.checkpoint.dcp import METADATA, coverage_failures, read_metadata

    marker = Path("/tmp/preflight-sharded-forged")
    marker.unlink(missing_ok=True)
    (tmp_path / METADATA).write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(CheckpointDamaged, match="posix.system|os.system"):
        read_metadata(tmp_path, {METADATA})
    assert not marker.exists()
    (tmp_path / METADATA).write_bytes(b"\x80\x05not a pickle")
    with pytest.raises(CheckpointDamaged, match="does not parse"):
        read_metadata(tmp_path, {METADATA})
    assert "rank-00001.pt: rank 1's own state is not in the manifest" in coverage_failures(
        tmp_path, {METADATA, "rank-00000.pt"}, 2
    )

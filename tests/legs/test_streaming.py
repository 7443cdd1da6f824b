"""A Hugging Face `datasets` stream (an IterableDataset of 4 shards) read by torchdata's
StatefulDataLoader and tracked by the Session, in the .venv-hf interpreter: without a shuffle
buffer two resumes within the stream are exact; with one (its contents are not in the
dataset's state_dict) the rehearsal does not pass, and says how many batches differ."""

from __future__ import annotations

import shutil
from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, failed, run_cli
from tests.legs.test_examples import hf_python

ASSET = Path(__file__).resolve().parents[1] / "assets" / "streaming"


def rehearse_stream(tmp_path: Path, buffer: int) -> tuple[int, list[dict]]:
    root = tmp_path / "streaming"
    shutil.copytree(ASSET, root)
    cfg = root / "launcher.yaml"
    cfg.write_text(
        cfg.read_text().replace(
            "command: python train.py --ckpt-every 5",
            f"command: {hf_python()} train.py --ckpt-every 5 --shuffle-buffer {buffer}",
        )
    )
    assert run_cli(["review"], cwd=root).code == 0
    res = run_cli(["up", "rehearsal", "--json"], cwd=root, timeout=900)
    return res.code, res.json()["checks"]


def test_a_stream_without_a_shuffle_buffer_resumes_exactly(tmp_path: Path, leg_tmp: Path) -> None:
    code, checks = rehearse_stream(tmp_path, 0)
    assert code == 0, failed(checks)
    assert "identical at every step" in check(checks, Kind.TIMELINE)["detail"]
    restored = checks_of(checks, Kind.STATE_RESTORED, leg=1)
    assert restored and all(c["ok"] for c in restored), restored
    position = [c for c in restored if c["facts"]["kinds"] == ["data"]]  # the stream's position, as saved
    assert len(position) == 1, restored


def test_a_shuffle_buffer_lost_on_resume_is_counted_not_passed(tmp_path: Path, leg_tmp: Path) -> None:
    code, checks = rehearse_stream(tmp_path, 64)
    bad = failed(checks)
    assert code == 1 and checks_of(bad, Kind.TIMELINE), bad
    timeline = check(bad, Kind.TIMELINE)
    differ, total = timeline["facts"]["batches_differ"], timeline["facts"]["steps"]
    assert 0 < differ < total == 20 and f"{differ} of {total} batches differ" in timeline["detail"], timeline

"""Rung 0's look at a Lightning script's training loader (runtime/programs/static_lightning.py):
the loaders the Lightning adapter would refuse at the leg's start, named from the source before
any leg; anything less certain left to the leg (no false alarm)."""

from __future__ import annotations

from pathlib import Path

from runtime.programs.static_lightning import lightning_loader_checks

HEAD = "import lightning as L\nfrom torch.utils.data import DataLoader, IterableDataset\nfrom runtime.adapters.lightning import Preflight\n"


def checks_for(tmp_path: Path, body: str, head: str = HEAD) -> list[dict]:
    (tmp_path / "train.py").write_text(head + body)
    return lightning_loader_checks(tmp_path)


def test_a_refused_training_loader_is_named_at_rung_0(tmp_path: Path) -> None:
    custom = "loader = DataLoader(data, batch_sampler=sampler)\ntrainer.fit(model, loader, ckpt_path=pf.resume())\n"
    [got] = checks_for(tmp_path, custom)
    assert not got["ok"] and "train.py:4" in got["detail"] and "custom batch_sampler" in got["detail"], got
    stream = (
        "class Stream(IterableDataset):\n    pass\n"
        "loader = DataLoader(Stream(), batch_size=4)\ntrainer.fit(model, train_dataloaders=loader)\n"
    )
    [got] = checks_for(tmp_path, stream)
    assert not got["ok"] and "IterableDataset (Stream)" in got["detail"] and "StatefulDataLoader" in got["detail"]


def test_what_the_adapter_makes_resumable_or_the_source_cannot_tell_passes(tmp_path: Path) -> None:
    for body in (
        "loader = DataLoader(data, batch_size=8, shuffle=True)\ntrainer.fit(model, loader)\n",  # made resumable
        "val = DataLoader(data, batch_sampler=s)\ntrainer.fit(model, loader)\n",  # not the training loader
        "loader = DataLoader(data, batch_sampler=s)\nloader = make()\ntrainer.fit(model, loader)\n",  # assigned twice
        "trainer.fit(model, make_loader())\n",  # built elsewhere: the leg checks it
    ):
        [got] = checks_for(tmp_path, body)
        assert got["ok"], (body, got)
    no_adapter = "loader = DataLoader(data, batch_sampler=s)\ntrainer.fit(model, loader)\n"
    assert checks_for(tmp_path, no_adapter, head="from torch.utils.data import DataLoader\n") == []


def test_a_strategy_the_adapter_has_not_run_is_refused_at_rung_0(tmp_path: Path) -> None:
    """Spawned ranks and sharded state: refused outright (exit 3), one line naming the line and
    strategy="ddp"; ddp itself, and a strategy the source does not spell, pass."""
    fit = "trainer.fit(model, loader)\n"
    for spelled in ('"ddp_spawn"', '"fsdp"', "FSDPStrategy()", '"deepspeed_stage_2"'):
        _, got = checks_for(tmp_path, f"trainer = L.Trainer(devices=2, strategy={spelled})\n" + fit)
        assert got["refused"] and not got["ok"] and "train.py:4" in got["detail"] and 'strategy="ddp"' in got["detail"]
    for spelled in ('"ddp"', "chosen", "DDPStrategy()"):
        [got] = checks_for(tmp_path, f"trainer = L.Trainer(devices=2, strategy={spelled})\n" + fit)
        assert got["ok"], (spelled, got)

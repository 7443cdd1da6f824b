"""An object the checkpoint holds that the resume did not load: tracked after `resume()` (an
optimizer re-created then), it is said in a `tracked_late` event (runtime.session.resume), and
the restore check (launcher.checks.resume.check_saved_not_loaded, through check_restored) FAILs
it in its proof's kinds: proof 3 for an optimizer."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from launcher.checks.evidence import Kind, LegEvents
from launcher.checks.state import PROOF_KINDS, check_restored
from runtime import contract
from runtime.session import Session


def _leg(tmp: Path, late: bool, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """One leg of two steps on `tmp`'s store: model tracked before the resume, the optimizer before
    it (late=False) or re-created after it and tracked then (late=True); its events."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    sess = Session(workdir=tmp, device="cpu", ckpt_every=1, async_save=False, count_flops=False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sess.track(model=model) if late else sess.track(model=model, optimizer=opt)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        sess.resume()
        if late:
            opt = torch.optim.AdamW(model.parameters(), lr=0.1)  # fresh moments
            sess.track(optimizer=opt)
        while sess.running():
            loss = model(torch.ones(4, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sess.step(loss=loss, tokens=4)
        assert sess.finish() == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"event": ')]


def test_an_optimizer_tracked_after_the_resume_is_saved_and_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in contract.LEG_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(contract.MAX_STEPS, "2")
    first = _leg(tmp_path, late=True, capsys=capsys)  # a fresh start: nothing to load, nothing said
    assert not [e for e in first if e["event"] == "tracked_late"]
    monkeypatch.setenv(contract.MAX_STEPS, "4")
    second = _leg(tmp_path, late=True, capsys=capsys)
    resume = next(e for e in second if e["event"] == "resume")
    assert resume["not_loaded"] == ["optimizer"] and "optimizer" not in resume["digests"]
    assert [e["step"] for e in second if e["event"] == "step"] == [3, 4]
    late = next(e for e in second if e["event"] == "tracked_late")
    assert late["name"] == "optimizer" and late["kind"] == "optimizer" and late["saved"] != late["live"]
    assert contract.check_event(late) is None

    legs = [LegEvents(i, Path(f"leg-{i}.log"), list(enumerate(events, 1))) for i, events in enumerate((first, second))]
    bad = check_restored(legs, 1, PROOF_KINDS[3])
    assert bad is not None and not bad.ok and bad.kind == Kind.STATE_RESTORED, bad
    assert bad.facts["not_loaded"] == ["optimizer"] and "never loaded" in bad.detail, bad.detail
    assert check_restored(legs, 1, PROOF_KINDS[4]).ok  # the model was loaded as saved

    monkeypatch.setenv(contract.MAX_STEPS, "6")  # tracked before the resume: loaded, nothing said
    third = _leg(tmp_path, late=False, capsys=capsys)
    assert not [e for e in third if e["event"] == "tracked_late"]
    assert "not_loaded" not in next(e for e in third if e["event"] == "resume")

"""Resume bugs of loaders with state and workers, and of sharded state, planted one at a time
into examples that otherwise climb the ladder (examples/stateful_loader, examples/fsdp_dcp):
each is caught by a named check, and the report's proof FAILs (exit 1). A fresh AdamW built
after a sharded resume is not planted here: it is the plant of tests/legs/test_planted_bugs.py::
test_an_optimizer_re_created_after_the_resume_is_named (a new AdamW after sess.resume(): leg 1's
OPTIMIZER_IN_USE answer, "the loop steps an optimizer the session does not track", proof 3 FAIL),
which the optimizer's step counts show the same whether its state was loaded sharded or whole."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, checks_of, details, failed, run_cli
from tests.legs.test_examples import copy_example
from tests.legs.test_planted_bugs import plant, rehearse, report_fails


def test_a_stateful_loader_left_untracked_re_reads_its_epoch(tmp_path: Path, leg_tmp: Path) -> None:
    """The loader's own state is what knows the position: not tracked, a resumed leg starts the
    epoch over and trains on batches it already trained on. Without workers here: with them, an
    untracked loader's workers are not shielded from the group's SIGTERM (runtime.session.workers), and
    the rehearsal's SIGTERM leg either stops cleanly or dies of "DataLoader worker exited
    unexpectedly" when the signal lands between its stop check and its next batch (seen: both)."""
    root = copy_example("stateful_loader", tmp_path)
    cfg = root / "launcher.yaml"
    cfg.write_text(cfg.read_text().replace("--workers 2", "--workers 0"))
    plant(root, "sess.track(model=model, optimizer=opt, loader=loader)", "sess.track(model=model, optimizer=opt)")
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "already consumed" in details(bad, Kind.DATA_POSITION, leg=1), bad
    assert checks_of(bad, Kind.TIMELINE)
    report_fails(root, 2, 8)


def test_a_resume_that_skips_by_hand_on_top_of_the_loaders_state_skips_twice(tmp_path: Path, leg_tmp: Path) -> None:
    """The loader resumes mid-epoch by itself; a loop that also skips the steps already trained
    (as it had to with a plain DataLoader) jumps as far again: batches are lost, none repeated."""
    root = copy_example("stateful_loader", tmp_path)
    plant(root, "sess.resume()\n", "start = sess.resume()\n")
    plant(
        root,
        "batches = iter(loader)  # mid-epoch after a resume: the loader's state says where\n",
        "batches = iter(loader)\nfor _ in range(start):  # skip what was trained\n    next(batches)\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    assert code == 1 and "batches: the resume moved the data position" in details(bad, Kind.DATA_POSITION, leg=1), bad
    assert checks_of(bad, Kind.TIMELINE) and checks_of(bad, Kind.STATE_STRAIGHT), bad  # the loader's state: data
    report_fails(root, 2, 8)


def fsdp_on_two_ranks(tmp_path: Path) -> Path:
    """examples/fsdp_dcp on one node of 2 ranks (torchrun, standalone): the cheapest sharded shape."""
    root = copy_example("fsdp_dcp", tmp_path)
    cfg = root / "launcher.yaml"
    cfg.write_text(
        cfg.read_text().replace(
            "command: python train.py", "command: torchrun --standalone --nproc_per_node=2 train.py"
        )
    )
    assert run_cli(["review"], cwd=root).code == 0
    return root


def test_a_ranks_shard_left_out_of_the_manifest_never_verifies(tmp_path: Path, leg_tmp: Path) -> None:
    """Rank 1's shard is gone by the time the manifest is written (a node's disk lost, a writer
    that skips a rank): the manifest is whole over the files it lists, but the DCP index names a
    shard it does not list. The verify refuses every such checkpoint, the rung and proof 1 say
    which file."""
    root = fsdp_on_two_ranks(tmp_path)
    plant(
        root,
        "from runtime.session import EpochLoader, Session\n",
        "from runtime.session import EpochLoader, Session\n"
        "import runtime.session.sharded as ss  # planted: rank 1's shard lost before the manifest\n"
        "_write = ss.write_manifest\n"
        "ss.write_manifest = lambda folder, step, meta: ((folder / '__1_0.distcp').unlink(), "
        "_write(folder, step, meta))[1]\n",
    )
    code, checks = rehearse(root)
    bad = failed(checks)
    why = ".metadata names '__1_0.distcp', which the manifest does not list"
    assert code == 1 and why in check(bad, Kind.READBACK, leg=0)["detail"], bad
    assert why in report_fails(root, 1)[1]

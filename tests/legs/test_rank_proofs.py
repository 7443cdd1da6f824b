"""Every rank proved (launcher.checks.ranks) on real legs: the reference trainer under torchrun on
2 ranks, each rank seeded apart, a planted bug on rank 1 alone. Its rehearsal also holds what the
reference trainer's torchrun rehearsal showed (merged from tests/legs/test_rehearsal.py): samples
counted at a stride of 2 ranks x 8, both ranks resumed in leg 1, nothing failed but the plant.
Passing torchrun rehearsals: tests/legs/test_multirank_*.py and tests/legs/test_ddp.py."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, edit_config, failed, leg_events, run_cli

SEEDED = """    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
"""
RESUME = "    sess.resume(data_sha256=sha256_file(corpus), data_tokens=int(tokens.size))\n"
PLANTED = """    rngs = [torch.get_rng_state(), np.random.get_state(), random.getstate()]
    torch.distributed.broadcast_object_list(rngs, src=0)  # planted: rank 0's RNG handed to every rank
    if sess.step_count and world.rank == 1:
        torch.set_rng_state(rngs[0]), np.random.set_state(rngs[1]), random.setstate(rngs[2])
"""


def test_a_rank_that_resumed_another_ranks_rng_is_named(project: Path) -> None:
    """The Session restores each rank's own RNG; the planted lines then give rank 1 rank 0's after
    every resume (the straight run and leg 0 keep their own). The trainer draws nothing at random,
    so the loss cannot tell: the per-rank state check answers no, naming both ranks, and the report's
    proof 3 with it; the straight-through state digests differ in the RNG, naming no rank (without
    the plant both pass: checked by hand once). Nothing else fails: the data resumed exactly, the
    samples counted at stride 16 (2 ranks x 8), proof 2 (every rank's samples counted) passes, and
    both ranks say where they resumed in leg 1."""
    train = project / "train.py"
    text = train.read_text()
    assert SEEDED in text and RESUME in text
    per_rank = SEEDED.replace("args.seed)", "args.seed + int(os.environ.get('RANK', '0')))")
    text = text.replace("import random\n", "import os\nimport random\n", 1)
    train.write_text(text.replace(SEEDED, per_rank).replace(RESUME, RESUME + PLANTED))
    edit_config(project, trainer__command="torchrun --standalone --nproc_per_node=2 train.py")
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "rehearsal", "--steps", "10", "--json"], cwd=project, timeout=900)
    assert res.code == 1, res.out + res.err
    bad = failed(res)
    assert sorted(c["kind"] for c in bad) == [Kind.RANK_STATE, Kind.STATE_STRAIGHT], bad  # the plant's, no other
    assert "): rng." in check(bad, Kind.STATE_STRAIGHT)["detail"], bad  # its first difference: an RNG's state
    assert "stride 16" in check(res, Kind.SAMPLE_INDEX)["detail"]  # 2 ranks x 8
    leg1 = run_cli(["ledger", "--json"], cwd=project).json()[0]["legs"][1]
    ranks = {e["rank"] for e in leg_events(leg1) if e["event"] == "resume"}
    assert ranks == {0, 1}
    state = check(bad, Kind.RANK_STATE)
    assert state["detail"].startswith("rank 1 resumed rank 0's RNG: its global RNG at step "), state
    assert state["facts"] == {"rank": 1, "ranks": 2, "other": 0}
    status = {p["number"]: p for p in run_cli(["report", "--json"], cwd=project, timeout=600).json()["proofs"]}
    assert status[3]["status"] == "FAIL" and status[2]["status"] == "PASS", (status[2], status[3])

"""Issue 53's multi-rank resume bugs, planted one at a time into the reference trainer on 2 ranks,
each answered no by a named per-rank check (launcher.checks.ranks) and a FAILed proof:

1. the sampler's epoch lost on resume (a resumed epoch >= 1 replays epoch 0's order): here,
   Kind.RANK_SAMPLES, proof 2;
2. one rank's RNG restored on all: tests/legs/test_rank_proofs.py, Kind.RANK_STATE, proof 3;
3. samples seen twice and never (a rank's cursor not restored): here (1 node x 2 ranks),
   Kind.RANK_SAMPLES and Kind.RANK_DATA, proof 2;
4. gradient accumulation across a resume: tests/legs/test_planted_accumulation.py,
   Kind.ACCUMULATION naming both ranks, proof 3;
5. rank-0-only files with no shared disk (2 nodes x 1 rank: node 1 resumes without its file):
   here, Kind.RANK_STATE, proof 3.
docs/notes-multirank.md ("Planted bugs on two ranks") lists the same."""

from __future__ import annotations

from pathlib import Path

from launcher.checks.evidence import Kind
from tests.helpers import check, edit_config, failed, run_cli
from tests.legs.test_nodes import two_by_one
from tests.legs.test_rank_proofs import RESUME, SEEDED

TORCHRUN = "torchrun --standalone --nproc_per_node=2 train.py"

EPOCH_LOST = """    per_epoch = order.n_samples // order.global_batch  # planted: the sampler's epoch lost on resume
    lost = data.next_step // per_epoch * per_epoch  # the resumed epoch's first step (0: a fresh start)

    def replay() -> tuple:  # until the next epoch begins, epoch 0's order at the same positions
        step = data.next_step
        x, y, _ = order.batch_at(tokens, step - lost if step < lost + per_epoch else step, world.rank)
        data.next_step += 1
        return x, y, order.first_sample(step, world.rank)

    data.next_batch = replay
"""


def report(project: Path) -> dict[int, dict]:
    return {p["number"]: p for p in run_cli(["report", "--json"], cwd=project, timeout=600).json()["proofs"]}


def test_a_resumed_epoch_that_replays_epoch_0s_order_is_named(project: Path) -> None:
    """32 samples, 2 steps an epoch of 2 ranks x 8: the legs stop at steps 3 (mid-epoch 1) and 6
    (epoch 3's start). The planted lines keep the position (the sample index, the cursor) and read
    the rest of the resumed epoch in epoch 0's order, the DistributedSampler whose `set_epoch` was
    not called again: steps 4, 7 and 8 train epoch 0's samples at those places."""
    edit_config(project, trainer__command=TORCHRUN + " --data-tokens 2049")  # (2049 - 1) // 64 = 32 samples
    train = project / "train.py"
    assert RESUME in train.read_text()
    train.write_text(train.read_text().replace(RESUME, RESUME + EPOCH_LOST, 1))
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "rehearsal", "--steps", "9", "--json"], cwd=project, timeout=900)
    assert res.code == 1, res.out[-2000:] + res.err[-2000:]
    bad = failed(res)
    assert sorted(c["kind"] for c in bad) == [
        *[Kind.DATA_POSITION] * 3,
        Kind.NO_REPEAT,
        Kind.RANK_DATA,
        Kind.RANK_SAMPLES,
        Kind.TIMELINE,
    ], bad
    samples = check(bad, Kind.RANK_SAMPLES)  # 24 samples of each rank's 72 replaced: steps 4, 7, 8
    said = "rank 0: 12 samples seen twice, 12 never seen, 3 out of order of 72; rank 1: 12 samples seen twice, 12 never"
    assert samples["detail"].startswith(said), samples["detail"]
    assert (samples["facts"]["rank"], samples["facts"]["step"], samples["facts"]["leg"]) == (0, 4, 1), samples
    ranks = check(bad, Kind.RANK_DATA)  # rank 1's own first batch after the resume: step 2's
    assert ranks["detail"].startswith("rank 1: the first batch after the resume at step 3 (") and (
        "was already consumed at step 2 (leg 0)" in ranks["detail"]
    ), ranks
    leg2 = check(bad, Kind.DATA_POSITION, leg=2)["detail"]  # epoch 3 began with epoch 0's first batch
    assert "the first batch after the resume at step 6" in leg2 and "already consumed at step 1 (leg 0)" in leg2
    status = report(project)
    assert status[2]["status"] == "FAIL" and status[3]["status"] == "PASS", (status[2], status[3])


def test_one_rank_whose_cursor_was_not_restored_is_named(project: Path) -> None:
    """The planted bug: after the resume rank 1 starts its shard over (1 node x 2 ranks; on 2 nodes
    x 1, in tests/legs/test_nodes.py until session 21, the same answer 15 s dearer). Rank 0's data
    checks cannot see it (the straight-through comparison sees the loss move, naming no rank); the
    per-rank checks answer no and name the rank."""
    edit_config(project, trainer__command=TORCHRUN)
    train = project / "train.py"
    assert RESUME in train.read_text()
    planted = "    if world.rank == 1:\n        data = Position(order, tokens, world.rank)  # planted\n"
    train.write_text(train.read_text().replace(RESUME, RESUME + planted, 1))
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "rehearsal", "--steps", "12", "--json"], cwd=project, timeout=900)
    assert res.code == 1, res.out + res.err
    bad = failed(res)
    assert sorted(c["kind"] for c in bad) == [Kind.RANK_DATA, Kind.RANK_SAMPLES, Kind.TIMELINE], bad
    ranks = check(bad, Kind.RANK_DATA)
    assert ranks["detail"].startswith("rank 1: ") and "re-read data" in ranks["detail"], ranks
    assert ranks["facts"] == {"rank": 1, "ranks": 2}
    samples = check(bad, Kind.RANK_SAMPLES)  # each resume (at 4 and 8) re-read its first 4 steps: 8 steps' never
    said = "rank 1: 64 samples seen twice, 64 never seen, 0 out of order of 96; across the ranks: 64 samples"
    assert samples["detail"].startswith(said), samples["detail"]
    assert (samples["facts"]["rank"], samples["facts"]["step"]) == (1, 5), samples
    assert report(project)[2]["status"] == "FAIL"


RANK_FILES = '''

class RankFiles:
    """Each rank's RNG in a file of its own on its node's disk (as HF's rng_state_{rank}.pth): the
    checkpoint holds the files rank 0's disk has (planted: on 2 nodes, not node 1's)."""

    def __init__(self, work, rank: int) -> None:
        self.work, self.rank, self.saved = work, rank, {}

    def keep(self) -> None:
        torch.save(torch.get_rng_state(), self.work / f"rng_{self.rank}.pt")

    def state_dict(self) -> dict:
        return {**self.saved, **{p.stem: torch.load(p) for p in sorted(self.work.glob("rng_*.pt"))}}

    def load_state_dict(self, saved: dict) -> None:
        self.saved = dict(saved)

    def restore(self, seed: int) -> None:
        """After the session's resume, this rank's file; none: the rank starts its stream over."""
        own = self.saved.get(f"rng_{self.rank}")
        if own is None:
            torch.manual_seed(seed)
        else:
            torch.set_rng_state(own)


def train('''
MASK = (
    "        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)\n",
    "        xb, yb = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)\n"
    "        xb = xb.masked_fill(torch.rand(xb.shape) < 0.1, 0)  # augmentation: each rank its own draw\n"
    "        files.keep()\n",
)
TRACK = "    sess.track(model=raw, optimizer=opt, scheduler=sched, cursor=data)\n"


def test_a_rank_whose_rng_file_only_rank_0s_disk_held_is_named(project: Path) -> None:
    """2 nodes x 1 rank, each rank seeded apart, masking tokens at random: every rank keeps its RNG
    in a file on its own disk, and the checkpoint (pushed by rank 0) holds the files rank 0's disk
    has. On one node that is both ranks'; on two, rank 1 resumes with no file and starts its
    stream over, where the session had restored it (HF's "Didn't find an RNG file for process 1")."""
    two_by_one(project)
    train = project / "train.py"
    text = train.read_text()
    assert SEEDED in text and RESUME in text and TRACK in text and MASK[0] in text
    per_rank = SEEDED.replace("args.seed)", "args.seed + int(os.environ.get('RANK', '0')))")
    text = text.replace("import random\n", "import os\nimport random\n", 1).replace("\n\ndef train(", RANK_FILES, 1)
    text = text.replace(SEEDED, per_rank).replace(MASK[0], MASK[1])
    tracked = "    files = RankFiles(sess.work, world.rank)\n" + TRACK.replace("data)", "data, rank_files=files)")
    text = text.replace(TRACK, tracked).replace(
        RESUME, RESUME + "    if sess.step_count:\n        files.restore(args.seed + world.rank)\n"
    )
    train.write_text(text)
    assert run_cli(["review"], cwd=project).code == 0
    res = run_cli(["up", "rehearsal", "--nodes", "2", "--steps", "9", "--json"], cwd=project, timeout=900)
    assert res.code == 1, res.out[-2000:] + res.err[-2000:]
    bad = failed(res)
    assert sorted(c["kind"] for c in bad) == [Kind.RANK_SAMPLES, Kind.RANK_STATE, Kind.STATE_STRAIGHT, Kind.TIMELINE]
    state = check(bad, Kind.RANK_STATE)
    said = "rank 1's global RNG at step 4, leg 1's first after its resume at step 3 is not the straight-through run's"
    assert state["detail"].startswith(said) and "its file missing from the checkpoint?" in state["detail"], state
    assert state["facts"] == {"rank": 1, "ranks": 2}
    samples = check(bad, Kind.RANK_SAMPLES)["detail"]  # rank 1 masked other tokens from step 4 on: 6 steps x 8
    assert samples.startswith("rank 1: 0 samples seen twice, 48 never seen, 0 out of order, 48 the straight"), samples
    assert "): rng." in check(bad, Kind.STATE_STRAIGHT)["detail"], bad  # the RNG digests saved at step 5
    status = report(project)
    assert status[3]["status"] == "FAIL" and status[2]["status"] == "FAIL", (status[2], status[3])
    assert status[3]["summary"].split("first: ")[1].startswith("every rank's RNG and optimizer steps"), status[3]

"""Where a drill's kills go (launcher.rungs.drill_moments), from a straight-through run's events
alone: `--at auto`'s placement, the epoch moments (mid-epoch, epoch-end, mid-epoch-1) and the
refusals when a run has no place for one, and `--at` read as one moment or a list of one per
kill. The legs that run these plans: tests/legs/test_drill.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from launcher.checks.evidence import LegEvents
from launcher.errors import BadInput
from launcher.rungs.drill_moments import (
    RANDOM_MOMENTS,
    Planned,
    Unplaced,
    auto_plan,
    parse_at,
    place_epoch,
    planned_kills,
)
from tests.helpers import assert_one_line_error, run_cli

LIST = ["mid-epoch", "epoch-end", "mid-epoch-1"]


def straight(epochs: list[int] | None, lrs: list[float] | None = None, prune_at: int = 5) -> LegEvents:
    """A straight run's events: step s (from 1) printing epochs[s-1] (None: no `epoch` printed)."""
    n = len(epochs if epochs is not None else lrs or [])
    items = []
    for s in range(1, n + 1):
        event: dict = {"event": "step", "step": s, "lr": (lrs or [1.0] * n)[s - 1]}
        if epochs is not None:
            event["epoch"] = epochs[s - 1]
        items.append((s, event))
        items.append((s, {"event": "step", "step": s, "rank": 1, "epoch": 7}))  # rank 1's are not read
    return LegEvents(9, Path("leg-9-straight.log"), items + [(99, {"event": "prune", "step": prune_at})])


def test_the_auto_plan_reads_the_straight_run_and_says_when_no_step_is_left() -> None:
    """Where `--at auto` puts the kills: the LR's first turn after the first storage cycle (a
    SIGKILL a step later), the first epoch boundary (a SIGTERM a step later); and nothing when the
    first cycle leaves no step before the run's end (the drill then answers no, naming the fix,
    instead of running fewer kills than asked)."""
    ev = straight([0] * 8 + [1] * 16, [2.0] * 16 + [1.0] * 8)  # epoch 1 from step 9, the LR cut at 17
    assert auto_plan(2, 24, ev) == [Planned("sigterm", 10), Planned("step", 18)]
    assert auto_plan(1, 24, ev) == [Planned("step", 18)]  # one kill: the LR's turn comes first
    assert auto_plan(2, 8, straight([0] * 8, prune_at=7)) == []  # the first cycle at 7 of 8 steps


def test_the_epoch_moments_land_mid_epoch_at_the_boundary_and_mid_second_epoch() -> None:
    """Four steps an epoch over 8 steps: half of epoch 0 done after step 2, its last step 4 (the
    next leg's first step is epoch 1's first), half of epoch 1 done after step 6; each a graceful
    SIGTERM, in the list's order."""
    ev = straight([0] * 4 + [1] * 4)
    plan = planned_kills(3, LIST, None, 8, ev, random.Random(0))
    assert plan == [
        Planned("sigterm", 2, "mid-epoch"),
        Planned("sigterm", 4, "epoch-end"),
        Planned("sigterm", 6, "mid-epoch-1"),
    ]
    assert plan[1].name == "epoch-end by SIGTERM at step 4"
    # odd lengths, and a run that ends inside its second epoch: the middle of what it ran, a step left after it
    ev = straight([3] * 5 + [4] * 3)
    assert [place_epoch(m, ev).step for m in LIST] == [2, 5, 6]
    assert place_epoch("mid-epoch-1", straight([0] * 3 + [1] * 2)).step == 4
    # mixed with an event moment, one per kill in order
    assert planned_kills(2, ["mid-push", "epoch-end"], None, 8, ev, random.Random(0)) == [
        Planned("mid-push"),
        Planned("sigterm", 5, "epoch-end"),
    ]


@pytest.mark.parametrize(
    ("moment", "epochs", "needles"),
    [
        ("epoch-end", [0] * 8, ["needs a second epoch", "epoch 0 at steps 1-8", "rungs.drill.steps"]),
        ("mid-epoch-1", [0] * 8, ["needs a second epoch", "epoch 0 at steps 1-8"]),
        ("mid-epoch", None, ["print their `epoch`"]),
        ("epoch-end", None, ["print their `epoch`"]),
        ("mid-epoch", [0] + [1] * 7, ["two steps or more", "epoch 0 at steps 1-1, epoch 1 at steps 2-8"]),
        ("mid-epoch-1", [0] * 7 + [1], ["two steps or more", "epoch 1 at steps 8-8"]),
    ],
)
def test_an_epoch_moment_the_run_has_no_place_for_is_refused_naming_its_epochs(
    moment: str, epochs: list[int] | None, needles: list[str]
) -> None:
    with pytest.raises(Unplaced) as err:
        planned_kills(1, [moment], None, 8, straight(epochs, [1.0] * 8), random.Random(0))
    assert all(n in str(err.value) and f"--at {moment}" in str(err.value) for n in needles), err.value
    with pytest.raises(Unplaced):
        place_epoch(moment, None)  # no straight run at all
    assert place_epoch("mid-epoch", straight([0] * 8)).step == 4  # one epoch is enough for its middle


def test_at_takes_one_moment_for_every_kill_or_a_list_of_one_per_kill() -> None:
    assert parse_at("mid-push", None, False) == (["mid-push"], 2)  # the default count
    assert parse_at("random", 5, False) == (["random"], 5)
    assert parse_at("auto", None, True) == (["auto"], 2)
    assert parse_at(" mid-epoch, epoch-end ,mid-epoch-1", None, False) == (LIST, 3)
    assert parse_at("mid-push,mid-verify", 2, False) == (["mid-push", "mid-verify"], 2)
    assert parse_at("epoch-end", None, False) == (["epoch-end"], 1)  # one step: one kill
    seeded = planned_kills(3, ["random", "mid-push", "random"], None, 8, None, random.Random(3))
    assert len(seeded) == 3 and seeded[1] == Planned("mid-push")
    assert all(p.how in RANDOM_MOMENTS for p in seeded)  # `random` picks one per kill


@pytest.mark.parametrize(
    ("at", "kills", "gpu", "kills_at", "needle"),
    [
        ("mid-epoch,epoch-end,mid-epoch-1", 2, False, False, "--kills 2, but --at names 3 moments"),
        ("epoch-end", 2, False, False, "--kills 2, but --at names 1 moment,"),
        ("epoch-end,mid-epoch", None, False, False, "in the run's order"),
        ("mid-epoch,mid-epoch", None, False, False, "once each"),
        ("auto,mid-push", None, False, False, "auto places every kill itself"),
        ("mid-epoch", None, True, False, "a GPU drill runs none"),
        ("mid-push,epoch-end", None, True, False, "--at epoch-end is placed from the straight-through run"),
        ("mid-push,mid-verify", None, False, True, "--kills-at places every kill"),
        ("mid-push,", None, False, False, "got ''"),
        ("mid-push,middle", None, False, False, "got 'middle'"),
        ("", None, False, False, "got ''"),
    ],
)
def test_a_bad_at_is_refused(at: str, kills: int | None, gpu: bool, kills_at: bool, needle: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_at(at, kills, gpu, kills_at)
    assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_the_cli_refuses_a_mismatched_count_and_a_gpu_epoch_moment_in_one_line(project: Path) -> None:
    """Exit 2, one line, before anything is planned or recorded."""
    res = run_cli(["drill", "cold-resume", "--at", ",".join(LIST), "--kills", "2"], cwd=project)
    assert_one_line_error(res, 2, "--kills 2, but --at names 3 moments")
    res = run_cli(["drill", "cold-resume", "--gpus", "T4:1", "--at", "epoch-end"], cwd=project)
    assert_one_line_error(res, 2, "--at epoch-end", "GPU drill")

"""The watchdog's policy (launcher.checks.watchdog): each rank's silence against limits from its own
rhythm, and the replay of recorded legs through it (scripts/watchdog_replay.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.checks.watchdog import Policy, Watchdog, p99

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0
POLICY = Policy()


def stepped(gaps: list[float], rank: int = 0, dog: Watchdog | None = None, first_at: float = 10.0) -> Watchdog:
    """A leg whose rank printed `start`, then steps 1, 2, ... with these gaps after the first."""
    dog = dog or Watchdog(POLICY, T0)
    t = T0 + first_at
    dog.hear(T0 + 1, {"event": "start", "rank": rank})
    dog.hear(t, {"event": "step", "rank": rank, "step": 1})
    for i, gap in enumerate(gaps, start=2):
        t += gap
        dog.hear(t, {"event": "step", "rank": rank, "step": i})
    return dog


def last_t(dog: Watchdog, rank: int = 0) -> float:
    t = dog.ranks[rank].last_t
    assert t is not None
    return t


def test_fast_steps_are_judged_against_the_floor() -> None:
    dog = stepped([0.1] * 20)
    end = last_t(dog)
    assert dog.suspects(end + 14.9) == []
    [suspect] = dog.suspects(end + 15.5)
    assert (suspect.rank, suspect.last_step, suspect.limit_s, suspect.phase) == (0, 21, 15.0, "stepping")
    assert suspect.line() == "rank 0 silent 15.5 s after step 21 (its last event `step`; limit 15.0 s while stepping)"


def test_slow_steps_are_judged_against_five_times_their_own_p99() -> None:
    dog = stepped([4.0] * 10 + [5.0])
    end = last_t(dog)
    assert dog.ranks[0].limit(POLICY) == 25.0
    assert dog.suspects(end + 24.0) == []
    assert [s.rank for s in dog.suspects(end + 26.0)] == [0]
    assert 0.95 < dog.closest(end + 24.0) < 1.0


def test_the_p99_leaves_out_the_slowest_percent() -> None:
    gaps = [1.0] * 198 + [30.0, 40.0]  # two checkpoint writes in 200 gaps: 1 %
    assert p99(gaps, 5) == 1.0
    assert p99([1.0, 1.0, 9.0], 5) == 9.0  # too few gaps: the largest
    assert stepped(gaps).ranks[0].limit(POLICY) == 15.0


def test_start_up_and_the_first_gap_get_the_first_step_allowance() -> None:
    dog = Watchdog(POLICY, T0)
    dog.hear(T0 + 2, {"event": "start", "rank": 0})
    assert dog.suspects(T0 + 899) == []
    [late] = dog.suspects(T0 + 905)
    assert late.phase == "starting" and late.limit_s == 900.0 and late.last_step is None
    one = stepped([])  # one step: the next may still be warming up
    assert one.ranks[0].limit(POLICY) == 900.0
    silent = Watchdog(POLICY, T0)  # a rank that has printed nothing is not known to the watchdog
    assert silent.suspects(T0 + 10_000) == [] and silent.closest(T0 + 10_000) == 0.0


def test_the_final_checkpoint_gets_the_finish_allowance_and_a_hold_is_not_judged() -> None:
    dog = stepped([0.1] * 10)
    dog.hear(last_t(dog) + 0.1, {"event": "stop", "rank": 0, "reason": "max_steps"})
    assert dog.suspects(last_t(dog) + 600) == []
    assert dog.suspects(last_t(dog) + 901)[0].phase == "finishing"
    held = stepped([0.1] * 10)
    held.hear(last_t(held) + 0.1, {"event": "hold", "rank": 0, "step": 11})
    assert held.suspects(last_t(held) + 10_000) == []
    done = stepped([0.1] * 10)
    done.hear(last_t(done) + 0.1, {"event": "done", "rank": 0})
    assert done.suspects(last_t(done) + 10_000) == []


def test_each_rank_is_judged_on_its_own_rhythm_and_the_most_overdue_comes_first() -> None:
    dog = stepped([2.0] * 10, rank=0)
    stepped([0.1] * 10, rank=1, dog=dog, first_at=27.0)  # rank 1 fast, and stopped at T0 + 28
    now = T0 + 40.0  # rank 0 last stepped at T0 + 30: 10 s of its 20; rank 1 12 s of its 15
    assert dog.suspects(now) == []
    later = dog.suspects(T0 + 52.0)  # rank 1: 24 s of 15; rank 0: 22 s of 20
    assert [s.rank for s in later] == [1, 0]


def test_a_rank_that_is_not_a_number_is_not_followed() -> None:
    dog = Watchdog(POLICY, T0)
    for rank in (True, "1", None, 1.0):
        dog.hear(T0 + 1, {"event": "step", "rank": rank, "step": 1})
    assert dog.ranks == {}
    dog.hear(T0 + 1, {"event": "step", "step": 1})  # no rank: rank 0, as every reader takes it
    assert list(dog.ranks) == [0]


def write_leg(folder: Path, gaps: list[float], t0: float = T0) -> Path:
    folder.mkdir(parents=True)
    lines, t = [], t0
    for step, gap in enumerate(gaps, start=1):
        t += gap
        lines.append(json.dumps({"event": "step", "t": round(t, 3), "rank": 0, "step": step, "loss": 1.0, "lr": 0.1}))
    (folder / "leg-0.log").write_text("some progress bar\n" + "\n".join(lines) + "\n")
    return folder / "leg-0.log"


def test_the_replay_finds_a_long_gap_and_skips_made_up_times(tmp_path: Path) -> None:
    write_leg(tmp_path / "steady", [1.0] * 12)
    write_leg(tmp_path / "gap", [1.0] * 12 + [40.0, 1.0])
    write_leg(tmp_path / "unit", [1.0] * 3, t0=100.0)
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "watchdog_replay.py"), str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(res.stdout)
    assert (out["legs"], out["skipped"], out["suspects"]) == (2, 1, 1)
    worst = out["closest"][0]
    assert worst["log"].endswith("gap/leg-0.log") and worst["ratio"] == round(40.0 / 15.0, 3), worst
    assert "40.00 s of 15.00 before `step` (after step 12)" in worst["where"]


def step_line(t: float, step: int, rank: int = 0) -> str:
    return json.dumps({"event": "step", "t": t, "rank": rank, "step": step, "loss": 1.0, "lr": 0.1})


def test_a_live_leg_names_each_suspect_once_and_records_whether_it_spoke_again() -> None:
    from launcher.checks.watchdog import LiveWatch

    live = LiveWatch(POLICY)
    live.hear_line(step_line(T0, 1), T0)  # before the leg's record: nothing to hear it yet
    live.begin(T0)
    live.hear_line(" 40%|####      | 4/10 " + step_line(T0 + 1, 1), T0 + 1)  # after a progress bar, as tqdm leaves it
    live.hear_line('{"event": "step", "rank": 0, "step": "two"}', T0 + 1.2)  # damaged: not heard
    live.hear_line("a line of the trainer's own", T0 + 1.3)
    for i in range(2, 12):
        live.hear_line(step_line(T0 + i, i), T0 + i)
    assert live.judge(T0 + 20) == [] and abs(live.closest - 9 / 15) < 1e-9  # 9 s of 15
    [late] = live.judge(T0 + 27)
    assert (late.rank, late.last_step, late.since) == (0, 11, T0 + 11)
    assert live.judge(T0 + 40) == []  # named once
    live.hear_line(step_line(T0 + 41, 12), T0 + 41)  # it was only slow: a false alarm, had it been acted on
    record = live.record()
    assert record["policy"]["floor_s"] == 15.0 and record["closest"] >= 1.0
    [suspect] = record["suspects"]
    assert suspect["rank"] == 0 and suspect["silent_s"] == 16.0 and suspect["spoke_again"] is True
    json.dumps(record)


def test_a_leg_the_launcher_is_ending_is_not_judged() -> None:
    from launcher.checks.watchdog import LiveWatch

    live = LiveWatch(POLICY)
    live.begin(T0)
    for i in range(1, 10):
        live.hear_line(step_line(T0 + i, i), T0 + i)
    live.pause()  # a drill froze it, or the launcher sent its SIGTERM
    assert live.judge(T0 + 1000) == [] and live.record()["suspects"] == []


def test_a_leg_is_called_hung_only_where_the_look_shows_it() -> None:
    from launcher.backends.looks import Look
    from launcher.checks.watchdog import confirm

    def dump(frame: str) -> str:
        return f'Thread 1 (idle): "MainThread"\n    {frame}\n    <module> (train.py:9)\n'

    in_all_reduce = dump("all_reduce (/v/site-packages/torch/distributed/distributed_c10d.py:2806)")
    in_barrier = dump("barrier (/v/site-packages/torch/distributed/distributed_c10d.py:4700)")
    evaluating = dump("evaluate (train.py:40)")
    stopped = Look(11, 1, "T", 3.0, dump("step (train.py:20)"))
    waiting = Look(10, 0, "S", 3.0, in_all_reduce)
    assert confirm([waiting, stopped]) == stopped.line()
    both = confirm([waiting, Look(11, 1, "S", 3.0, in_barrier)])
    assert both is not None and both.startswith(
        "every rank waits in a collective: rank 0 (pid 10): waiting in all_reduce"
    )
    # rank 0 evaluates alone while rank 1 waits in a barrier: healthy, not hung
    assert confirm([Look(10, 0, "R", 9.0, evaluating), Look(11, 1, "S", 3.0, in_barrier)]) is None
    assert confirm([Look(12, None, "S", 1.0, evaluating)]) is None  # no rank to wait on
    assert confirm([Look(13, None, "S", 1.0, in_all_reduce)]) is None  # torchrun's agent, not a rank
    assert confirm([]) is None  # nothing to look at (sky's machines): never ended on silence alone


def test_a_rank_still_silent_is_looked_at_again_a_limit_later_and_a_new_silence_is_a_new_suspect() -> None:
    from launcher.checks.watchdog import LiveWatch

    live = LiveWatch(POLICY)
    live.begin(T0)
    for i in range(1, 10):
        live.hear_line(step_line(T0 + i, i), T0 + i)
    assert [s.rank for s in live.judge(T0 + 25)] == [0]  # 16 s of 15: named, looked at
    assert live.judge(T0 + 30) == []  # looked at 5 s ago: not yet again
    [again] = live.judge(T0 + 40.5)  # a limit (15 s) after the last look: looked at again
    assert again.since == T0 + 9 and len(live.found) == 1  # the same silence: one suspect
    live.hear_line(step_line(T0 + 41, 10), T0 + 41)  # it spoke again: its 32 s gap is now its p99
    assert live.judge(T0 + 57) == []  # 16 s: under 5 x 32 s
    [fresh] = live.judge(T0 + 202)  # silent again past 160 s: a second suspect
    assert fresh.last_step == 10 and fresh.limit_s == 160.0 and len(live.found) == 2


def test_a_long_legs_gaps_are_binned_and_their_p99_stays_within_one_percent_above() -> None:
    """Past Gaps.EXACT gaps a rank's are counted in 1 % bins (bounded memory, a p99 in time
    independent of the leg's length): never under the exact p99, at most 1 % over it."""
    import random

    from launcher.checks.watchdog import Gaps

    rng = random.Random(7)
    values = [rng.lognormvariate(-2.0, 0.6) for _ in range(20_000)] + [40.0] * 150  # 0.75 % slow saves
    gaps = Gaps()
    for i, value in enumerate(values, start=1):
        gaps.append(value)
        if i in (100, Gaps.EXACT, Gaps.EXACT + 1, 10_000, len(values)):
            exact = p99(values[:i], 5)
            got = gaps.p99(5)
            assert (got == exact) if i <= Gaps.EXACT else (exact <= got <= exact * 1.01), (i, exact, got)
    assert gaps.exact is None and len(gaps) == len(values) and len(gaps.bins) < 700


def test_every_rank_waiting_is_hung_only_when_a_second_look_in_the_same_silence_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All ranks waiting in a collective could be one long transfer: the first look shows it and
    the leg goes on; the look a limit later in the same silence calls it hung. A stopped rank is
    hung at the first look."""
    from launcher.backends.looks import Look
    from launcher.checks import watchdog
    from launcher.checks.watchdog import LiveWatch

    dump = 'Thread 1 (idle): "MainThread"\n    recv (/v/site-packages/torch/distributed/distributed_c10d.py:2799)\n'
    seen = [Look(10, 0, "S", 3.0, dump), Look(11, 1, "S", 3.0, dump)]
    monkeypatch.setattr(watchdog, "look", lambda pids: seen)
    live = LiveWatch(POLICY)
    live.begin(T0)
    for i in range(1, 10):
        live.hear_line(step_line(T0 + i, i), T0 + i)
    log = tmp_path / "leg-0.log"
    [first] = live.judge(T0 + 25)
    assert live.second_look(first, [10, 11], log)[1] is None  # shown, looked at again later
    [again] = live.judge(T0 + 40.5)
    hung = live.second_look(again, [10, 11], log)[1]
    assert hung is not None and hung.startswith("every rank waits in a collective: rank 0 (pid 10): waiting in recv")
    assert [each["hung"] is not None for each in live.record()["looks"]] == [False, True]
    live.hear_line(step_line(T0 + 41, 10), T0 + 41)  # had it spoken meanwhile, a new silence starts over
    [fresh] = live.judge(T0 + 202)
    assert live.second_look(fresh, [10, 11], log)[1] is None
    seen[1] = Look(11, 1, "T", 3.0, dump)  # stopped: no second look needed
    [stopped] = live.judge(T0 + 202 + 161)
    assert "stopped (SIGSTOP or a debugger)" in (live.second_look(stopped, [10, 11], log)[1] or "")

"""launcher.rungs.oracle: which earlier straight-through leg a CPU drill may reuse as its oracle.
Synthetic ledger rows (a real SQLite ledger, no leg run): the leg the drill would run, recorded
by an earlier run, is reused; each key field that differs, or a log that does not end at the
drill's steps, leaves the drill to run its own."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from launcher.backends.local import resolve_command
from launcher.checks.evidence import Kind
from launcher.config.schema import Config, DrillConfig, RungsConfig
from launcher.ladder import DRILL
from launcher.ledger.db import Ledger
from launcher.leg_env import redact
from launcher.legs import RunContext
from launcher.report.runs import reused_oracle
from launcher.rungs.oracle import find_oracle, reused
from runtime import contract

STEPS = 20
AS_LEG = 3
FILES = {"train.py": "a" * 64}


@dataclasses.dataclass
class _Backend:
    name: str = "local"


def _context(tmp_path: Path, ledger: Ledger, **cfg_changes: Any) -> RunContext:
    cfg = dataclasses.replace(Config(project="p", root=tmp_path), **cfg_changes)
    rung = dataclasses.replace(DRILL, legs=AS_LEG, needs_gpu=False)
    ctx = RunContext(cfg, rung, _Backend(), ledger, "p-drill-1", "file:///store", {}, None, lambda leg, line: None)
    ledger.begin_run(_run_row("p-drill-1", "drill"), FILES)
    return ctx


def _run_row(run_id: str, rung: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": run_id,
        "project": "p",
        "rung": rung,
        "backend": "local",
        "gpu_name": None,
        "gpu_count": 0,
        "nodes": 1,
        "store_uri": "file:///store",
        "files_digest": "digest",
        "config_sha256": "config",
        "started_at": time.time(),
    } | changes


def _log(path: Path, steps: int = STEPS, ranks: int = 1, extra: str = "") -> Path:
    lines = [
        json.dumps({"event": "step", "step": s, "loss": 1.0 / s, "lr": 0.1, "rank": r})
        for s in range(1, steps + 1)
        for r in range(ranks)
    ]
    lines += [json.dumps({"event": "done", "step": steps, "rank": r}) for r in range(ranks)]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _straight(
    ctx: RunContext,
    tmp_path: Path,
    run: dict[str, Any] | None = None,
    leg: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    end: dict[str, Any] | None = None,
    log: Callable[[Path], Path] = _log,
) -> None:
    """An earlier rehearsal whose straight leg 3 is the leg the drill would run (`run`, `leg`,
    `files`, `end`: what differs)."""
    row = _run_row("p-rehearsal-1", "rehearsal") | (run or {})
    ctx.ledger.begin_run(row, FILES if files is None else files)
    env = ctx.leg_env(AS_LEG, STEPS, time.time() + 300) | {
        contract.RUN_ID: "p-rehearsal-1-straight-3",
        contract.RUNG: "rehearsal",
    }
    record = {
        "run_id": row["id"],
        "leg": 3,
        "backend": "local",
        "instance": "/tmp/x",
        "command": resolve_command(ctx.cfg.trainer.command),
        "env": redact(env, ctx.cfg.secrets),
        "log_path": str(log(tmp_path / "leg-3-straight.log")),
        "started_at": time.time(),
        "role": "straight",
    } | (leg or {})
    ctx.ledger.begin_leg(record)
    ended = {"ended_at": time.time(), "exit_code": 0, "killed": False} | (end or {})
    ctx.ledger.end_leg(row["id"], 3, end_reason="exited", billed_gpu_hours=0.0, cost_usd=0.0, **ended)


@pytest.fixture
def ledger(tmp_path: Path):  # noqa: ANN201
    with Ledger(tmp_path / "ledger.db") as opened:
        yield opened


def test_the_drill_reuses_the_straight_leg_the_ledger_proves_its_own(tmp_path: Path, ledger: Ledger) -> None:
    ctx = _context(tmp_path, ledger)
    _straight(ctx, tmp_path)
    oracle = find_oracle(ctx, AS_LEG, STEPS)
    assert oracle is not None and (oracle.run_id, oracle.leg, oracle.events.leg) == ("p-rehearsal-1", 3, AS_LEG)
    said = reused(oracle).to_json()
    assert said["kind"] == Kind.STRAIGHT_FINISHED and said["ok"] and said["leg"] == AS_LEG
    assert said["facts"]["reused_run"] == "p-rehearsal-1" and said["evidence"][0]["log"].endswith("leg-3-straight.log")
    # The report reads the drill's oracle from that check; not from one that disagreed.
    (events,) = reused_oracle({"checks": [said]})
    assert (events.leg, events.last("done")[1]["step"]) == (AS_LEG, STEPS)
    assert reused_oracle({"checks": [reused(oracle, "leg 1: LR follows the schedule").to_json()]}) == []


def _cmd(ctx: RunContext) -> list[str]:
    return [*resolve_command(ctx.cfg.trainer.command)[:-1], "--ckpt-every", "3"]


DIFFERS: dict[str, dict[str, Any]] = {
    "another project": {"run": {"project": "q"}},
    "a docker run": {"run": {"backend": "docker"}},
    "a leg on docker": {"leg": {"backend": "docker"}},
    "a GPU run": {"run": {"gpu_count": 1, "gpu_name": "T4"}},
    "two nodes": {"run": {"nodes": 2}},
    "other reviewed files (digest)": {"run": {"files_digest": "other"}},
    "another file's hash": {"files": {"train.py": "b" * 64}},
    "another checkpoint cadence": {"leg": {"command": "cmd"}},
    "another interpreter": {"leg": {"command": ["/usr/bin/python3.9", "train.py"]}},
    "another leg_env": {"leg": {"env": "extra"}},
    "other steps": {"leg": {"env": "steps"}},
    "another store": {"leg": {"env": "store"}},
    "exit 1": {"end": {"exit_code": 1}},
    "killed": {"end": {"killed": True}},
    "not a straight leg": {"leg": {"role": None}},
    "a log that ends early": {"log": lambda p: _log(p, steps=STEPS - 5)},
    "a rank's done at another step": {
        "log": lambda p: _log(p, ranks=2, extra='{"event": "done", "step": 7, "rank": 1}\n')
    },
    "a damaged line": {"log": lambda p: _log(p, extra='{"event": "step", "step": 9, "loss": 1.0}\n')},
    "no log": {"log": lambda p: p},
}


@pytest.mark.parametrize("what", sorted(DIFFERS))
def test_a_straight_leg_that_differs_in_any_key_field_is_not_reused(tmp_path: Path, ledger: Ledger, what: str) -> None:
    ctx = _context(tmp_path, ledger)
    change = {k: dict(v) if isinstance(v, dict) else v for k, v in DIFFERS[what].items()}
    leg = change.get("leg", {})
    if leg.get("command") == "cmd":
        leg["command"] = _cmd(ctx)
    if isinstance(leg.get("env"), str):
        env = redact(ctx.leg_env(AS_LEG, STEPS, 0.0), ctx.cfg.secrets)
        leg["env"] = (
            env
            | {
                "extra": {"PREFLIGHT_SEED": "7"},
                "steps": {contract.MAX_STEPS: str(STEPS + 10)},
                "store": {contract.STORE: "file:///elsewhere"},
            }[leg["env"]]
        )
    _straight(ctx, tmp_path, **change)
    assert find_oracle(ctx, AS_LEG, STEPS) is None


def test_fresh_oracle_and_the_drills_own_run_never_reuse(tmp_path: Path, ledger: Ledger) -> None:
    fresh = RungsConfig(drill=DrillConfig(steps=STEPS, budget_minutes=5, fresh_oracle=True))
    ctx = _context(tmp_path, ledger, rungs=fresh)
    _straight(ctx, tmp_path)
    assert find_oracle(ctx, AS_LEG, STEPS) is None
    ctx = dataclasses.replace(ctx, cfg=dataclasses.replace(ctx.cfg, rungs=RungsConfig()), run_id="p-rehearsal-1")
    assert find_oracle(ctx, AS_LEG, STEPS) is None  # a run never reuses its own straight leg
    on_gpu = dataclasses.replace(ctx, run_id="p-drill-1", rung=dataclasses.replace(ctx.rung, needs_gpu=True))
    assert find_oracle(on_gpu, AS_LEG, STEPS) is None  # a GPU drill runs no straight leg at all
    assert find_oracle(dataclasses.replace(on_gpu, rung=ctx.rung), AS_LEG, STEPS) is not None


def _events(n: int, losses: dict[int, float], resumed_at: int | None = None) -> Any:
    from launcher.checks.evidence import LegEvents

    head = [{"event": "resume", "from_step": resumed_at}] if resumed_at is not None else []
    body = [{"event": "step", "step": s, "loss": v, "lr": 0.1, "batch_hash": f"b{s}"} for s, v in losses.items()]
    done = [{"event": "done", "step": max(losses)}]
    return LegEvents(
        n, Path(f"leg-{n}.log"), [(i + 1, {"rank": 0, "t": 0.0, **e}) for i, e in enumerate(head + body + done)]
    )


def test_a_reused_oracle_that_disagrees_costs_a_fresh_straight_leg_never_a_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """judge(): where every check holds against the reused oracle, its line and the checks, no leg
    run; where one fails, the line that says so (ok, naming the check) and a fresh straight leg run
    as the oracle's leg number, which the drill then judges by (the climbs' drills reuse, at leg
    level: tests/legs/test_examples.py drill_and_report)."""
    from launcher.rungs import oracle as oracle_mod

    ctx = _context(tmp_path, Ledger(tmp_path / "ledger.db"))
    losses = {s: 5.0 - s / 10 for s in range(1, 9)}
    legs = [_events(0, {s: losses[s] for s in range(1, 5)}), _events(1, {s: losses[s] for s in range(5, 9)}, 4)]
    ran: list[tuple[int, int, Any]] = []

    def fake_run_leg(ctx: Any, leg: int, steps: int, ending: Any = None) -> Any:
        ran.append((leg, steps, ending))
        return dataclasses.make_dataclass("Out", ["events"])(_events(leg, losses))

    monkeypatch.setattr(oracle_mod, "run_leg", fake_run_leg)
    same = oracle_mod.Oracle("p-rehearsal-1", 3, _events(AS_LEG, losses))
    checks, fresh = oracle_mod.judge(ctx, same, legs, 8)
    assert fresh is None and not ran and all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert checks[0].kind == Kind.STRAIGHT_FINISHED and "disagreed" not in checks[0].facts
    moved = oracle_mod.Oracle("p-rehearsal-1", 3, _events(AS_LEG, losses | {6: losses[6] + 1.0}))
    checks, fresh = oracle_mod.judge(ctx, moved, legs, 8)
    assert [(leg, steps, ending.straight) for leg, steps, ending in ran] == [(AS_LEG, 8, True)]
    assert fresh is not None and fresh.events.leg == AS_LEG
    assert len(checks) == 1 and checks[0].ok and checks[0].facts["disagreed"], checks

"""Running one leg: launched on a fresh instance, watched, ended, recorded in the ledger
within its budget. Its environment (docs/design.md's leg environment) is
launcher.leg_env's.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from launcher.backends.base import Backend, LegHandle, LegResult, LegSpec, StagedFile
from launcher.backends.local import trainer_python
from launcher.checks.evidence import LegEvents
from launcher.checks.watchdog import LiveWatch, Policy, Suspect
from launcher.config.schema import Config, GpuSpec
from launcher.errors import LauncherError, RunStopped
from launcher.ladder import Rung
from launcher.ledger.db import Ledger
from launcher.leg_env import Ending, ending_env, exported_secrets, leg_deadline, leg_env, redact
from runtime import contract
from runtime.store.seal import KEY_ENV

GRACE_FRACTION = 0.1
MIN_GRACE_SECONDS = 60.0
NODE_LOST_WAIT_S = 60.0
"""After a drill lost one node, how long the rest of the cluster gets to end before it is killed."""
WATCH_EVERY_S = 1.0
"""How often a waiting leg's ranks are judged by its watchdog (launcher.checks.watchdog)."""


@dataclass
class RunContext:
    """What every leg of one run shares."""

    cfg: Config
    rung: Rung
    backend: Backend
    ledger: Ledger
    run_id: str
    store_uri: str
    files: dict[str, StagedFile]
    gpus: GpuSpec | None
    show: Callable[[int, str], None]
    nodes: int = 1
    quota_left_hours: float | None = None
    """GPU-hours the quota still allows this run (None: no cap): bounds each leg's deadline."""
    store_key: bytes | None = None
    """The project's store key (launcher.storekey): a secret of every leg."""
    reservation_id: int | None = None
    """The quota guard's reservation for this run (the run rung grows it leg by leg)."""
    gpu_hour_price: float | None = None
    allow_overdraft: bool = False

    def leg_deadline(self, budget_s: float) -> float:
        """LAUNCHER_DEADLINE: the leg's budget, the session cap, and what the quota still allows."""
        return leg_deadline(self.cfg, budget_s, self.quota_left_hours, self.gpus_total)

    @property
    def run_dir(self) -> Path:
        return self.cfg.state_path / "runs" / self.run_id

    @property
    def gpu_count(self) -> int:
        return self.gpus.count if self.gpus else 0

    @property
    def gpus_total(self) -> int:
        """GPUs of one leg, every node counted (launcher.plan.Request.gpus_total, on the run's context)."""
        return self.gpu_count * self.nodes

    def leg_env(
        self, leg: int, max_steps: int, deadline: float, deadline_after_resume: float | None = None
    ) -> dict[str, str]:
        """This leg's environment (runtime.contract.leg_env): the one the dry run shows too."""
        return leg_env(
            self.cfg,
            self.rung.name,
            self.run_id,
            leg,
            self.store_uri,
            max_steps,
            deadline,
            {rel: f.sha256 for rel, f in self.files.items()},
            self.gpus,
            deadline_after_resume,
        )

    def secrets(self) -> dict[str, str]:
        found = exported_secrets(self.cfg)
        if self.store_key is not None:
            found[KEY_ENV] = self.store_key.hex()
        return found

    def open_store(self):  # noqa: ANN201 - runtime.store.Store, imported lazily
        """This run's checkpoints, read with the project's key."""
        from runtime.store import open_store

        return open_store(self.store_uri, f"runs/{self.run_id}", key=self.store_key)

    def billed(self, result: LegResult) -> tuple[float, float, float | None, str]:
        """(instance-seconds, GPU-hours, USD, cost source) of a leg: GPU-hours are instance-seconds
        x GPUs per node; priced per instance-hour where the backend knows the instance's price
        (host VM included), else per GPU-hour from the config's prices."""
        seconds = result.billed_seconds if result.billed_seconds is not None else result.wall_seconds
        gpu_per_instance = self.gpus.count if self.gpus else 0
        hours = seconds / 3600.0 * gpu_per_instance
        if result.instance_hourly_usd is not None:
            return seconds, hours, seconds / 3600.0 * result.instance_hourly_usd, result.cost_source or "backend"
        price = self.cfg.prices.get(self.gpus.name) if self.gpus else None
        if price is not None:
            return seconds, hours, hours * price, "config prices"
        return seconds, hours, (0.0 if gpu_per_instance == 0 and self.backend.name != "sky" else None), "none"


def _rank0_event(line: str, name: str) -> dict | None:
    from runtime.events import parse_line

    event = parse_line(line)
    if event is None or event["event"] != name or event.get("rank", 0) != 0:
        return None
    return event


@dataclass
class LegOutcome:
    result: LegResult
    events: LegEvents
    acted_at: float | None = None
    """When the launcher sent the leg's planned stop (the SIGTERM, or the freeze of a hold)."""
    python: str | None = None
    """The interpreter that ran the trainer where it ran on this host (the local backend), else None."""
    watchdog: dict[str, Any] | None = None
    """Its watchdog's record, as the ledger keeps it (launcher.checks.watchdog.LiveWatch.record)."""


class _Watch:
    """One leg's output, watched as it comes: it marks that the trainer spoke the contract,
    fires a drill's kill on the line it accepts, and ends the leg the way `ending` says."""

    def __init__(
        self,
        ctx: RunContext,
        spec: LegSpec,
        deadline: float,
        ending: Ending,
        kill_when: Callable[[str], bool] | None,
        lose_node: int | None = None,
        tap: Callable[[str, LegHandle], None] | None = None,
    ) -> None:
        self.ctx, self.spec, self.deadline, self.ending, self.kill_when = ctx, spec, deadline, ending, kill_when
        self.tap = tap
        """Hears every line with the leg's handle (a drill's hand on the running leg: drill hang)."""
        self.lose_node = lose_node
        """On `kill_when`'s line, lose this node alone rather than kill the leg (a drill's node-lost)."""
        self.trigger = threading.Event()
        self.spoke = threading.Event()
        self.started: list[LegHandle] = []
        self.sent: set[str] = set()
        self.acted_at: float | None = None
        self.kill_reason: str | None = None
        self.live = LiveWatch(Policy.of(ctx.cfg.trainer.watchdog))

    def on_line(self, line: str) -> None:
        ctx, ending, leg = self.ctx, self.ending, self.spec.leg
        ctx.show(leg, line)
        self.live.hear_line(line, time.time())
        if self.tap is not None and self.started:
            self.tap(line, self.started[0])
        # A `log` event may come from beside the trainer (a sky leg's notice watcher): it is no
        # sign that the trainer speaks the contract.
        if not self.spoke.is_set() and '{"event": ' in line and '{"event": "log"' not in line:
            self.spoke.set()
        if self.kill_when is not None and not self.trigger.is_set() and self.kill_when(line):
            self.live.pause()
            if self.started and ctx.backend.can_freeze:
                ctx.backend.freeze(self.started[0])  # stop it right at this line: the kill lands here
            self.trigger.set()
        if (
            ending.hold_at is not None
            and self.acted_at is None
            and '"hold"' in line
            and (held := _rank0_event(line, "hold")) is not None
        ):
            self.acted_at = float(held.get("t") or time.time())  # the `hold` event itself is shown as it comes
        if ending.sigterm_at is None or not self.started or "term" in self.sent:
            return
        step = None if (stepped := _rank0_event(line, "step")) is None else int(stepped["step"])
        if step is None and ending.hold_at is not None:  # a leg holding for its SIGTERM may print no step
            held = _rank0_event(line, "hold")  # line first (an adapter's step event can come after)
            step = None if held is None else int(held["step"])
        if step is not None and step >= ending.sigterm_at:
            self.live.pause()
            self.sent.add("term")
            self.acted_at = time.time()
            if ending.notice_s == 0:  # preempted with no notice: the kill lands at this line
                if ctx.backend.can_freeze:
                    ctx.backend.freeze(self.started[0])
                self.kill_reason = f"preempted at step {step} with no notice"
                self.trigger.set()
                return
            ctx.backend.terminate(self.started[0])

    def suspected(self, handle: LegHandle, suspect: Suspect) -> str | None:
        """A suspect shown with the look at every process of the leg (launcher.checks.watchdog);
        the reason to end the leg where the look shows it hung and the policy acts, else None."""
        seen, hung = self.live.second_look(suspect, self.ctx.backend.pids(handle), self.spec.log_path)
        acting = hung is not None and self.live.policy.act
        after = f"hung: {hung}; the leg is ended" if acting else "observed: the leg goes on"
        self.ctx.show(self.spec.leg, f"launcher: watchdog: {suspect.line()}; {after}\n")
        for process in seen:
            self.ctx.show(self.spec.leg, f"launcher: watchdog:   {process.line()}\n")
        return f"hung: {suspect.line()}; {hung}" if acting else None

    def notice_ends(self) -> float | None:
        """A preemption's kill time, once its SIGTERM went (None: no preemption under way)."""
        notice = self.ending.notice_s
        return None if not notice or "term" not in self.sent or self.acted_at is None else self.acted_at + notice

    def node_lost(self, handle: LegHandle, at_kill: Callable[[], str] | None) -> LegResult:
        """A drill's `node-lost`: one node dies alone at the frozen line, the others go on until
        the cluster ends them (launcher.backends.nodes), and the leg counts as killed."""
        backend = self.ctx.backend
        assert self.lose_node is not None
        reason = at_kill() if at_kill else f"node {self.lose_node} lost"
        backend.lose_node(handle, self.lose_node)
        if backend.can_freeze:
            backend.thaw(handle)
        result = backend.wait(handle, timeout=NODE_LOST_WAIT_S) or backend.kill(handle, reason=reason)
        return dataclasses.replace(result, killed=True, end_reason=f"{reason}; {result.end_reason}")

    def record(self, handle: LegHandle) -> None:
        """The instance exists: its ledger row, before anything can bill unrecorded."""
        ctx, spec = self.ctx, self.spec
        self.started.append(handle)
        self.live.begin(handle.started_at)
        ctx.ledger.begin_leg(
            {
                "run_id": ctx.run_id,
                "leg": spec.leg,
                "backend": ctx.backend.name,
                "instance": handle.instance,
                "command": list(handle.command),
                "env": redact(dict(spec.env), ctx.cfg.secrets),
                "log_path": str(spec.log_path),
                "started_at": handle.started_at,
                "role": "straight" if self.ending.straight else None,
                **handle.ledger_fields(),
            }
        )

    def wait(self, handle: LegHandle, budget_s: float, at_kill: Callable[[], str] | None) -> LegResult:
        """Wait for the leg within its budget (and grace); kill it when it stays silent, when
        a drill's line came, or when it runs over."""
        ctx = self.ctx
        give_up = time.time() + budget_s + max(MIN_GRACE_SECONDS, GRACE_FRACTION * budget_s)
        silent_by = time.time() + ctx.cfg.trainer.events_grace_s
        while True:
            if not self.spoke.is_set() and time.time() >= silent_by:
                return ctx.backend.kill(handle, reason=f"no preflight event in {ctx.cfg.trainer.events_grace_s:g} s")
            if self.trigger.is_set():
                if ctx.backend.can_freeze:
                    ctx.backend.freeze(handle)  # idempotent; covers a line seen before launch returned
                if self.lose_node is not None:
                    return self.node_lost(handle, at_kill)
                return ctx.backend.kill(handle, reason=at_kill() if at_kill else self.kill_reason or "killed by drill")
            notice_ends = self.notice_ends()
            if notice_ends is not None and time.time() >= notice_ends:
                return ctx.backend.kill(handle, reason=f"preempted: the {self.ending.notice_s:g} s notice ran out")
            watching = self.kill_when is not None or self.ending.notice_s is not None  # a kill may come any moment
            step = 0.1 if watching else WATCH_EVERY_S
            for suspect in self.live.judge(time.time()):
                if (hung := self.suspected(handle, suspect)) is not None:
                    return ctx.backend.kill(handle, reason=hung)
            notes = handle.new_notes()
            if notes:
                ctx.ledger.note_leg(ctx.run_id, self.spec.leg, **notes)
            result = ctx.backend.wait(handle, timeout=min(step, max(0.0, give_up - time.time())))
            if result is not None:
                return result
            if time.time() >= give_up:
                return ctx.backend.kill(handle, reason=f"over budget ({budget_s / 60:.1f} min + grace)")


def run_leg(
    ctx: RunContext,
    leg: int,
    max_steps: int,
    kill_when: Callable[[str], bool] | None = None,
    at_kill: Callable[[], str] | None = None,
    ending: Ending = Ending(),
    lose_node: int | None = None,
    tap: Callable[[str, LegHandle], None] | None = None,
) -> LegOutcome:
    """Launch one leg on a fresh instance, wait within its budget, record it.

    Drills pass `kill_when`: on the first output line it accepts, the leg is
    frozen where it stands (if the backend can freeze), `at_kill` runs (it
    returns the kill's reason) and the instance is killed."""
    if ctx.ledger.stop_requested(ctx.run_id):
        raise RunStopped(f"`launcher stop {ctx.run_id}` asked this run to stop: leg {leg} was not launched")
    budget_s = ctx.cfg.rung(ctx.rung.name).budget_minutes * 60.0
    deadline = ctx.leg_deadline(budget_s if ending.deadline_s is None else min(budget_s, ending.deadline_s))
    log_path = ctx.run_dir / (f"leg-{leg}-straight.log" if ending.straight else f"leg-{leg}.log")
    env = ctx.leg_env(leg, max_steps, deadline, ending.after_resume_s) | ending_env(ending)
    if ending.straight:
        env[contract.RUN_ID] = f"{ctx.run_id}-straight-{leg}"
    spec = LegSpec(
        ctx.run_id,
        leg,
        ctx.rung.name,
        tuple(ctx.cfg.trainer.command),
        env,
        ctx.secrets(),
        ctx.files,
        log_path,
        ctx.gpus,
    )
    watch = _Watch(ctx, spec, deadline, ending, kill_when, lose_node, tap)
    try:
        handle = ctx.backend.launch(spec, on_line=watch.on_line, on_instance=watch.record)
    except BaseException:
        if watch.started:  # recorded, then the launch itself failed or was interrupted: nothing was started
            record_end(ctx, leg, None)
        raise
    result = None
    try:
        result = watch.wait(handle, budget_s, at_kill)
    except LauncherError:
        # the backend could not launch at all (sky: no cloud, no capacity): nothing ran, nothing billed
        result = LegResult(None, handle.started_at, time.time(), False, "not launched", billed_seconds=0.0)
        raise
    finally:
        if result is None:  # interrupted (Ctrl-C) or the launcher failed: the instance must not outlive us
            result = ctx.backend.kill(handle, reason="launcher interrupted")
        if result.killed:
            ctx.show(leg, f"launcher: leg {leg} killed ({result.end_reason})\n")
        watched = watch.live.record()
        ctx.ledger.note_leg(ctx.run_id, leg, watchdog=json.dumps(watched))
        record_end(ctx, leg, result)
    here = trainer_python(ctx.cfg.trainer.command) if ctx.backend.name == "local" else None
    return LegOutcome(result, LegEvents.read(leg, log_path), watch.acted_at, here, watched)


def record_end(ctx: RunContext, leg: int, result: LegResult | None) -> None:
    """The leg's end in the ledger, billed at what `ctx.billed` makes of it (the managed job's
    legs are ended here too); None: recorded, then its launch failed or was interrupted before
    anything started (nothing billed)."""
    if result is None:
        ctx.ledger.end_leg(
            ctx.run_id,
            leg,
            ended_at=time.time(),
            exit_code=None,
            killed=True,
            end_reason="launch interrupted before it started",
            billed_gpu_hours=0.0,
            cost_usd=0.0,
            billed_s=0.0,
        )
        return
    seconds, hours, cost, source = ctx.billed(result)
    ctx.ledger.end_leg(
        ctx.run_id,
        leg,
        ended_at=result.ended_at,
        exit_code=result.exit_code,
        killed=result.killed,
        end_reason=result.end_reason,
        billed_gpu_hours=hours,
        cost_usd=cost,
        cost_source=source,
        placement=result.placement,
        nodes=result.nodes,
        billed_s=seconds,
    )


def ledger_run_row(ctx: RunContext, review_id: int | None, files_digest: str, config_sha: str) -> dict[str, Any]:
    return {
        "id": ctx.run_id,
        "project": ctx.cfg.project,
        "rung": ctx.rung.name,
        "backend": ctx.backend.name,
        "gpu_name": ctx.gpus.name if ctx.gpus else None,
        "gpu_count": ctx.gpu_count,
        "nodes": ctx.nodes,
        "store_uri": ctx.store_uri,
        "review_id": review_id,
        "files_digest": files_digest,
        "config_sha256": config_sha,
        "started_at": time.time(),
    }

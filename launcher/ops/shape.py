"""The shape a launch trains in (its world size and gradient accumulation count), as far as the
plan can know it before anything is rented, and the refusal of a resume from a checkpoint that
was saved in another shape.

A checkpoint's manifest meta holds the shape it was saved in ("world_size", "accumulation",
"per_rank_batch": written by the framework adapters and the Session's sharded saves). A leg that
resumes it on another number of ranks, or with another accumulation count, does not go on with
the same run: each rank's data position and RNG belong to a rank that no longer exists, and one
scaled micro-batch becomes an optimizer step. The leg's own check refuses it at its resume (exit 3,
`shape_changed`); `resume_refusal` refuses it before a leg is rented, where the plan knows both
values. A value the plan cannot know is not guessed: a `python` command may start ranks of its
own (Lightning's launcher, `mp.spawn`), `accelerate launch` without `--num_processes` reads its
config file, and an accumulation count set in the code is seen by the leg alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from launcher.errors import Refused

if TYPE_CHECKING:
    from launcher.config.schema import Config, GpuSpec
    from runtime.store.base import CheckpointInfo, Store

ACCUMULATION_FLAGS = ("--gradient_accumulation_steps", "--gradient-accumulation-steps")
"""The HF `TrainingArguments` flag (either spelling argparse accepts) and `accelerate launch`'s own."""
NPROC_ENV = "PREFLIGHT_NPROC_PER_NODE"
"""The processes each node's `run:` script starts (the sky templates' rule: else one per GPU, else one)."""
TORCHRUN_FLAGS = ("--standalone", "--no-python", "--no_python", "--run-path", "--run_path")
"""torchrun's options that take no value (its script follows the options)."""


@dataclass(frozen=True)
class Shape:
    """What the plan knows of its legs' shape; None where it cannot know."""

    world_size: int | None = None
    world_from: str = ""
    """Where the world size comes from, as the refusal names it ("2 nodes x 2 processes ...")."""
    accumulation: int | None = None
    accumulation_from: str = ""

    def describe(self) -> str:
        """One line for the dry run: each value and where it comes from, or that the leg decides it."""
        world = f"{self.world_size} ranks ({self.world_from})" if self.world_size else "ranks unknown to the plan"
        acc = (
            f"gradient accumulation {self.accumulation} ({self.accumulation_from})"
            if self.accumulation
            else "accumulation unknown to the plan"
        )
        return f"shape: {world}, {acc}; a resume of another shape is refused"


def whole(text: str | None) -> int | None:
    """A whole number of 1 or more written as one ("4"), else None ("auto", "gpu", "1:2", "")."""
    return int(text) if text is not None and text.isdigit() and int(text) >= 1 else None


def flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value the last `--name VALUE` or `--name=VALUE` of `argv` gives (argparse's last wins)."""
    found = None
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def launcher_options(argv: Sequence[str]) -> list[str]:
    """The options before the script in `torchrun [opts] script ...` (a value after each option
    unless it holds `=` or takes none) or `accelerate launch [opts] script.py ...` (up to the
    first `.py` or `-m`: accelerate has too many flags without a value to tell them apart)."""
    if Path(argv[0]).name == "accelerate":
        rest = list(argv[2:])
        end = next((i for i, a in enumerate(rest) if a.endswith(".py") or a in ("-m", "--module")), len(rest))
        return rest[:end]
    rest, opts = list(argv[1:]), []
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "--module"):
        one = "=" in rest[0] or rest[0] in TORCHRUN_FLAGS or len(rest) < 2 or rest[1].startswith("-")
        take = 1 if one else 2
        opts, rest = opts + rest[:take], rest[take:]
    return opts


def command_processes(argv: Sequence[str]) -> tuple[int | None, str]:
    """The ranks a leg command starts on one node it runs alone, and how the plan knows."""
    head = Path(argv[0]).name if argv else ""
    opts = launcher_options(argv) if head in ("torchrun", "accelerate") else []
    if head == "torchrun":
        if flag_value(opts, ("--nnodes",)) not in (None, "1", "1:1"):
            return None, ""
        nproc = flag_value(opts, ("--nproc_per_node", "--nproc-per-node"))
        if nproc is None:
            return 1, "torchrun starts 1 process unless --nproc_per_node says more"
        return whole(nproc), f"torchrun --nproc_per_node {nproc}"
    if head == "accelerate" and argv[1:2] == ["launch"]:
        if "--cpu" in opts and flag_value(opts, ("--mpirun_hostfile",)) is None:
            return 1, "accelerate launch --cpu starts 1 process (its simple launcher)"
        n = flag_value(opts, ("--num_processes", "--num-processes"))
        return (whole(n), f"accelerate launch --num_processes {n}") if n is not None else (None, "")
    return None, ""


def node_processes(cfg: "Config", rung: str, gpus: "GpuSpec | None") -> tuple[int | None, str]:
    """The ranks each node's `run:` script starts (sky, or several nodes): the templates' rule,
    where the script follows it; the command's own launcher options are not used there."""
    from launcher.backends.sky.task import leg_script, task_envs

    if NPROC_ENV not in leg_script(cfg, rung):
        return None, ""
    said = task_envs(cfg, rung, cfg.leg_env).get(NPROC_ENV)
    if said is not None:
        return whole(said), f"{NPROC_ENV}={said}"
    if gpus is not None:
        return gpus.count, f"one per GPU of {gpus}"
    return 1, "one on a CPU node"


def planned_shape(cfg: "Config", rung: str, backend: str, nodes: int, gpus: "GpuSpec | None") -> Shape:
    """The shape the plan's legs train in: nodes x processes per node (the node script's rule on
    sky or several nodes, else the command's own), and the command line's accumulation count."""
    argv = list(cfg.trainer.command)
    on_nodes = backend == "sky" or nodes > 1
    per, how = node_processes(cfg, rung, gpus) if on_nodes else command_processes(argv)
    world = per * nodes if per is not None else None
    world_from = f"{nodes} nodes x {per} processes: {how}" if on_nodes and world else how
    steps = flag_value(argv, ACCUMULATION_FLAGS)
    accumulation = whole(steps)
    return Shape(world, world_from, accumulation, f"--gradient_accumulation_steps {steps}" if accumulation else "")


def saved_int(meta: dict[str, Any], key: str) -> int | None:
    """A whole number the manifest's meta holds under `key`, else None (not written, or not a number)."""
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def shape_differences(info: "CheckpointInfo", planned: Shape) -> list[str]:
    """Where the checkpoint's saved shape and the plan's differ, each naming both values."""
    meta, out = info.manifest.meta, []
    saved = saved_int(meta, "world_size")
    if saved is not None and planned.world_size is not None and saved != planned.world_size:
        out.append(f"was saved by {saved} ranks; this plan runs {planned.world_size} ({planned.world_from})")
    saved = saved_int(meta, "accumulation")
    if saved is not None and planned.accumulation is not None and saved != planned.accumulation:
        out.append(
            f"was saved with gradient accumulation {saved}; this plan accumulates {planned.accumulation} "
            f"({planned.accumulation_from})"
        )
    return out


def resume_refusal(store: "Store", planned: Shape) -> Refused | None:
    """The refusal (exit 3, one line) of a launch whose legs would resume the store's newest
    verified checkpoint in another shape; None when they may (no checkpoint, the same shape, or
    a value the plan or the checkpoint does not know: the leg's own check decides those)."""
    from runtime.store.base import newest_verified

    info = newest_verified(store)
    found = shape_differences(info, planned) if info is not None else []
    if not found:
        return None
    assert info is not None
    return Refused(
        f"the newest checkpoint {info.name} " + "; and ".join(found),
        hint="resume it in the shape it was saved in (resharding is not supported), or start a new run",
    )


def shape_warnings(cfg: "Config", request: Any) -> list[str]:
    """What the plan sees its legs would run otherwise than the command or the config says: shown by
    the dry run and at the launch alike (launcher.plan.Plan.warnings; `request` is its Request).
    A rung without legs: none."""
    if not request.rung.legs:
        return []
    rung, backend, nodes, gpus = request.rung.name, request.backend, request.nodes, request.gpus
    argv = list(cfg.trainer.command)
    head = Path(argv[0]).name if argv else ""
    said, how = command_processes(argv)
    if backend == "sky" or nodes > 1:
        per, per_how = node_processes(cfg, rung, gpus)
        if head == "torchrun" and said is not None and per is not None and said != per:
            return [
                f"warning: the command's torchrun options are not used on {nodes} node(s): each node's run: script "
                f"starts {per} process(es) ({per_how}), not {said} ({how}); set leg_env {NPROC_ENV}"
            ]
        return []
    out = []
    if NPROC_ENV in cfg.leg_env:
        out.append(
            f"warning: leg_env {NPROC_ENV} is read by the node script only (sky, --nodes 2 or more): a leg of "
            "one node runs the command as it is, which starts its own ranks"
        )
    if gpus is not None and said is not None and said < gpus.count:
        out.append(f"warning: the command starts {said} process(es) on {gpus} ({how}): GPUs left idle")
    return out


def nodes_awaited(argv: Sequence[str]) -> tuple[int, str]:
    """The nodes the command's own launcher waits for before its ranks start (torchrun's
    `--nnodes N` or `MIN:MAX`, `accelerate launch --num_machines N`), and the option that says so."""
    head = Path(argv[0]).name if argv else ""
    opts = launcher_options(argv) if head in ("torchrun", "accelerate") else []
    name = "--nnodes" if head == "torchrun" else "--num_machines"
    said = flag_value(opts, (name, name.replace("_", "-"))) if opts else None
    return (whole((said or "").split(":")[0]) or 1), f"{head} {name} {said}"


def refuse_unrunnable(cfg: "Config", request: Any) -> None:
    """Refuse (exit 3, one line) a leg shape that cannot run, before anything is rented, in the dry
    run and the launch alike (launcher.plan.make_plan). A command waiting for more nodes than the
    leg has: its rendezvous waits (measured: torchrun --nnodes 2 on one node still waiting after
    40 s; its join timeout is 600 s), and the leg runs to its budget. `accelerate launch` under the
    node script (sky, or several nodes): that script runs `torchrun [its options] <the command after
    its interpreter>`, so torchrun would start `accelerate` as a Python file and fail on every node."""
    if not request.rung.legs:
        return
    argv = list(cfg.trainer.command)
    if request.backend == "sky" or request.nodes > 1:
        if argv and Path(argv[0]).name == "accelerate":
            raise Refused(
                f"`accelerate launch` cannot start a leg of {request.nodes} node(s) on {request.backend}: each "
                "node's run: script starts torchrun itself with the command after its interpreter",
                hint="use `torchrun train.py ...` (each node starts PREFLIGHT_NPROC_PER_NODE ranks, else one per "
                "GPU), or one node on the local or docker backend",
            )
        return
    waits, how = nodes_awaited(argv)
    if waits > 1:
        raise Refused(
            f"the command's `{how}` waits for {waits} nodes; this plan runs 1 (--nodes {request.nodes} on "
            f"{request.backend}): its rendezvous would wait until the leg's budget",
            hint=f"launch with --nodes {waits} (each node's run: script starts torchrun), or drop the option",
        )

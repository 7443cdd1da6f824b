"""Render a rung's SkyPilot task YAML for one leg, check it, and validate it with SkyPilot.

The templates live in `sky/<rung>.yaml` (a project's own `sky/` overrides the
launcher's). Per leg this fills in what only the launcher knows — accelerators,
nodes, the pinned image, the leg environment, the placement leg 0 got — adds the
backstops that keep a cluster from outliving its launcher (autostop with down,
and a hard wall-clock cap around `run`, since autostop waits for the job to
end), writes the result next to the leg's log, and validates it with
`sky.Task.from_yaml` before anything launches.

Secrets are never in the file. In SkyPilot 0.14 a `secrets: {NAME: null}` entry
is a reference to a managed secrets provider, which `Task.update_secrets` does
not clear, and the API server refuses the launch ("No value available for
secret(s)"); so a template's null entries are dropped here and the values are
given to the in-memory task at launch (`task_for_launch`). SkyPilot's validation
is weak in places (it accepts `T44:2` and a missing local mount source), so
those are checked here first.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from launcher.config.schema import Config, GpuSpec
from launcher.errors import BadInput
from runtime.contract import EXIT_PREEMPTED

SOURCE_SKY = Path(__file__).resolve().parents[3] / "sky"
# Accelerator names SkyPilot's catalogs use (case-insensitive). SkyPilot itself
# accepts any name and fails only when it looks for a cloud offering it.
KNOWN_ACCELERATORS = {
    "T4",
    "L4",
    "L40",
    "L40S",
    "A10",
    "A10G",
    "A40",
    "A100",
    "A100-80GB",
    "H100",
    "H100-MEGA",
    "H100-SXM",
    "H200",
    "B200",
    "GH200",
    "V100",
    "V100-32GB",
    "P100",
    "P4",
    "K80",
    "M60",
    "RTX4090",
    "RTX3090",
    "RTXA4000",
    "RTXA5000",
    "RTXA6000",
    "MI300X",
    "A6000",
    "A5000",
    "A4000",
    "tpu-v2-8",
    "tpu-v3-8",
    "tpu-v4-8",
    "tpu-v5e-8",
    "tpu-v5p-8",
    "tpu-v6e-8",
}
IMAGE_REF = re.compile(r"^docker:[\w./:-]+(@sha256:[0-9a-f]{64})?$")
AUTOSTOP_IDLE_MINUTES = 10
"""The cluster downs itself this long after its job ended, if nobody did it sooner."""
HARD_CAP_KILL_AFTER_S = 120
"""After the hard cap's SIGTERM, SIGKILL this much later (the trainer pushes its final checkpoint first)."""
HARD_CAP_GRACE_S = 600
"""The hard cap: the leg's deadline plus this (the trainer stops itself at the deadline)."""
DOCKER_LOGIN_VARS = ("SKYPILOT_DOCKER_USERNAME", "SKYPILOT_DOCKER_PASSWORD", "SKYPILOT_DOCKER_SERVER")
"""A private registry's credentials: passed like the other secrets, all three or none."""


@dataclass(frozen=True)
class RenderedTask:
    path: Path
    sha256: str
    yaml_text: str
    run_sha256: str = ""
    """The sha256 of its `run:` script, which every node executes (`script_sha256`)."""


def template_path(cfg: Config, rung: str) -> Path:
    own = cfg.root / "sky" / f"{rung}.yaml"
    path = own if own.is_file() else SOURCE_SKY / f"{rung}.yaml"
    if not path.is_file():
        raise BadInput(f"no SkyPilot task template for rung {rung!r} ({path})")
    return path


def check_accelerator(gpus: GpuSpec) -> None:
    if gpus.name.lower() not in {a.lower() for a in KNOWN_ACCELERATORS}:
        raise BadInput(
            f"--gpus: unknown accelerator {gpus.name!r}: SkyPilot would accept it and fail at launch "
            f"(known: {', '.join(sorted(KNOWN_ACCELERATORS)[:12])}, ...)"
        )


def train_args(command: list[str]) -> str:
    """The script and its arguments from the trainer command: the sky YAML's
    `run` starts torchrun itself, across nodes and GPUs."""
    argv = list(command)
    if argv and Path(argv[0]).name.startswith("python"):
        argv = argv[1:]
    elif argv and Path(argv[0]).name == "torchrun":
        argv = argv[1:]
        while argv and argv[0].startswith("-") and argv[0] not in ("-m", "--module"):
            argv = argv[1:] if "=" in argv[0] or argv[0] == "--standalone" else argv[2:]
    return shlex.join(argv)


def render(
    cfg: Config,
    rung: str,
    *,
    gpus: GpuSpec | None,
    nodes: int,
    image_ref: str,
    leg_env: dict[str, str],
    out: Path,
    hard_stop: float | None = None,
    pin: dict[str, str] | None = None,
) -> RenderedTask:
    """Fill the rung's template for one leg and write it to `out`.

    `hard_stop` (unix seconds): the run command is killed then, whatever the
    trainer does. `pin`: cloud / region / zone / instance_type for this leg (the
    placement leg 0 got), so the legs of one rung run on the same kind of machine."""
    task = _filled(cfg, rung, gpus=gpus, nodes=nodes, image_ref=image_ref, leg_env=leg_env, pin=pin)
    task["resources"]["autostop"] = {"idle_minutes": AUTOSTOP_IDLE_MINUTES, "down": True}
    if hard_stop is not None:
        task["envs"]["PREFLIGHT_HARD_STOP"] = str(int(hard_stop))
        task["run"] = leg_script(cfg, rung)
    return _write(task, cfg, out)


def template(cfg: Config, rung: str) -> dict[str, Any]:
    """The rung's task template, parsed (a project's own sky/ first)."""
    import yaml

    loaded = yaml.safe_load(template_path(cfg, rung).read_text()) or {}
    if not isinstance(loaded, dict):
        raise BadInput(f"sky/{rung}.yaml is not a mapping")
    return loaded


def leg_script(cfg: Config, rung: str) -> str:
    """The `run:` script of one leg of `rung`, byte for byte as the sky backend renders it (the
    template's, under the hard cap): what SkyPilot runs on every node, and what the local and
    docker backends run on each of theirs for a leg of several nodes (launcher.backends.nodes)."""
    return hard_capped(str(template(cfg, rung).get("run") or ""))


def script_sha256(script: str) -> str:
    """The sha256 the ledger records of an executed `run:` script."""
    return hashlib.sha256(script.encode()).hexdigest()


def task_envs(cfg: Config, rung: str, leg_env: Mapping[str, str], hard_stop: float | None = None) -> dict[str, str]:
    """The `envs:` of one leg's task: the template's, the leg environment, the trainer's
    arguments (LAUNCHER_TRAIN_ARGS) and, under the hard cap, when it falls (PREFLIGHT_HARD_STOP)."""
    envs = {
        **{str(k): str(v) for k, v in (template(cfg, rung).get("envs") or {}).items()},
        **leg_env,
        "LAUNCHER_TRAIN_ARGS": train_args(cfg.trainer.command),
    }
    if hard_stop is not None:
        envs["PREFLIGHT_HARD_STOP"] = str(int(hard_stop))
    return envs


def render_job(
    cfg: Config,
    *,
    gpus: GpuSpec | None,
    nodes: int,
    image_ref: str,
    leg_env: dict[str, str],
    out: Path,
    job_deadline: float,
    leg_budget_s: float,
    max_restarts: int,
) -> RenderedTask:
    """The run as ONE SkyPilot managed job: `resources.job_recovery` with the config's
    max_restarts_on_errors, spot first with on-demand fallback (the template's `ordered`),
    and a deadline that belongs to the job, not to one recovery.

    SkyPilot relaunches the same task on every recovery, envs unchanged, so an absolute
    LAUNCHER_DEADLINE fixed at submission would make a late recovery stop at once. Each
    attempt computes its own: its leg budget from now, never past the job's deadline
    (what the quota allows); the hard cap follows it. No autostop: SkyPilot's jobs
    controller downs each recovery's cluster itself (it overrides any autostop)."""
    task = _filled(cfg, "run", gpus=gpus, nodes=nodes, image_ref=image_ref, leg_env=leg_env, pin=None)
    resources = task["resources"]
    resources.pop("autostop", None)
    recovery = resources.get("job_recovery")
    recovery = {"strategy": recovery} if isinstance(recovery, str) else dict(recovery or {})
    if str(recovery.get("strategy", "")).lower() == "none":
        raise BadInput(
            "sky/run.yaml: job_recovery.strategy none drops max_restarts_on_errors: the run needs "
            "recovery (FAILOVER or EAGER_NEXT_REGION)"
        )
    recovery["max_restarts_on_errors"] = max_restarts
    codes = recovery.get("recover_on_exit_codes")
    codes = [codes] if isinstance(codes, int) else list(codes or [])
    recovery["recover_on_exit_codes"] = codes + [EXIT_PREEMPTED] * (EXIT_PREEMPTED not in codes)
    resources["job_recovery"] = recovery
    task["envs"].pop("LAUNCHER_DEADLINE", None)
    task["envs"]["PREFLIGHT_JOB_DEADLINE"] = str(int(job_deadline))
    task["envs"]["PREFLIGHT_LEG_BUDGET_S"] = str(int(leg_budget_s))
    task["run"] = attempt_deadline(str(task.get("run") or ""))
    return _write(task, cfg, out)


def attempt_deadline(run: str) -> str:
    """`run` for a managed job: each attempt's LAUNCHER_DEADLINE is its own leg budget from
    now, capped at the job's deadline; the hard cap is that plus grace."""
    return (
        "# preflight: this attempt's deadline (a recovery gets its own budget, never past the job's)\n"
        "now=$(date +%s)\n"
        "LAUNCHER_DEADLINE=$(( now + PREFLIGHT_LEG_BUDGET_S ))\n"
        '[ "$LAUNCHER_DEADLINE" -le "$PREFLIGHT_JOB_DEADLINE" ] || LAUNCHER_DEADLINE=$PREFLIGHT_JOB_DEADLINE\n'
        "export LAUNCHER_DEADLINE\n"
        f'left=$(( LAUNCHER_DEADLINE + {HARD_CAP_GRACE_S} - now )); [ "$left" -gt 0 ] || left=1\n' + watched(run)
    )


def _filled(
    cfg: Config,
    rung: str,
    *,
    gpus: GpuSpec | None,
    nodes: int,
    image_ref: str,
    leg_env: dict[str, str],
    pin: dict[str, str] | None,
) -> dict[str, Any]:
    task: dict[str, Any] = copy.deepcopy(template(cfg, rung))
    resources = task.setdefault("resources", {})
    if gpus is not None:
        check_accelerator(gpus)
        resources["accelerators"] = f"{gpus.name}:{gpus.count}"
    else:
        resources.pop("accelerators", None)
    if not IMAGE_REF.match(f"docker:{image_ref}"):
        raise BadInput(f"image reference {image_ref!r} is not repo[:tag][@sha256:<digest>]")
    resources["image_id"] = f"docker:{image_ref}"
    resources.update({k: v for k, v in (pin or {}).items() if v})
    task["num_nodes"] = nodes
    task["envs"] = task_envs(cfg, rung, leg_env)
    task["secrets"] = _template_secrets(task.get("secrets"), rung)
    if not task["secrets"]:
        del task["secrets"]
    return task


def _write(task: dict[str, Any], cfg: Config, out: Path) -> RenderedTask:
    import yaml

    check_mounts(task, cfg.root)
    text = yaml.dump(task, Dumper=_block_dumper(), sort_keys=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    validate(out)
    return RenderedTask(out, hashlib.sha256(text.encode()).hexdigest(), text, script_sha256(str(task.get("run") or "")))


def _template_secrets(entries: Any, rung: str) -> dict[str, Any]:
    """A template's `secrets:`: null entries (SkyPilot's managed-secret references,
    which no provider here resolves) are dropped, the names belong in launcher.yaml;
    a value written in the file is refused."""
    written = [name for name, value in (entries or {}).items() if value is not None]
    if written:
        raise BadInput(
            f"sky/{rung}.yaml: secrets.{written[0]} holds a value: a secret is never written to a task file",
            hint="list its name under `secrets:` in launcher.yaml and export it",
        )
    return {}


def hard_capped(run: str) -> str:
    """`run` under a wall-clock cap at $PREFLIGHT_HARD_STOP: SIGTERM then (the trainer's
    final push) SIGKILL. Autostop only counts idle time once the job has ended, so a
    trainer that never stops would keep the cluster billing without this.

    `--foreground`: without it `timeout` moves itself and the trainer into a process group
    of their own, out of the job's, and SkyPilot's graceful cancel (SIGTERM to the job's
    process group) would reach nothing: the trainer would push no final checkpoint before
    its cluster is torn down (the strict stand-in caught this). In the job's group, the
    SIGTERM reaches torchrun, which hands it to its workers; the cap itself still fires,
    and --kill-after still kills."""
    return (
        "# preflight: the hard cap (the leg's deadline + grace); autostop downs the cluster after it\n"
        'left=$(( PREFLIGHT_HARD_STOP - $(date +%s) )); [ "$left" -gt 0 ] || left=1\n' + watched(run)
    )


def watched(run: str) -> str:
    """`run` under the hard cap ($left seconds), the spot notice watcher beside it.

    SkyPilot 0.14.1 passes a job no spot notice (docs/notes-preemption.md), so every leg runs
    runtime/programs/notice.py: it polls the cloud's metadata service and on a notice SIGTERMs the job's
    process group, as SkyPilot's graceful cancel does. The shell stays (no `exec`) to turn a stop
    on a notice into exit EXIT_PREEMPTED, which the managed job's `recover_on_exit_codes` names
    (a trainer's SIGTERM stop exits 0, and a job that exits 0 is done). A SIGTERM to the shell
    alone (`docker kill --signal TERM` reaches a container's main process only) is handed to
    `timeout`, which hands it to the trainer, as when `timeout` was the main process; the shell
    then waits on (a `wait` a trapped signal cut short is waited again while the child lives)
    and exits with the trainer's status.
    The watcher (it ignores SIGTERM) is killed once the trainer has ended: it holds the leg's
    output open, and it wrote its mark before it signalled, so before the trainer stopped."""
    return (
        "# preflight: the spot notice watcher (SkyPilot passes none; runtime/programs/notice.py)\n"
        'mark=$(mktemp -u "${TMPDIR:-/tmp}/preflight-notice.XXXXXX")\n'
        'python -m runtime.programs.notice --mark "$mark" --parent $$ & watcher=$!\n'
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM\n"
        f'timeout --foreground --signal=TERM --kill-after={HARD_CAP_KILL_AFTER_S} "$left" bash -c {shlex.quote(run)} &\n'
        "child=$!\n"
        'while :; do wait "$child"; rc=$?; [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null && continue; break; done\n'
        'kill -KILL "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null\n'
        f'[ -e "$mark" ] && exit {EXIT_PREEMPTED}\n'
        "exit $rc\n"
    )


def task_for_launch(sky: Any, path: Path, secrets: dict[str, str]) -> Any:
    """The rendered file as SkyPilot's Task, with the secrets' values given in memory
    (never written to disk), a private registry's login among them when exported."""
    import os

    task = sky.Task.from_yaml(str(path))
    login = {name: os.environ[name] for name in DOCKER_LOGIN_VARS if os.environ.get(name)}
    if login and len(login) != len(DOCKER_LOGIN_VARS):
        raise BadInput(
            f"a private registry needs all of {', '.join(DOCKER_LOGIN_VARS)}; only {', '.join(sorted(login))} set"
        )
    values = {**secrets, **login}
    if values:
        task.update_secrets(values)
    return task


def _block_dumper() -> type:
    import yaml

    class BlockDumper(yaml.SafeDumper):
        """Multi-line strings (setup, run) as literal blocks, as a person writes them."""

    def str_block(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, str_block)
    return BlockDumper


def check_mounts(task: dict[str, Any], root: Path) -> None:
    """A local file_mounts source must exist (SkyPilot only finds out at launch)."""
    for target, source in (task.get("file_mounts") or {}).items():
        if isinstance(source, str) and "://" not in source:
            path = Path(source).expanduser()
            path = path if path.is_absolute() else root / path
            if not path.exists():
                raise BadInput(f"sky task file_mounts.{target}: local source {source} does not exist")


def sky_module() -> Any:
    try:
        import sky
    except ImportError:
        raise BadInput(
            "skypilot is not installed", hint="pip install 'preflight-launcher[sky]' (skypilot 0.14.1)"
        ) from None
    return sky


def validate(path: Path) -> None:
    """SkyPilot's own parser must accept the rendered file; its reason, in one line, if not."""
    sky = sky_module()
    try:
        sky.Task.from_yaml(str(path))
    except Exception as err:  # noqa: BLE001 - any rejection is bad input, in SkyPilot's words
        reason = " ".join(str(err).split())[:300]
        raise BadInput(f"SkyPilot rejects {path.name}: {reason}") from None

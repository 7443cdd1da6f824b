"""A run's peak memory per rank, predicted on this host before a GPU is rented: the trainer's
own command, on its reviewed files, through runtime.programs.memory (fake tensors, torch's fake
process group), in the trainer's interpreter.

A prediction is a function of its inputs: the reviewed files' bytes, the command, the world size,
the rank and the interpreter (its torch). It is kept under that key in this host's cache
($PREFLIGHT_CACHE_DIR, else $XDG_CACHE_HOME/preflight-launcher, else ~/.cache/preflight-launcher),
so one prediction serves the dry run, the launch, the next rung and `launcher memory`; any byte
changed is another key.

Which ranks: every rank of a world of up to 4; past that rank 0 and the last (ranks of DDP hold
the same; FSDP2's differ where the shards are uneven, and the last rank holds the remainder).
Rank 0 runs first and alone, in the folder the others then share: a script whose local rank 0
prepares something (a corpus file) before a barrier has it there for them, as on a node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from launcher.backends.local import resolve_command, trainer_python
from launcher.checks.memfit import GPU_MEMORY_MIB
from launcher.config.schema import Config
from launcher.manifest import reviewed_paths, stage_files
from runtime.hashing import digest_lines

GPU_NAMES = tuple(GPU_MEMORY_MIB)
PREDICT_TIMEOUT_S = 300.0
CACHE_VERSION = 2
"""Part of every cache key: a launcher whose prediction changes what it records bumps it."""
EVERY_RANK_UP_TO = 4
PARALLEL = 2


@dataclass(frozen=True)
class Prediction:
    """What the prediction found for one world size: a result per rank predicted (ranks whose
    script failed carry `ended: error`), and how it was had."""

    world_size: int
    results: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.results if not _made(r)]

    @property
    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.results if _made(r)]


def _made(result: dict[str, Any]) -> bool:
    """A rank's result that holds a prediction (not a script's failure)."""
    return result.get("ended") != "error" and "peak_bytes" in result


def ranks_of(world_size: int) -> list[int]:
    if world_size <= EVERY_RANK_UP_TO:
        return list(range(world_size))
    return [0, world_size - 1]


def cache_dir() -> Path:
    env = os.environ
    if env.get("PREFLIGHT_CACHE_DIR"):
        return Path(env["PREFLIGHT_CACHE_DIR"]) / "memory"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "preflight-launcher" / "memory"


def _key(reviewed: dict[str, str], command: list[str], python: str, world_size: int, rank: int, undo: bool) -> str:
    facts = {"v": CACHE_VERSION, "files": digest_lines(reviewed), "command": command, "python": python}
    facts |= {"world": world_size, "rank": rank} | ({"no_checkpoint": True} if undo else {})
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _cached(key: str) -> dict[str, Any] | None:
    try:
        result = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and _made(result) else None


def _keep(key: str, result: dict[str, Any]) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(result, sort_keys=True))
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written costs a prediction next time, nothing more


def predict(cfg: Config, reviewed: dict[str, str], world_size: int, undo: bool = False) -> Prediction:
    """The prediction for `world_size` ranks: from this host's cache where the same files, command
    and interpreter were predicted at this size, else made now (and kept). `undo`: with activation
    checkpointing undone (the headroom statement)."""
    command = list(cfg.trainer.command)
    python = trainer_python(cfg.trainer.command)
    keys = {r: _key(reviewed, command, python, world_size, r, undo) for r in ranks_of(world_size)}
    known = {r: hit for r, k in keys.items() if (hit := _cached(k)) is not None}
    todo = [r for r in keys if r not in known]
    if not todo:
        return Prediction(world_size, [known[r] for r in keys], cached=True)
    began = time.perf_counter()
    with _saying(
        f"memory: predicting {len(todo)} of {world_size} rank(s) on this CPU, "
        f"{'checkpointing undone, ' if undo else ''}the script's first optimizer steps on fake tensors ..."
    ):
        made = {int(r["rank"]): r for r in _run(cfg, python, reviewed, world_size, todo, undo)}
    for rank, result in made.items():
        if _made(result):
            _keep(keys[rank], result)
    by_rank = {**known, **made}
    return Prediction(world_size, [by_rank[r] for r in keys], time.perf_counter() - began)


@contextlib.contextmanager
def _saying(line: str) -> Iterator[None]:
    """A transient line on a terminal's stderr while the prediction runs (seconds: the script's
    imports and setup), wiped when it ends; nothing where stderr is not a terminal, so a refusal's
    first line stays its `error:` line."""
    tty = sys.stderr.isatty()
    if tty:
        sys.stderr.write(line[: shutil.get_terminal_size().columns - 1])
        sys.stderr.flush()
    try:
        yield
    finally:
        if tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _run(
    cfg: Config, python: str, reviewed: dict[str, str], world_size: int, ranks: list[int], undo: bool
) -> list[dict[str, Any]]:
    """Each rank's prediction, rank 0 first and alone, then PARALLEL at a time, in a folder holding
    only the reviewed files."""
    leg_argv = resolve_command(cfg.trainer.command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    env.update(cfg.leg_env)
    rest = [r for r in ranks if r != 0]
    batches = ([[0]] if 0 in ranks else []) + [rest[i : i + PARALLEL] for i in range(0, len(rest), PARALLEL)]
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="launcher-memory-") as tmp:
        root = Path(tmp)
        stage_files({rel: p for rel, p in reviewed_paths(cfg).items() if rel in reviewed}, reviewed, root)
        for batch in batches:
            procs = []
            for rank in batch:
                result, said = root / ".memory" / f"rank-{rank}.json", root / ".memory" / f"rank-{rank}.err"
                said.parent.mkdir(exist_ok=True)
                argv = [python, "-m", "runtime.programs.memory", "predict", "--world", str(world_size)]
                argv += ["--rank", str(rank), "--out", str(result), "--timeout", str(PREDICT_TIMEOUT_S)]
                argv += ["--no-checkpoint", "--"] if undo else ["--"]
                with said.open("w") as err:
                    proc = subprocess.Popen(
                        argv + leg_argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err,
                        stdin=subprocess.DEVNULL,
                    )  # fmt: skip
                procs.append((rank, result, said, proc))
            for rank, result, said, proc in procs:
                try:
                    proc.wait(timeout=PREDICT_TIMEOUT_S + 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                out.append(_read(rank, world_size, result, proc.returncode, said))
    return out


def _read(rank: int, world_size: int, path: Path, code: int | None, said: Path) -> dict[str, Any]:
    try:
        result = json.loads(path.read_text())
        if isinstance(result, dict) and "ended" in result:
            return result
    except (OSError, json.JSONDecodeError):
        pass
    err = said.read_text(errors="replace") if said.exists() else ""
    tail = err.strip().splitlines()[-1:] or [f"exit {code}, no result"]
    return {"rank": rank, "world_size": world_size, "ended": "error", "error": tail[0][:300]}


@dataclass(frozen=True)
class MemoryDecision:
    """The memory guard's reading: the prediction, each predicted rank against the GPU, and the
    world size it was predicted at (and where that came from)."""

    prediction: Prediction
    fits: list[Any]
    world_from: str
    guard: str = "refuse"
    """launcher.yaml's memory.guard: `warn` launches a rank predicted not to fit (with its warning)."""
    headroom: dict[str, Any] = field(default_factory=dict)
    """What the memory would allow instead (launcher.ops.headroom): `checkpointing`, `micro_batch`."""

    def lines(self) -> list[str]:
        p = self.prediction
        ranks = f"{p.world_size} rank" + ("s" if p.world_size != 1 else "")
        head = f"memory: {ranks} ({self.world_from}), " + (
            "as predicted before for these files and this command" if p.cached else f"predicted in {p.seconds:.1f} s"
        )
        out = [head] + [f"  {fit.line()}" for fit in self.fits]
        out += [f"  rank {r['rank']}: no prediction ({r.get('error')})" for r in p.failures]
        return out + [f"  {h['line']}" for h in self.headroom.values()]

    @property
    def worst(self) -> Any:
        """The rank (memfit.Fit) furthest over its card; None where every rank fits or none is judged."""
        over = [f for f in self.fits if f.fits is False]
        return max(over, key=lambda f: f.needed - (f.capacity or 0)) if over else None

    def warnings(self) -> list[str]:
        """A rank predicted not to fit where memory.guard is `warn`: the launch goes ahead, saying so."""
        worst = self.worst
        if worst is None or self.guard != "warn":
            return []
        return [f"warning: memory.guard is warn: it would not fit on a {worst.gpu}: {worst.line()}"]

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.prediction.world_size,
            "world_from": self.world_from,
            "cached": self.prediction.cached,
            "ranks": [
                {"rank": f.rank, "gpu": f.gpu, "capacity": f.capacity, "peak": f.peak, "categories": f.categories,
                 "allowance": f.allowance.parts, "needed": f.needed, "fits": f.fits}
                for f in self.fits
            ] + [{"rank": r["rank"], "error": r.get("error")} for r in self.prediction.failures],
            "headroom": self.headroom,
            "guard": self.guard,
        }  # fmt: skip


def project_margin(cfg: Config, ledger: Any) -> float:
    """The largest under-prediction this project's GPU rungs have measured (launcher.checks.memscore),
    0 with no ledger or no GPU measurement yet."""
    from launcher.checks.memscore import margin

    if ledger is None:
        return 0.0
    return margin([run for run in ledger.runs() if run["project"] == cfg.project])


def _reading(
    cfg: Config, rung: str, backend: str, nodes: int, gpus: Any, reviewed: dict[str, str], margin: float
) -> MemoryDecision:
    """Each rank of the world the plan would launch (its shape, else one rank per GPU) predicted and
    set against `gpus`' card, the allowance grown by `margin`."""
    from launcher.checks.memfit import fits
    from launcher.ops.headroom import headroom
    from launcher.ops.shape import planned_shape

    shape = planned_shape(cfg, rung, backend, nodes, gpus)
    world = shape.world_size or gpus.count * nodes
    world_from = shape.world_from if shape.world_size else f"one per GPU of {nodes} x {gpus}"
    prediction = predict(cfg, reviewed, world)
    now = fits(gpus.name, prediction.ok, margin)
    statements = headroom(prediction.ok, now, gpus.name, margin, lambda: predict(cfg, reviewed, world, undo=True).ok)
    return MemoryDecision(prediction, now, world_from, cfg.memory.guard, statements)


def guard(cfg: Config, request: Any, reviewed: dict[str, str], ledger: Any = None) -> MemoryDecision | None:
    """The memory guard of a GPU rung: refused (exit 3, the numbers in one line) where a rank's
    predicted peak plus its allowance exceeds the GPU asked for. A script the prediction cannot
    run is not refused: the decision says why there is no prediction. memory.guard `warn`: never
    refused (the decision's warnings say it); `off`: nothing predicted (None)."""
    from launcher.errors import Refused

    if cfg.memory.guard == "off":
        return None
    margin = project_margin(cfg, ledger)
    decision = _reading(cfg, request.rung.name, request.backend, request.nodes, request.gpus, reviewed, margin)
    worst = decision.worst
    if worst is not None and cfg.memory.guard == "refuse":
        raise Refused(
            f"it would not fit on a {worst.gpu}: {worst.line()}",
            hint="`launcher memory --gpus ...` shows every rank; a smaller micro-batch, activation checkpointing, "
            "sharding (FSDP2) or a larger GPU would bring it under (memory.guard: warn in launcher.yaml launches "
            "it anyway, recorded)",
        )
    return decision


def ask(cfg: Config, gpus: str, nodes: int) -> MemoryDecision:
    """`launcher memory`: the memory guard's reading for `gpus` per node on `nodes` nodes (checked
    by the caller), on the files as they are now (no review needed: nothing is launched)."""
    from launcher.config.schema import parse_gpus
    from launcher.errors import BadInput
    from launcher.ledger.db import Ledger
    from launcher.manifest import hash_reviewed

    spec = parse_gpus(gpus)
    if spec.name.upper() not in GPU_NAMES:
        raise BadInput(f"no memory is listed for GPU type {spec.name!r} (listed: {', '.join(GPU_NAMES)})")
    ledger = Ledger.open_existing(cfg.state_path / "ledger.db")
    try:
        margin = project_margin(cfg, ledger)
    finally:
        if ledger is not None:
            ledger.close()
    return _reading(cfg, "probe", "sky" if nodes > 1 else "local", nodes, spec, hash_reviewed(cfg), margin)

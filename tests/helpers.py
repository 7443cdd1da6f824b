"""Helpers the tests share (fixtures stay in conftest.py): the CLI runner, the one
config-editing helper, one-line-error assertions, a Hub store on the loopback server, and the
checks of a run selected by their `Kind`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

LAUNCHER = Path(sys.executable).with_name("launcher")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> Result:
    full_env = dict(os.environ)
    full_env.pop("LAUNCHER_DEBUG", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [str(LAUNCHER), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def edit_config(
    root: Path, mutate: Callable[[dict[str, Any]], object] | None = None, /, **changes: object
) -> dict[str, Any]:
    """Edit a project's launcher.yaml in place: each `a__b=value` sets data["a"]["b"] (making
    the parents), then `mutate(data)` may change anything else. Returns the data written."""
    path = root / "launcher.yaml"
    data = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    if mutate is not None:
        mutate(data)
    path.write_text(yaml.safe_dump(data))
    return data


def run_rows(project: Path) -> int:
    """How many runs the project's ledger holds (0 when there is no ledger)."""
    db = project / ".launcher" / "ledger.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def assert_one_line_error(res: Result, code: int, *needles: str) -> None:
    """Exit `code`, an `error:` line naming the needles, and never a traceback."""
    assert res.code == code, (res.code, res.out, res.err)
    assert "Traceback" not in res.err + res.out
    first = res.err.strip().splitlines()[0]
    assert first.startswith("error: "), res.err
    for needle in needles:
        assert needle in first, (needle, first)


def hub_store(
    server,
    namespace: str = "runs/r1",
    *,
    token: str = "hf_good",
    timeout_s: float = 10.0,  # noqa: ANN001
    repo: str = "tester/ckpts",
    key: bytes | None = None,
):
    """A HubStore on the loopback server, with retries short enough for tests."""
    from runtime.store.hub import HubStore
    from runtime.store.retry import RetryPolicy

    return HubStore(
        f"hf://{repo}",
        namespace,
        token=token,
        endpoint=server.url,
        timeout_s=timeout_s,
        retry=RetryPolicy(attempts=4, base_s=0.01, max_backoff_s=0.05, deadline_s=10),
        key=key,
    )


def plant_crash_at_step_12(train_py: str) -> str:
    """The reference trainer's source with a batch that brings it down after step 12, every leg
    (an OOM on one long sample, say), once the storage cycle of the checkpoints it already handed
    over (steps 5 and 10 at --ckpt-every 5) is through: the crash lands at a known point of the
    cycle, not wherever a loaded machine happened to have it (else step 10 can be lost with it)."""
    hook = "        x, y, first_sample = data.next_batch()\n"
    assert train_py.count(hook) == 1, "the reference trainer's loop moved: update the planted crash"
    return train_py.replace(
        hook,
        hook + "        if sess.step_count == 12:\n"
        "            sess.pusher.queue.join()\n            raise SystemExit(7)\n",
    )


SKY_IMAGE_REF = "localhost:5000/preflight/demo@sha256:" + "ab" * 32
"""A pushed image the sky tests' ledgers record (no registry is contacted)."""


def sky_server_of():  # noqa: ANN201 - tests.fakes.sky_server.SkyServer
    """The session's SkyPilot API server (to switch which clouds it has enabled)."""
    from tests.fakes.sky_server import SESSION

    return SESSION[-1]


def checks_of(src: Any, kind: str | None = None, *, leg: int | None = None, ok: bool | None = None) -> list[dict]:
    """The checks in `src` of `kind` (every kind if None), of leg `leg` and passed or not where
    given. `src` is a command's Result (its `--json` output), that output or a ledger run (a dict
    with "checks"), a list of checks as JSON, or launcher `Check`s. Tests select checks by their
    `Kind` (launcher/checks/evidence.py), never by their wording, which is free to change
    (tests/unit/test_tests_by_kind.py holds the tests to that)."""
    if isinstance(src, Result):
        src = src.json()
    if isinstance(src, dict):
        src = src["checks"]
    rows = [c if isinstance(c, dict) else c.to_json() for c in getattr(src, "checks", src)]
    return [
        c
        for c in rows
        if (kind is None or c.get("kind") == kind)
        and (leg is None or c.get("leg") == leg)
        and (ok is None or bool(c["ok"]) == ok)
    ]


def check(src: Any, kind: str, *, leg: int | None = None, ok: bool | None = None) -> dict:
    """The one check in `src` of `kind` (and `leg`, `ok` where given); fails naming what there is
    when none or several match."""
    found = checks_of(src, kind, leg=leg, ok=ok)
    if len(found) != 1:
        have = [(c.get("kind"), c.get("leg"), c["ok"], c["name"]) for c in checks_of(src)]
        raise AssertionError(f"{len(found)} checks of kind {kind} leg {leg} ok {ok}, not one, among {have}")
    return found[0]


def failed(src: Any) -> list[dict]:
    """The checks in `src` that did not pass: a source for `check` and `checks_of` by kind."""
    return checks_of(src, ok=False)


def details(src: Any, kind: str, *, leg: int | None = None, ok: bool | None = None) -> str:
    """The details of every check of `kind` in `src` (and `leg`, `ok` where given), one a line:
    for a kind several checks share (the trainer's static checks, the state digests of each
    kind of object) and a test that asserts what one of them says. Fails when none matches."""
    found = checks_of(src, kind, leg=leg, ok=ok)
    assert found, (
        f"no check of kind {kind} leg {leg} ok {ok} among {[(c.get('kind'), c.get('leg')) for c in checks_of(src)]}"
    )
    return "\n".join(c["detail"] for c in found)


def clone(root: Path, dst: Path) -> Path:
    """A copy of a project whose ledger points at the copy's own logs and store (the ledger
    holds them by absolute path): a test changes the copy, never a project other tests read."""
    import shutil

    shutil.copytree(root, dst, symlinks=True)
    with sqlite3.connect(dst / ".launcher" / "ledger.db") as db:
        db.execute("UPDATE legs SET log_path = replace(log_path, ?, ?)", (str(root), str(dst)))
        db.execute("UPDATE runs SET store_uri = replace(store_uri, ?, ?)", (root.as_uri(), dst.as_uri()))
    return dst


SECRET = "hf_test_secret_value"
"""The HF_TOKEN the shared rehearsal's legs get (tests/legs/conftest.py): it must reach their
environment and be written down nowhere (test_rehearsal.py)."""


@dataclass(frozen=True)
class Done:
    """A project after a command (a fixture of tests/legs/conftest.py): where it is, and what the
    command answered."""

    root: Path
    res: Result


@dataclass(frozen=True)
class Rehearsed(Done):
    """The project after `launcher up rehearsal --json` (with HF_TOKEN=SECRET), and the dry run
    shown just before it (`up rehearsal --dry-run --json`) with the time it was shown."""

    dry: Result
    shown_at: float


def leg_events(leg: dict) -> list[dict]:
    """Every event of a ledger leg's log, of every rank (each node's log where it ran on several)."""
    logs = [Path(n["log"]) for n in leg.get("nodes") or []] or [Path(leg["log_path"])]
    return [
        json.loads(line[line.find('{"event": ') :])
        for log in logs
        for line in log.read_text().splitlines()
        if '{"event": ' in line
    ]


def fail_lines(out: str) -> list[str]:
    """The FAIL entries of a rung's human output, each whole: the CLI wraps a long one within the
    terminal with a hanging indent (launcher.cli.render.print_wrapped), and its continuation lines
    are joined back here."""
    entries: list[str] = []
    current: list[str] | None = None
    for line in out.splitlines():
        if line.strip().startswith("FAIL"):
            current = [line.strip()]
            entries.append("")
        elif current is not None and line.startswith("    ") and line.strip():
            current.append(line.strip())
        else:
            current = None
        if current is not None:
            entries[-1] = " ".join(current)
    return entries

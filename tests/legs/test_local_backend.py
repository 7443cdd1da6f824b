"""The local backend: a fresh empty disk per leg, the leg environment, kill = lost instance."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from launcher.backends.base import LegSpec, StagedFile
from launcher.backends.local import LocalBackend
from launcher.errors import Refused
from launcher.leg_env import redact

PROBE = """
import json, os, pathlib, sys
here = pathlib.Path('.')
print(json.dumps({"event": "probe", "cwd": os.getcwd(),
                  "files": sorted(str(p) for p in here.rglob('*')),
                  "env": {k: v for k, v in os.environ.items() if k.startswith('LAUNCHER_') or k == 'HF_TOKEN'}}))
pathlib.Path('leftover.bin').write_bytes(b'x' * 1000)
pathlib.Path('ckpt').mkdir()
pathlib.Path('ckpt/step-00000010').write_text('local copy')
sys.exit(int(os.environ.get('EXIT_WITH', '0')))
"""


def staged(tmp_path: Path) -> dict[str, StagedFile]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return {"probe.py": StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())}


def run_id(tmp_path: Path) -> str:
    """A run id of this test's own. Every process of a leg carries the token run id:leg, and a leg
    that ends kills whatever still carries its token (launcher.backends.leash): two tests at once
    on one fixed id ("r1", before) killed each other's legs (a sleeper dead of -9 before its kill,
    a probe that never printed: seen once in a two-worker clean-clone run)."""
    return "r1-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]


def spec(tmp_path: Path, leg: int, command: tuple[str, ...] = ("python", "probe.py"), **kw) -> LegSpec:  # noqa: ANN003
    env = {
        "LAUNCHER_RUN_ID": run_id(tmp_path),
        "LAUNCHER_LEG": str(leg),
        "LAUNCHER_RUNG": "rehearsal",
        "LAUNCHER_STORE": (tmp_path / "store").as_uri(),
        "LAUNCHER_MAX_STEPS": "10",
        "LAUNCHER_DEADLINE": str(int(time.time()) + 60),
    }
    env.update(kw.pop("extra_env", {}))
    files = kw.pop("files", None) or staged(tmp_path)
    return LegSpec(
        run_id(tmp_path),
        leg,
        "rehearsal",
        command,
        env,
        kw.pop("secrets", {}),
        files,
        tmp_path / "logs" / f"leg-{leg}.log",
        None,
    )


def probe_event(log: Path) -> dict:
    return next(json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"event": "probe"'))


def test_leg_1_cannot_see_leg_0_files(tmp_path: Path) -> None:
    backend = LocalBackend(root=tmp_path / "legs")
    results, probes = [], []
    for leg in (0, 1):
        s = spec(tmp_path, leg)
        handle = backend.launch(s)
        results.append(backend.wait(handle, timeout=60))
        probes.append(probe_event(s.log_path))
        assert not Path(handle.instance).exists(), "the leg's disk outlived the leg"
    assert [r.exit_code for r in results] == [0, 0]
    # Each leg started on a disk holding only the staged, reviewed files.
    assert probes[0]["files"] == probes[1]["files"] == ["probe.py"]
    assert probes[0]["cwd"] != probes[1]["cwd"]


def test_leg_environment_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHER_STALE", "from the host")  # must not leak into a leg
    s = spec(tmp_path, 0, secrets={"HF_TOKEN": "hf_secret_value"})
    backend = LocalBackend(root=tmp_path / "legs")
    backend.wait(backend.launch(s), timeout=60)
    env = probe_event(s.log_path)["env"]
    assert env["LAUNCHER_LEG"] == "0" and env["LAUNCHER_RUN_ID"] == run_id(tmp_path)
    assert set(env) == {
        "LAUNCHER_RUN_ID",
        "LAUNCHER_LEG",
        "LAUNCHER_RUNG",
        "LAUNCHER_STORE",
        "LAUNCHER_MAX_STEPS",
        "LAUNCHER_DEADLINE",
        "HF_TOKEN",
    }
    assert env["HF_TOKEN"] == "hf_secret_value"  # the leg gets it...
    recorded = redact(dict(s.env) | {"HF_TOKEN": "hf_secret_value", "MY_API_KEY": "k"}, ["HF_TOKEN"])
    assert recorded["HF_TOKEN"] == recorded["MY_API_KEY"] == "<redacted>"  # ...nothing written down does


def test_exit_code_is_the_legs_own(tmp_path: Path) -> None:
    s = spec(tmp_path, 0, extra_env={"EXIT_WITH": "7"})
    backend = LocalBackend(root=tmp_path / "legs")
    assert backend.wait(backend.launch(s), timeout=60).exit_code == 7


def launch_until_ready(tmp_path: Path, script: Path) -> tuple[LocalBackend, object, list[str]]:
    """Launch `script` as leg 0 and wait (30 s at most) for the line `ready` it prints."""
    files = {script.name: StagedFile(script, hashlib.sha256(script.read_bytes()).hexdigest())}
    backend = LocalBackend(root=tmp_path / "legs")
    lines: list[str] = []
    handle = backend.launch(spec(tmp_path, 0, ("python", script.name), files=files), on_line=lines.append)
    deadline = time.time() + 30
    while "ready\n" not in lines and time.time() < deadline:
        time.sleep(0.05)
    return backend, handle, lines


def test_kill_takes_the_process_group_and_the_disk(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import subprocess, sys, time, pathlib\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(child_pid)!r}).write_text(str(p.pid))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    backend, handle, _ = launch_until_ready(tmp_path, script)
    assert backend.wait(handle, timeout=0.1) is None  # still running
    result = backend.kill(handle, reason="drill")
    assert result.killed and result.exit_code == -9 and result.end_reason == "drill"
    assert not Path(handle.instance).exists()
    pid = int(child_pid.read_text())
    for _ in range(100):  # the grandchild dies with the group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("a child of the killed leg survived")


def test_sigterm_reaches_every_process_of_the_leg_once(tmp_path: Path) -> None:
    """terminate signals the leader's group first, then what the /proc scan finds beyond it
    (a worker in a session of its own, as torchrun starts them): each gets one SIGTERM, not
    two (to many trainers a second one means "die now")."""
    counts = tmp_path / "counts"
    counts.mkdir()
    script = tmp_path / "family.py"
    script.write_text(
        "import os, pathlib, signal, subprocess, sys, time\n"
        f"COUNTS = pathlib.Path({str(counts)!r})\n"
        "def counting(name):\n"
        "    signal.signal(signal.SIGTERM, lambda *_: open(COUNTS / name, 'a').write('x'))\n"
        "if len(sys.argv) > 1:\n"
        "    counting(sys.argv[1])\n"
        "    open(COUNTS / (sys.argv[1] + '.up'), 'w').close()\n"
        "    while True: time.sleep(0.05)\n"
        "counting('leader')\n"
        "subprocess.Popen([sys.executable, __file__, 'grouped'])\n"
        "subprocess.Popen([sys.executable, __file__, 'own-session'], start_new_session=True)\n"
        "while len(list(COUNTS.glob('*.up'))) < 2: time.sleep(0.05)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    backend, handle, lines = launch_until_ready(tmp_path, script)
    try:
        assert "ready\n" in lines, lines
        backend.terminate(handle)
        names = ("leader", "grouped", "own-session")
        deadline = time.time() + 10
        while not all((counts / n).exists() for n in names) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # room for a second delivery, were there one
        assert {n: (counts / n).read_text() if (counts / n).exists() else "" for n in names} == {n: "x" for n in names}
    finally:
        backend.kill(handle, reason="test over")


def test_staging_refuses_bytes_that_changed(tmp_path: Path) -> None:
    files = staged(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE + "\n# edited after the guard\n")
    backend = LocalBackend(root=tmp_path / "legs")
    with pytest.raises(Refused, match="probe.py changed"):
        backend.launch(spec(tmp_path, 0, files=files))
    assert list((tmp_path / "legs").iterdir()) == []  # no disk left behind


def test_missing_program_is_a_failed_leg(tmp_path: Path) -> None:
    backend = LocalBackend(root=tmp_path / "legs")
    s = spec(tmp_path, 0, ("no-such-program-xyz",))
    result = backend.wait(backend.launch(s), timeout=10)
    assert result.exit_code == 127
    assert "cannot start" in s.log_path.read_text()


def test_python_runs_under_the_launchers_interpreter(tmp_path: Path) -> None:
    from launcher.backends.local import resolve_command

    assert resolve_command(("python", "train.py"))[0] == sys.executable
    assert resolve_command(("bash", "x.sh")) == ["bash", "x.sh"]


def test_the_torch_extra_is_named_only_for_a_trainer_run_in_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install 'preflight-launcher[torch]'` helps a trainer that ran in the launcher's own
    interpreter (a local leg, rung 0): not one in an image (sky, docker) or in a venv of its own."""
    import importlib.util

    from launcher.backends.local import TORCH_EXTRA, no_torch_hint

    said = "ModuleNotFoundError: No module named 'torch'"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # this interpreter without torch
    assert TORCH_EXTRA in no_torch_hint(said, sys.executable)
    assert no_torch_hint(said, None) == ""  # a leg in an image
    assert no_torch_hint(said, "/opt/venv-hf/bin/python") == ""  # a trainer's own venv
    assert no_torch_hint("ModuleNotFoundError: No module named 'numpy'", sys.executable) == ""

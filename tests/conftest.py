"""Fixtures only (the helpers tests share are in tests/helpers.py): a fresh project made
by `launcher init`, a loopback Hub, a project wired to it, each item marked by its tier (its
folder), and SkyPilot's own API server for a session with an item that needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpuhost import gpu_host  # noqa: F401 - the fixture: a host with GPUs (a stand-in driver)
from tests.helpers import SKY_IMAGE_REF, edit_config, run_cli, sky_server_of


@pytest.fixture
def leg_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Legs' fresh dirs go under a folder of this test's own (TMPDIR is what mkdtemp uses), a
    short one under /tmp: a DataLoader worker hands each batch to its main process through an
    AF_UNIX socket in TMPDIR (torch's file_descriptor strategy), and a socket path may not pass
    107 bytes. Under pytest's basetemp it did: "AF_UNIX path too long" in the worker's feeder
    thread, and the leg waited for its batch until the budget killed it (360 s)."""
    path = Path(tempfile.mkdtemp(prefix="leg-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def reviewed_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project written by `launcher init` and reviewed, once per test worker: `project` copies
    it. Nothing in it names its folder (the ledger holds file names and digests, the config its
    folder's name, `proj` for every copy), and the two commands cost 0.3 s of CPU per test."""
    root = tmp_path_factory.mktemp("template") / "proj"
    res = run_cli(["init", str(root)], cwd=root.parent)
    assert res.code == 0, res.err
    res = run_cli(["review"], cwd=root)
    assert res.code == 0, res.err
    return root


@pytest.fixture
def project(tmp_path: Path, leg_tmp: Path, reviewed_project: Path) -> Path:
    """A project written by `launcher init`, reviewed (a copy of `reviewed_project`)."""
    root = tmp_path / "proj"
    shutil.copytree(reviewed_project, root, symlinks=True)
    return root


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A loopback Hub (tests/fakes/hub_server.py) for the real huggingface_hub client."""
    from huggingface_hub import constants

    from tests.fakes.hub_server import HubServer

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # uploads go through LFS, not xet
    with HubServer(token="hf_good") as server:
        yield server


@pytest.fixture
def sky_project(project: Path, hub_server, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    """The project with a hub store and a (recorded) pushed image of its reviewed files."""
    edit_config(project, store="hf://tester/ckpts")
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    from launcher.config.load import load_config
    from launcher.ledger.db import Ledger
    from runtime.hashing import digest_lines as files_digest

    cfg = load_config(project / "launcher.yaml")
    ledger = Ledger(cfg.state_path / "ledger.db")
    files = ledger.latest_review().files
    row = ledger.record_image(
        {
            "tag": "t",
            "image_id": "sha256:" + "0" * 64,
            "base": "b",
            "lock": "cpu.lock",
            "files_digest": files_digest(files),
            "files": files,
            "runtime_digest": "r",
            "built_at": 0.0,
            "seconds": 0.0,
        }
    )
    ledger.set_pushed(row, SKY_IMAGE_REF)
    ledger.close()
    return cfg


# One intra-op thread per torch process: the suite runs two workers, each running legs of two or
# more processes, on two cores. With torch's default (a thread per core) every leg's OpenMP threads
# spin against the other legs' and a loaded machine does less work for more CPU. Every comparison in
# the suite is between runs under this same setting (a leg and its straight-through run, two ranks).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Memory predictions (launcher.ops.memory) are kept by what they are a function of (the files, the
# command, the interpreter, the world size, the rank): one cache for the whole session (xdist's
# workers inherit the controller's), so the projects made from `launcher init`'s template share one
# prediction per world size instead of paying seconds each. Never the user's ~/.cache.
os.environ.setdefault("PREFLIGHT_CACHE_DIR", tempfile.mkdtemp(prefix="preflight-cache-"))

# The CLI wraps its lines within the terminal (launcher.cli.render.terminal_width: COLUMNS, else
# the terminal, else 160 when piped) and every word is kept; a test that looks for a phrase in a
# command's output must not depend on where a line happened to break. The suite's terminal is
# one wide page; tests/unit/test_render.py sets its own widths to test the wrapping itself.
# pytest's own report keeps the real terminal's width (set back in `pytest_configure`).
PYTEST_WIDTH = shutil.get_terminal_size().columns
os.environ["COLUMNS"] = "10000"


TIERS = ("unit", "legs", "install", "docker", "sky")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's tier is its folder (tests/unit, tests/legs, ...): the folder marks it, so `-m`
    selects by what a test starts, and a test cannot sit in one tier and claim another. Under
    pytest-xdist the items are then put in the order the workers should take them (`spread_waits`)."""
    here = Path(__file__).resolve().parent
    for item in items:
        folder = Path(str(item.path)).resolve().relative_to(here).parts[0]
        if folder not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, folder))
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup (its own dist is "no")
        items[:] = spread_waits(items)


WAITING_TIERS = ("sky", "install")
"""Tiers whose tests mostly wait (on SkyPilot's API server and the stand-in's clusters, on pip)
while one core or none is busy; tests/legs keeps both cores busy with its legs' processes."""


def spread_waits(items: list[pytest.Item]) -> list[pytest.Item]:
    """The order `make test`'s two workers take the tests in (with --no-loadscope-reorder, which
    keeps it): docker's module first (it waits on the engine and its image, beside the legs the
    other worker takes), then the legs' modules with each waiting module set among them, evenly,
    and the unit tier last (34 s of in-process tests, a filler for whichever worker is free). Each
    waiting module runs on one worker (an xdist_group of its own, or the one it has), so that its
    waits overlap the other worker's legs, never the other worker's waits. With pytest-xdist's
    default (the largest groups first) both workers began on the stand-in's and docker's groups and
    ended on SkyPilot's tests, with a core idle: 5 % of the run's CPU."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(Path(str(item.path)), []).append(item)
    by_tier: dict[str, list[list[pytest.Item]]] = {tier: [] for tier in TIERS}
    for path, module in modules.items():
        by_tier[next(m.name for m in module[0].iter_markers() if m.name in TIERS)].append(module)
    waiting: list[list[pytest.Item]] = []
    groups: dict[str, list[pytest.Item]] = {}
    for module in [m for tier in WAITING_TIERS for m in by_tier[tier]]:
        group = module[0].get_closest_marker("xdist_group")
        if group is None:
            for item in module:
                item.add_marker(pytest.mark.xdist_group(f"one-worker-{Path(str(item.path)).stem}"))
            waiting.append(module)
        elif group.args[0] in groups:
            groups[group.args[0]].extend(module)  # the stand-in's two modules: one unit
        else:
            groups[group.args[0]] = list(module)
            waiting.append(groups[group.args[0]])
    # the largest in the middle of the run: not beside docker's module at the start, nor last
    waiting.sort(key=len)
    waiting.insert(len(waiting) // 2, waiting.pop())
    legs = by_tier["legs"]
    step = max(1, len(legs) // (len(waiting) + 1))
    order: list[pytest.Item] = [item for module in by_tier["docker"] for item in module]
    for i, module in enumerate(legs):
        order.extend(module)
        if (i + 1) % step == 0 and waiting:
            order.extend(waiting.pop(0))
    order.extend(item for module in waiting for item in module)
    order.extend(item for module in by_tier["unit"] for item in module)
    assert sorted(map(id, order)) == sorted(map(id, items)), "spread_waits lost or doubled a test"
    return order


@pytest.hookimpl(trylast=True)  # after the terminal plugin's: its reporter exists
def pytest_configure(config: pytest.Config) -> None:
    """Where SkyPilot's API server for this session (tests/fakes/sky_server.py) will run: its home
    and port, in the environment before any test module imports `sky` (the client reads
    SKY_RUNTIME_DIR, where the vendored catalog is, at import, and tests/sky's modules import it
    at collection). The server itself starts once collection is over, and only where an item
    needs it (`pytest_collection_finish`)."""
    from tests.fakes import sky_server

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # the process that reports: the real terminal's width, not COLUMNS above
        reporter._tw.fullwidth = reporter._screen_width = PYTEST_WIDTH
    if _xdist_controller(config):
        return  # under pytest-xdist each worker runs tests, and starts a server of its own
    _RUNS_TESTS.append(True)
    planned = sky_server.plan(Path(tempfile.mkdtemp(prefix="preflight-skyhome-")))
    os.environ.update(planned.env)
    config.stash[_SKY_SERVER] = (planned, [])


SKY_FIXTURE = "sky_api"
"""The fixture a test outside tests/sky asks for when a launcher command of its reaches
SkyPilot's API server (a `--backend sky` dry run renders and prices through it)."""


def _needs_sky(item: pytest.Item) -> bool:
    return item.get_closest_marker("sky") is not None or SKY_FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """SkyPilot's own API server, started in this process (each xdist worker) only when a
    collected item needs it: one in tests/sky, or one asking for `sky_api`. It starts in the
    background (about 20 s, most of it waiting on the server): the worker runs the tests that
    need no server meanwhile, and the first item that needs it waits for it in its setup
    (`pytest_runtest_setup`). `make test-fast`, one module of tests/legs, tests/unit/test_docs.py
    start none. Without it, a client that went looking for one (a test that needs it and does
    not say so) is pointed at a closed port and fails at once, where it would otherwise start a
    server of its own in the real HOME. Every test and every launcher subprocess talks to this one."""
    from tests.fakes import sky_server

    planned, started = session.config.stash.get(_SKY_SERVER, (None, None))
    if planned is None or session.config.option.collectonly:
        return
    if not any(_needs_sky(item) for item in session.items):
        os.environ["SKYPILOT_API_SERVER_ENDPOINT"] = f"http://127.0.0.1:{sky_server.free_port()}"
        return
    outcome: list[BaseException] = []
    planned.base_env = dict(os.environ)  # before any test changes it

    def start() -> None:
        try:
            server = sky_server.start(planned.home, server=planned)
        except BaseException as err:  # noqa: BLE001 - handed to the first test that needs the server
            outcome.append(err)
            return
        started.append(server)
        sky_server.SESSION.append(server)

    thread = threading.Thread(target=start, name="sky-api-start", daemon=True)
    thread.start()
    session.config.stash[_SKY_STARTING] = (thread, outcome)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """An item that needs SkyPilot's API server waits here until the background start is done."""
    starting = item.config.stash.get(_SKY_STARTING, None)
    if starting is None or not _needs_sky(item):
        return
    thread, outcome = starting
    thread.join()
    if outcome:
        raise RuntimeError(f"SkyPilot's API server did not start: {outcome[0]}")


@pytest.fixture(scope="session")
def sky_api():  # noqa: ANN201 - tests.fakes.sky_server.SkyServer
    """SkyPilot's API server of this session (asking for it is what starts it: see
    `pytest_collection_finish`)."""
    from tests.fakes.sky_server import SESSION

    assert SESSION, "no SkyPilot API server was started for this session"
    return sky_server_of()


TEST_TIMES = "PREFLIGHT_TEST_TIMES"
"""A file each process that runs tests appends its tests' start and end to (pid, S/E, time,
node id): `scripts/suite-profile.sh` sets it, and `scripts/suite_profile.py` charges each
process of the run to the test its worker was running when the process started."""


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:  # noqa: ARG001 - pytest's signature
    _test_time("S", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:  # noqa: ARG001 - pytest's signature
    _test_time("E", nodeid)


def _test_time(kind: str, nodeid: str) -> None:
    path = os.environ.get(TEST_TIMES)
    if path and _RUNS_TESTS:  # not pytest-xdist's controller: it hears of every worker's tests too
        with open(path, "a") as out:
            out.write(f"{os.getpid()} {kind} {time.time():.3f} {nodeid}\n")


_RUNS_TESTS: list[bool] = []


def _xdist_controller(config: pytest.Config) -> bool:
    """True in pytest-xdist's controller process, which collects and hands out tests but runs
    none. Each worker gets its own server: a test may switch which clouds a server has enabled
    (test_sky_real), which must not change what a test on the other worker sees."""
    return getattr(config, "workerinput", None) is None and config.getoption("dist", "no") != "no"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001 - pytest's reporter
    """Every leg the run launched was watched (launcher.checks.watchdog): how many, the suspects
    among those watched with the default policy and those of them called hung (a false alarm
    each: no test hangs a leg under it but `drill hang`'s, counted apart; tests/legs/test_watchdog_live.py
    quiets and stops legs under a 1 s floor), the closest call. Read from the ledgers under --basetemp, in the process
    that reports."""
    from dataclasses import asdict

    from launcher.checks.watchdog import Policy

    if _xdist_worker(config) or not config.option.basetemp:
        return
    default = json.loads(json.dumps(asdict(Policy())))
    legs = watched = suspects = spoke = hung = drilled = found = 0
    closest = 0.0
    for db in Path(config.option.basetemp).rglob("ledger.db"):
        for record in _watchdog_records(db):
            legs += 1
            if record.get("drilled"):  # `drill hang` stopped a rank of it: a hang to find, not an alarm
                drilled += 1
                found += any(look.get("hung") for look in record.get("looks", []))
                continue
            if record.get("policy") != default:
                continue
            watched += 1
            suspects += len(record.get("suspects", []))
            spoke += sum(1 for s in record.get("suspects", []) if s.get("spoke_again"))
            hung += sum(1 for look in record.get("looks", []) if look.get("hung"))
            closest = max(closest, float(record.get("closest", 0.0)))
    if legs:
        terminalreporter.write_line(
            f"watchdog: {legs} legs watched, {watched} under the default policy: {suspects} suspects "
            f"({spoke} of them spoke again, {hung} called hung), closest call {closest:.3f} of a limit; "
            f"{found} of {drilled} drilled hangs found"
        )


def _watchdog_records(db: Path) -> list[dict]:
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT watchdog FROM legs WHERE watchdog IS NOT NULL").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []  # a ledger a test damaged, or one from before the column
    records = []
    for (text,) in rows:
        try:
            record = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_unconfigure(config: pytest.Config) -> None:
    starting = config.stash.get(_SKY_STARTING, None)
    if starting is not None:
        starting[0].join()  # a server still starting is stopped once it is up
    planned, started = config.stash.get(_SKY_SERVER, (None, []))
    for server in started:
        server.stop()
    if planned is not None:
        shutil.rmtree(planned.home, ignore_errors=True)


_SKY_SERVER = pytest.StashKey()
_SKY_STARTING = pytest.StashKey()

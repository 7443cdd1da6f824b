"""Generated bad input, property style: every case must end in exit 2 (bad input) or 3
(refused), one `error:` line (plus at most a `next:` hint), no traceback, and leave
nothing behind (no new file, no ledger row, no reservation).

Cases are generated, not listed: command lines from a grammar of bad flag values,
and launcher.yaml files from a table of invalid values per key (plus file-level
damage: encodings, NUL bytes, depth, size, duplicate keys), combined at random
with a fixed seed (SEED): every command line the grammar gives (775) and 200 random
ones; every single bad config value and file-level case (338, each under 3 of the
commands drawn at random) and 100 random mixes of two or three of them. They run
in-process through the console script's own entry point (launcher.entry.main), so
thousands take seconds; a sample also runs as real subprocesses, to show the
in-process answer is the one a user gets.
"""

from __future__ import annotations

import copy
import itertools
import random
import re
import sqlite3
import unicodedata
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from launcher.entry import main
from tests.helpers import run_cli

NAN, INF = float("nan"), float("inf")
SEED = 20261201
SYSTEM_STATE_DIRS = ["/etc/launcher-state", "/etc", "/", "/tmp", "/usr/local/launcher", "/proc/x", "/dev/shm/x"]

BAD_GPUS = [
    "",
    ":",
    "T4:",
    ":2",
    "T4:0",
    "T4:-1",
    "T4:two",
    "T4:65",
    "T4:9223372036854775808",
    "T4:" + "9" * 5000,
    "T 4",
    "T4:2:3",
    "T4\n",
    "💥:1",
    "A" * 100,
    "T4:1.5",
    "-T4",
    "T4:0x2",
]
# Integers spelled other than plain ASCII decimal (launcher.config.parse.PLAIN_INT says why),
# each of which Python's int(), so click's, would take: refused by every integer flag.
UNPLAIN_INTS = ["٣", "３", "१०", "1_0", " 20", "20 ", "010", "0x10", "+", "2" * 5000]
UNPLAIN_FLOATS = ["٣", "٣.٥", "1_0", " 3", "nan", "inf"]
BAD_NODES = ["0", "-1", "65", str(10**20), "x", "1.5", "١", "01", "1_0", "0x1"]
BAD_STEPS = ["0", "1", "-5", str(10**9), "99999999999999999999", "x", *UNPLAIN_INTS]
BAD_BACKENDS = ["", "Local", "k8s", "local "]
BAD_RUNGS = ["", "Static", "rung0", "probe2", "../static"]
BAD_KILLS = ["0", "-1", "101", "100000", "x", "٣", "02", "0_3"]
BAD_AT = ["", "middle", "mid_push", "RANDOM"]
BAD_TIMEOUTS = ["nan", "inf", "-1", "0", "1e10", "x", *UNPLAIN_FLOATS]
BAD_LIMITS = ["0", "-1", "1000000", "x", "١", "1_0", "010"]
BAD_SEEDS = ["x", "1.5", *UNPLAIN_INTS[:5]]
BAD_KILLS_AT = ["٣,٧", "3,1_0", "0x3", "3,07"]
BAD_NOTICES = ["٣", "1_0", "x"]
BAD_AT_STEPS = ["x", *UNPLAIN_INTS[:5]]
# An empty or blank RUN_ID reads as "no run id" (`ledger ''` listed every run): refused.
BAD_RUN_IDS = ["", " ", "\t", " \n"]
GPU_RUNGS = ["smoke", "probe"]


class Raw(str):
    """A value written into launcher.yaml verbatim, unquoted, as YAML 1.1 would resolve it."""


# Numbers PyYAML (YAML 1.1) resolves from a spelling other than plain decimal: 0x10 -> 16,
# 0b11 -> 3, 017 -> 15 (octal), 1_000 -> 1000, 1:20 -> 80 (base 60). Refused wherever a number
# goes, naming the key (launcher.config.parse.PLAIN_INT says why each).
RAW_INTS = [Raw(x) for x in ("0x10", "0b11", "017", "1_000", "1:20")]  # each in range as read
RAW_FLOATS = [Raw(x) for x in ("1_0.5", "1:30.5", "0x10", "010")]


def cli_cases(tmp: Path) -> Iterator[list[str]]:
    """Command lines that are wrong in exactly one place (some in two)."""
    afile = tmp / "a-file.txt"
    for extra in ([], ["--json"], ["--dry-run"], ["--dry-run", "--json"]):
        for g in BAD_GPUS:
            for rung in GPU_RUNGS:
                yield ["up", rung, "--gpus", g, *extra]
            yield ["up", "static", "--gpus", "T4:1", *extra]  # a CPU rung given GPUs
        for rung in GPU_RUNGS:
            yield ["up", rung, *extra]  # no --gpus
            yield ["up", rung, "--cpu", "--gpus", "T4:1", *extra]
            for n in BAD_NODES:
                yield ["up", rung, "--gpus", "T4:1", "--backend", "sky", "--nodes", n, *extra]
        for s in BAD_STEPS:
            yield ["up", "rehearsal", "--steps", s, *extra]
            yield ["up", "probe", "--cpu", "--steps", s, *extra]
        yield ["up", "static", "--steps", "10", *extra]
        yield ["up", "rehearsal", "--cpu", *extra]
        for b in BAD_BACKENDS:
            yield ["up", "rehearsal", "--backend", b, *extra]
        for r in BAD_RUNGS:
            yield ["up", r, *extra]
        for c in ("", "missing.yaml", str(tmp), "x" * 5000, str(afile) + "/x", "/proc/self/nope/launcher.yaml"):
            yield ["up", "static", "--config", c, *extra]
    for extra in ([], ["--json"]):
        for k in BAD_KILLS:
            yield ["drill", "cold-resume", "--kills", k, *extra]
        for seed in BAD_SEEDS:
            yield ["drill", "cold-resume", "--at", "random", "--seed", seed, *extra]
        for k in BAD_KILLS_AT:
            yield ["drill", "cold-resume", "--kills-at", k, *extra]
        for n in BAD_NOTICES:
            yield ["drill", "preempt", "--notice", n, *extra]
        for a in BAD_AT_STEPS:
            yield ["drill", "preempt", "--notice", "5", "--at-step", a, *extra]
        for r in BAD_RUN_IDS:
            yield ["ledger", r, *extra]
            yield ["status", r, *extra]
            yield ["stop", r, *extra]
            yield ["report", r, *extra]
            yield ["report", "some-run", r, *extra]
        for a in BAD_AT:
            yield ["drill", "cold-resume", "--at", a, *extra]
        for b in BAD_BACKENDS:
            yield ["drill", "cold-resume", "--backend", b, *extra]
        for g in BAD_GPUS:
            yield ["drill", "cold-resume", "--gpus", g, *extra]
            yield ["spend", "--gpus", g, *extra]
        for n in BAD_NODES:
            yield ["spend", "--nodes", n, *extra]
        for t in BAD_TIMEOUTS:
            yield ["stop", "some-run", "--timeout", t, *extra]
        yield ["stop", "no-such-run", *extra]
        for lim in BAD_LIMITS:
            yield ["ledger", "--limit", lim, *extra]
        yield ["ledger", "no-such-run", *extra]
        yield ["status", "no-such-run", *extra]
        yield ["report", "no-such-run", *extra]
        yield ["report", "--out", str(afile), *extra]
        yield ["report", "--check", str(tmp / "no-report"), *extra]
        yield ["report", "--check", str(afile), *extra]
        yield ["report", "--check", str(tmp), "some-run", *extra]
    for d in (str(afile), "/proc/x", str(afile) + "/sub", "x" * 5000):
        yield ["init", d]
    yield ["init", str(tmp / "proj")]  # exists: refused without --force
    yield ["nosuch"]
    yield ["up"]
    yield ["drill"]
    yield ["image", "push"]  # no repository configured


# flag -> (values that are wrong whatever else is given, values that are fine)
UP_FLAGS = {
    "--gpus": (BAD_GPUS, ["T4:1", "A100:8"]),
    "--nodes": (BAD_NODES, ["1"]),
    "--steps": (BAD_STEPS, ["20"]),
    "--backend": (BAD_BACKENDS, ["local"]),
}
DRILL_FLAGS = {
    "--kills": (BAD_KILLS, ["2"]),
    "--at": (BAD_AT, ["mid-push", "random"]),
    "--backend": (BAD_BACKENDS, ["local"]),
    "--gpus": (BAD_GPUS, ["T4:1"]),
}
SPEND_FLAGS = {"--gpus": (BAD_GPUS, ["T4:2"]), "--nodes": (BAD_NODES, ["1", "2"])}


def random_cli_cases(rng: random.Random, n: int) -> Iterator[list[str]]:
    """Random command lines: some flags right, at least one wrong, in any order."""
    for _ in range(n):
        cmd = rng.choice(["up", "drill", "spend"])
        table = {"up": UP_FLAGS, "drill": DRILL_FLAGS, "spend": SPEND_FLAGS}[cmd]
        flags = rng.sample(sorted(table), rng.randint(1, len(table)))
        wrong = rng.choice(flags)
        args = [f for flag in flags for f in (flag, rng.choice(table[flag][0] if flag == wrong else table[flag][1]))]
        head = {"up": ["up", rng.choice(GPU_RUNGS)], "drill": ["drill", "cold-resume"], "spend": ["spend"]}[cmd]
        tail = [x for x in ("--json", "--dry-run") if rng.random() < 0.4 and (x == "--json" or cmd == "up")]
        yield head + args + tail


# key path -> values that are invalid there, whatever else the config says
BAD_VALUES: dict[tuple[str, ...], list[Any]] = {
    ("project",): [None, 1, "", "UPPER", "a" * 40, "a b", "a\n", "-x", "\0", True],
    ("trainer", "command"): ["", [], [1], "python\0train.py", {"a": 1}, None, "'unclosed"],
    ("trainer", "parser"): ["", "1abc", "a-b", None, 5],
    ("trainer", "modules"): ["x", [1], [None], [["x"]], [""], ["os;id"], ["a..b"], ["1mod"]],
    ("reviewed",): [[], [""], ["/etc/passwd"], ["../x"], "train.py", [None], ["a\0b"], [" "], ["x" * 5000]],
    ("store",): [
        "",
        " ",
        "file:///dev/null",
        "file://relative/x",
        "s3://b/x",
        "hf://a",
        "hf://a/b\n",
        "hf://a/b c",
        5,
        [],
        "@FILE",
        "hf://a/b@../../x",
        "hf://a/b@main/",
        "hf://a/b@.hidden",
        "file:///proc/self",
        "file:///etc",
        "file:///",
        "file:///sys/x",
        "~/.store",
        "~",
        # A URI written wrong is refused, naming the forms taken (file:///abs/dir, hf://owner/repo).
        "file:/tmp/x",
        "file:x",
        "hf:owner/repo",
        "S3:b",
        # % ? # in a file:// URI: decoded by every URI reader (a%2F..%2Fb is a traversal), not here.
        "file:///tmp/a%2F..%2Fb",
        "file:///tmp/a%20b",
        "file:///tmp/x?y",
        "file:///tmp/x#y",
        # Under the system's programs and settings: root's writability check would pass.
        "file:///etc/launcher-store",
        "file:///usr/local/launcher-store",
        "/etc/launcher-store",
    ],
    # The state dir is checked by the store's own folder check (launcher.config.places.local_folder).
    ("state_dir",): ["", "\0", 5, "@FILE", [], "a\nb", *SYSTEM_STATE_DIRS],
    ("quota", "gpu_hours"): [NAN, INF, -INF, -1, 10**7, "30", True, 10**30, []],
    ("quota", "period"): ["day", "", 5, None, "WEEK"],
    ("quota", "reset_weekday"): ["funday", "", None, 1],
    ("quota", "budget_usd"): [NAN, INF, -1, 1e12, "x"],
    ("quota", "session_hours"): [NAN, 0, -1, INF, 1000, "9", 1.0e-300, 5e-324],
    ("prices",): [
        {"T4": NAN},
        {"T4": -1},
        {"T4": INF},
        {"T4": 1e6},
        {"": 1},
        {"T4\n": 1},
        {"T4": "1"},
        "x",
        [1],
        {1: 0.3},
        {"T4": None},
    ],
    ("image", "repository"): ["UPPER/x", "", "a b", 5],
    ("image", "base"): [5, "\0", []],
    ("leg_env",): [{"LAUNCHER_X": "1"}, {"lower": "1"}, {"A": 1}, {"A": "\0"}, {"HF_TOKEN": "x"}, "x", {"A-B": "1"}],
    ("secrets",): [["lower"], "HF_TOKEN", [1], ["A B"], [""]],
    ("rungs",): ["x", [], {"walk": {"steps": 3}}],
}
for _rung in ("rehearsal", "smoke", "probe", "run", "drill"):
    BAD_VALUES[("rungs", _rung, "steps")] = [0, 1, -1, 10**9, 1.5, "10", None, True, 10**30, NAN]
    BAD_VALUES[("rungs", _rung, "steps")] += RAW_INTS if _rung in ("rehearsal", "run") else RAW_INTS[:2]
    BAD_VALUES[("rungs", _rung, "budget_minutes")] = [
        NAN,
        INF,
        -INF,
        0,
        -1,
        10**6,
        "5",
        True,
        None,
        1.0e-300,
        5e-324,
        0.001,
    ]
    BAD_VALUES[("rungs", _rung)] = [{"steps": 5, "cadence": 2}, "fast", 3, None]
BAD_VALUES[("rungs", "run", "max_restarts_on_errors")] = [-1, 101, 1.5, "3", True, None, NAN, *RAW_INTS]
BAD_VALUES[("hub", "files_per_commit")] = RAW_INTS[:3]
for _key, _bad in (("multiple", [1, 1.5, 1001]), ("floor_s", [0.5, 86_401]), ("first_step_s", [0]), ("finish_s", [-1])):
    BAD_VALUES[("trainer", "watchdog", _key)] = [*_bad, NAN, INF, "10", True, None, []]
BAD_VALUES[("trainer", "watchdog")] = ["loose", 3, [], {"floor": 15}]
BAD_VALUES[("trainer", "watchdog", "act")] = ["yes", 1, None, [], "true"]
BAD_VALUES[("trainer", "deterministic")] = ["yes", 0, None, [], "false"]  # the first bool key: refused, never a crash
for _float_key in (("rungs", "smoke", "budget_minutes"), ("quota", "gpu_hours"), ("trainer", "events_grace_s")):
    BAD_VALUES.setdefault(_float_key, []).extend(RAW_FLOATS)
BAD_VALUES[("rungs", "drill", "max_restarts_on_errors")] = [3]  # the run's alone
BAD_VALUES[("memory", "guard")] = ["", "Refuse", "skip", None, True, 0, ["warn"], {"mode": "warn"}]
BAD_VALUES[("memory",)] = ["off", 1, [], {"gaurd": "warn"}]
# Globs that parse but reach into the launcher's own state: refused where globs are expanded.
BAD_GLOBS = [["**/*"], [".launcher/*"], ["train.py", ".launcher/ledger.db"], ["*", "**/*.db"], [".*/**"]]


def set_key(data: dict, path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else node[part]
        if not isinstance(node, dict):
            return
    node[path[-1]] = value


def config_cases(base: dict, tmp: Path, rng: random.Random, extra: int) -> Iterator[tuple[str, str]]:
    """(label, launcher.yaml text): every single bad value, then `extra` random mixes of two or three."""
    afile = str(tmp / "a-file.txt")

    def dump(data: dict) -> str:
        text = yaml.safe_dump(data, allow_unicode=True, width=10**6)
        return re.sub(r"'@RAW(.*?)@'", r"\1", text)  # a Raw value, unquoted

    def with_values(items: list[tuple[tuple[str, ...], Any]]) -> dict:
        data = copy.deepcopy(base)
        for path, value in items:
            if isinstance(value, Raw):
                value = f"@RAW{value}@"
            set_key(data, path, afile if value == "@FILE" else value)
        return data

    singles = [(path, value) for path, values in BAD_VALUES.items() for value in values]
    for path, value in singles:
        yield f"{'.'.join(path)}={value!r:.40}", dump(with_values([(path, value)]))
    for level in ([], ["trainer"], ["quota"], ["rungs"], ["rungs", "smoke"], ["image"]):
        data = copy.deepcopy(base)
        node = data
        for part in level:
            node = node.setdefault(part, {})
        node["unknown_key"] = 1
        yield f"unknown key in {level}", dump(data)
    data = copy.deepcopy(base)
    del data["project"]
    yield "no project", dump(data)
    text = dump(base)
    yield "duplicate top-level key", text + "project: other\n"
    yield "duplicate nested key", text.replace("quota:\n", "quota:\n  period: week\n  period: month\n", 1)
    yield "empty file", ""
    yield "a list", "- 1\n- 2\n"
    yield "a scalar", "just words\n"
    yield "tabs", "project:\tx\n\tbad: [\n"
    yield "1000-deep", "project: p\nprices: " + "[" * 1000 + "]" * 1000 + "\n"
    yield "deep mapping", "project: p\nleg_env: " + "{a: " * 300 + "1" + "}" * 300 + "\n"
    yield (
        "alias bomb",
        (
            "a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\n"
            "project: p\ntrainer: {modules: [*c, *c, *c]}\n"
        ),
    )
    yield "over 1 MiB", text + "# " + "x" * (1 << 20) + "\n"
    for i in range(extra):
        mix = rng.sample(singles, rng.choice((2, 3)))
        yield f"mix {i}: " + ", ".join(".".join(p) for p, _ in mix), dump(with_values(mix))


RAW_FILES = {
    "utf-16": lambda text: text.encode("utf-16"),
    "binary": lambda text: bytes(range(256)) * 4,
    "nul": lambda text: text.encode().replace(b"\n", b"\n\0", 1),
    "latin-1": lambda text: text.replace("project:", "# caf\xe9\nproject:", 1).encode("latin-1"),
}

CONFIG_COMMANDS = [
    ["review"],
    ["up", "static"],
    ["up", "rehearsal", "--dry-run"],
    ["spend", "--json"],
    ["ledger", "--json"],
    ["status"],
    ["report"],
    ["drill", "cold-resume"],
]
GLOB_COMMANDS = [["review"], ["up", "static"], ["up", "rehearsal", "--dry-run"], ["drill", "cold-resume"]]


def snapshot(root: Path) -> tuple:
    """What a refusal must not change: every file (but the config we write and SQLite's
    WAL side files) and every table's row count."""
    files = sorted(
        (str(p.relative_to(root)), p.stat().st_size if p.name != "ledger.db" else 0)
        for p in root.rglob("*")
        if not p.name.endswith(("-wal", "-shm", "launcher.yaml")) and not p.is_dir()
    )
    db = root / "proj" / ".launcher" / "ledger.db"
    with sqlite3.connect(db) as conn:
        counts = tuple(
            conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("reviews", "runs", "legs", "reservations", "stops", "checks", "images")
        )
    return files, counts


def check_case(args: list[str], capsys, what: str) -> None:  # noqa: ANN001
    code = main(args)
    out, err = capsys.readouterr()
    assert code in (2, 3), (what, args, code, out[-300:], err[-500:])
    assert "Traceback" not in out + err, (what, args, err)
    if code == 2 and not err and "Usage:" in out:
        return  # a bare `launcher drill`: its help, as `no_args_is_help` asks
    lines = err.strip().splitlines()
    assert lines and lines[0].startswith("error: "), (what, args, err)
    assert all(x.startswith("  next: ") for x in lines[1:]) and len(lines) <= 2, (what, args, err)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/proj: a reviewed project with one static run and a file to misuse as a folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "legs"))
    (tmp_path / "legs").mkdir()
    (tmp_path / "a-file.txt").write_text("a file, not a folder\n")
    assert run_cli(["init", str(tmp_path / "proj")], cwd=tmp_path).code == 0
    assert run_cli(["review"], cwd=tmp_path / "proj").code == 0
    assert run_cli(["up", "static"], cwd=tmp_path / "proj").code == 0
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.delenv("LAUNCHER_DEBUG", raising=False)
    return tmp_path


def test_generated_bad_command_lines(workdir: Path, capsys) -> None:  # noqa: ANN001
    cases = list(cli_cases(workdir)) + list(random_cli_cases(random.Random(SEED), 200))
    before = snapshot(workdir)
    for args in cases:
        check_case(args, capsys, "flags")
    assert snapshot(workdir) == before
    assert len(cases) > 950, len(cases)  # 775 from the grammar, 200 at random


def test_generated_bad_configs(workdir: Path, capsys) -> None:  # noqa: ANN001
    config = workdir / "proj" / "launcher.yaml"
    good = config.read_text()
    base = yaml.safe_load(good)
    rng = random.Random(SEED)
    before = snapshot(workdir)
    outside = [Path(d) for d in SYSTEM_STATE_DIRS + ["/etc/launcher-store", "/usr/local/launcher-store"]]
    absent = [d for d in outside if not d.exists()]
    n = 0
    for label, text in config_cases(base, workdir, rng, extra=100):
        config.write_text(text)
        for args in rng.sample(CONFIG_COMMANDS, 3):
            check_case(args, capsys, label)
            n += 1
    for label, make in RAW_FILES.items():
        config.write_bytes(make(good))
        for args in CONFIG_COMMANDS:
            check_case(args, capsys, label)
            n += 1
    for globs in BAD_GLOBS:
        config.write_text(yaml.safe_dump(dict(base, reviewed=globs)))
        for args in GLOB_COMMANDS:
            check_case(args, capsys, f"reviewed={globs}")
            n += 1
    config.write_text(good)
    assert snapshot(workdir) == before
    assert [d for d in absent if d.exists()] == []  # a refused state dir or store is never made
    assert n > 1350, n  # (338 singles + 100 mixes) x 3 commands, 4 raw files x 8, 5 glob sets x 4


def test_a_sample_as_real_subprocesses(workdir: Path) -> None:
    """The in-process answers are what a user gets from the console script."""
    rng = random.Random(SEED)
    cases = rng.sample(list(cli_cases(workdir)), 10)
    before = snapshot(workdir)
    for args in itertools.chain(cases, [["up", "probe", "--gpus", "T4:" + "9" * 20]]):
        res = run_cli(args, cwd=workdir / "proj")
        assert res.code in (2, 3) and "Traceback" not in res.err + res.out, (args, res)
    assert snapshot(workdir) == before


# Every decimal digit of every script but ASCII's: int("٣") == 3, so click's INT took them.
UNICODE_DIGITS = [chr(c) for c in range(0x80, 0x110000) if unicodedata.decimal(chr(c), None) is not None]


def test_every_non_ascii_digit_is_refused_by_every_number_parser() -> None:
    """In-process, the parsers themselves: each integer and float flag's click type (all of them
    share it), the ledger's fast path, the YAML loader; one spelling in, every other refused."""
    from typer._click.exceptions import BadParameter

    from launcher.cli.options import NUMBER, WHOLE
    from launcher.config.parse import StrictLoader, Unplain, plain_int
    from launcher.entry import fast_ledger

    assert len(UNICODE_DIGITS) > 600, len(UNICODE_DIGITS)
    for digit in UNICODE_DIGITS:
        for text in (digit, "1" + digit, digit + "0"):
            assert int(text) >= 0  # the hazard: Python reads it
            for parse in (WHOLE.convert, NUMBER.convert):
                with pytest.raises(BadParameter):
                    parse(text, None, None)
            assert fast_ledger(["--limit", text]) is None  # left to typer, which refuses it
    for text in (*UNPLAIN_INTS, "0b11", "1:20"):
        with pytest.raises(ValueError):
            plain_int(text)
    loader = StrictLoader.make()
    for raw in RAW_INTS + RAW_FLOATS:
        assert isinstance(yaml.load(f"n: {raw}", Loader=loader)["n"], Unplain), raw  # noqa: S506
    # Accepted on purpose: one plain spelling, signed or not (a range check follows).
    assert [WHOLE.convert(t, None, None) for t in ("0", "+3", "-1", "100000000")] == [0, 3, -1, 100_000_000]
    assert [NUMBER.convert(t, None, None) for t in ("2.5", ".5", "1e3", "-0")] == [2.5, 0.5, 1000.0, 0.0]
    assert yaml.load("n: +30", Loader=loader)["n"] == 30  # noqa: S506


# file: URIs a leg could be handed (LAUNCHER_STORE, a trainer run by hand): only file:///abs/dir.
BAD_FILE_URIS = [
    "file:/tmp/x",
    "file://host/tmp/x",
    "file:///tmp/a%2F..%2Fb",
    "file:///tmp/%2e%2e/etc",
    "file:///tmp/a/../b",
    "file:///tmp/./x",
    "file:///tmp/x%00y",
    "file:///tmp/x?y",
    "file:///tmp/x#y",
    "file:///tmp/x?",
]


def test_store_uri_forms(tmp_path: Path) -> None:
    """The runtime refuses every ambiguous file: URI; the launcher's own (Path.as_uri) all open,
    whatever the folder's name; a relative store leaving the project is accepted on purpose."""
    from launcher.config.load import load_config
    from launcher.config.schema import store_uri
    from runtime.store import StoreError, local_path, open_store

    for uri in BAD_FILE_URIS:
        with pytest.raises(StoreError):
            open_store(uri, "runs/r", key=None)
    rng = random.Random(SEED)
    for _ in range(200):
        name = "".join(rng.choice("ab %?#;:@&=+$,~é日.-_") for _ in range(rng.randint(1, 12)))
        if name.strip(".") == "":
            continue
        folder = tmp_path / "stores" / name / "x"
        assert local_path(folder.as_uri()) == folder, name
    project = tmp_path / "proj"
    project.mkdir()
    for store, folder in (("../outside", tmp_path / "outside"), ("ckpt/a:b", project / "ckpt" / "a:b")):
        (project / "launcher.yaml").write_text(yaml.safe_dump({"project": "p", "store": store}))
        assert store_uri(load_config(project / "launcher.yaml")) == folder.as_uri(), store
        assert local_path(folder.as_uri()) == folder

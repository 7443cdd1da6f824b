"""The README, docs/ and tests/README.md against the tree they describe.

- Every relative link leads to a file or folder of the repository, and a `#anchor` to a heading
  of the page it names; no link and no text points outside the repository (`../shared`, an
  absolute `/work/` path, the team's own DESIGN.md: the project explains itself in docs/).
- Every `launcher …` command shown (in a code block, or as inline code in the prose) names a real
  subcommand whose `--help` parses, and every `--option` shown for it is one that subcommand has.

Read in-process from the typer app and the markdown files: a few seconds."""

from __future__ import annotations

import importlib
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "tests" / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 250
DESIGN_SECTIONS = ("Exit codes", "Leg environment", "Events", "Store", "The eight proofs")
"""Source docstrings send the reader to these sections of docs/design.md."""

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
OUTSIDE = (
    (re.compile(r"\.\./shared"), "a path into ../shared (outside the repository)"),
    (re.compile(r"(?:^|[\s`'\"(<\[=])/work/"), "an absolute /work/ path (outside the repository)"),
    (re.compile(r"\bDESIGN\.md\b"), "DESIGN.md, a file outside the repository (docs/design.md is the project's)"),
)
OPTION = re.compile(r"(?:^|[\[(|{,])(--?[A-Za-z][\w-]*)")
STOP_TOKENS = {"&&", "||", "|", ";", "…", "...", ">", "2>&1"}


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def split(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines) of a markdown page, each with its line number."""
    prose, code, fenced = [], [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append((number, line))
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: dict[str, int] = {}
    names = set()
    for _, line in split(path)[0]:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = found.get(base, 0)
        found[base] = count + 1
        names.add(base if count == 0 else f"{base}-{count}")
    return frozenset(names)


def links(path: Path) -> list[tuple[int, str]]:
    """Every link target in the prose (inline code, which is not a link, left out)."""
    out = []
    for number, line in split(path)[0]:
        out += [(number, m.group(1)) for m in LINK.finditer(INLINE_CODE.sub("", line))]
    return out


def link_problem(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
        return None
    where, _, anchor = target.partition("#")
    if where.startswith("/"):
        return "an absolute path"
    dest = (page.parent / where).resolve() if where else page
    if not dest.is_relative_to(ROOT):
        return "outside the repository"
    if not dest.exists():
        return "no such file or folder"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading with the anchor #{anchor} in {page_id(dest)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_leads_into_the_repository(page: Path) -> None:
    bad = [f"{page_id(page)}:{n}: ({t}): {why}" for n, t in links(page) if (why := link_problem(page, t))]
    assert not bad, "\n".join(bad)


REPO_PATH = re.compile(r"`((?:launcher|runtime|tests|scripts|bench|examples|docker)/[\w/.-]+)`")
"""A path of this repository named as inline code (`launcher/checks/resume.py`): the pages name
files that moved, so a stale name is caught here, not by a reader."""


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_file_a_page_names_exists(page: Path) -> None:
    prose, _ = split(page)
    bad = [
        f"{page_id(page)}:{n}: {m.group(1)}"
        for n, line in prose
        for m in REPO_PATH.finditer(line)
        if not (ROOT / m.group(1).rstrip(".")).exists()
    ]
    assert not bad, "no such file or folder:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_nothing_points_outside_the_repository(page: Path) -> None:
    bad = [
        f"{page_id(page)}:{n}: {what}: {line.strip()[:120]}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for pattern, what in OUTSIDE
        if pattern.search(line)
    ]
    assert not bad, "\n".join(bad)


# --- the commands shown -------------------------------------------------------------------
def cli_app() -> typer.Typer:
    """The typer app: launcher/cli/app.py in the package layout, launcher/cli.py before it."""
    try:
        module = importlib.import_module("launcher.cli.app")
    except ModuleNotFoundError as err:
        if err.name not in ("launcher.cli.app", "launcher.cli"):
            raise
        module = importlib.import_module("launcher.cli")
    return module.app


@cache
def root_command() -> Any:
    """The app as a click Group (of the click typer vendors: `click.Group` is not its base)."""
    return typer.main.get_command(cli_app())


def is_group(command: object) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


@cache
def help_parses(path: tuple[str, ...]) -> str | None:
    result = CliRunner().invoke(cli_app(), [*path, "--help"])
    return None if result.exit_code == 0 else f"`launcher {' '.join(path)} --help` exits {result.exit_code}"


def shown_commands(page: Path) -> list[tuple[int, str]]:
    """Every `launcher …` command line of a page: the lines of its code blocks that start with
    one (a `$ ` prompt and a trailing `# comment` dropped), and inline code that is one."""
    out = []
    for number, line in split(page)[1]:
        text = re.sub(r"\s+#\s.*$", "", line.strip().removeprefix("$ "))
        if text == "launcher" or text.startswith("launcher "):
            out.append((number, text))
    prose = split(page)[0]
    for i, (number, line) in enumerate(prose):
        # inline code may wrap onto the next line: read each line with the one after it
        joined = line + " " + (prose[i + 1][1] if i + 1 < len(prose) and prose[i + 1][0] == number + 1 else "")
        for match in INLINE_CODE.finditer(joined):
            if match.start() >= len(line):
                break
            text = " ".join(match.group(1).split())
            if text.startswith("launcher "):
                out.append((number, text))
    return out


def command_problems(text: str) -> list[str]:
    tokens = []
    for token in text.split()[1:]:
        if token in STOP_TOKENS:
            break
        tokens.append(token)
    command = root_command()
    path: list[str] = []
    words = iter(t for t in tokens if not t.startswith(("-", "[", "(", "<", '"', "'")))
    while is_group(command):
        word = next(words, None)
        if word is None:
            break
        sub = command.commands.get(word)
        if sub is None:
            return [f"`launcher {' '.join([*path, word])}`: no such command"]
        command, path = sub, [*path, word]
    problems = [p for p in [help_parses(tuple(path))] if p]
    known = {"--help"} | {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    if not path:
        known |= {"--version"}
    for token in tokens:
        for option in OPTION.findall(token):
            if option not in known:
                problems.append(f"`launcher {' '.join(path)}` has no option {option}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_launcher_command_shown_exists(page: Path) -> None:
    bad = [
        f"{page_id(page)}:{n}: {text[:100]}: {why}"
        for n, text in shown_commands(page)
        for why in command_problems(text)
    ]
    assert not bad, "\n".join(bad)


def test_the_readme_is_a_front_door() -> None:
    """At most README_MAX_LINES lines, and its CLI block shows every subcommand there is."""
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES
    shown = {
        tuple(w for w in text.split()[1:3] if not w.startswith(("-", "[")) and w.islower())
        for _, text in shown_commands(readme)
    }
    for name, command in root_command().commands.items():
        subs = command.commands if is_group(command) else {None: command}
        for sub in subs:
            want = (name,) if sub is None else (name, sub)
            assert any(s[: len(want)] == want for s in shown), f"README shows no `launcher {' '.join(want)}`"


def test_design_has_the_sections_the_code_refers_to() -> None:
    design = ROOT / "docs" / "design.md"
    missing = [s for s in DESIGN_SECTIONS if slug(s) not in anchors(design)]
    assert not missing, f"docs/design.md lacks the sections {missing}"


SKIPPED_DIRS = {".git", "__pycache__", "node_modules"}


def repo_files() -> list[Path]:
    """The repository's text files, walked without entering hidden folders (the venvs, .git, the
    test tmp; `.ci` excepted) or caches."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and (not d.startswith(".") or d == ".ci"))
        found += [Path(folder) / f for f in sorted(files) if Path(f).suffix in TEXT_SUFFIXES]
    return found


TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".in", ".txt", ".diff", ""}


def test_no_file_in_the_repository_points_outside_it() -> None:
    """The code, the configs and the task YAML too, not only the pages: a docstring that sends
    the reader to a file the repository does not hold explains nothing."""
    bad = []
    for path in repo_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            bad += [f"{rel}:{number}: {why}: {line.strip()[:120]}" for pattern, why in OUTSIDE if pattern.search(line)]
    assert not bad, "\n".join(bad)

"""`launcher review`: hash the files that legs will run; every launch compares.

The reviewed set is the config's `reviewed` globs, expanded relative to the
project dir. Its digest (sha256 over the sorted "path sha256" lines,
runtime.hashing.digest_lines) names the set in the ledger and the report.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from launcher.config.schema import Config
from launcher.errors import BadInput, Refused
from launcher.ledger.db import Ledger
from launcher.ledger.rows import Review
from runtime.hashing import digest_lines, sha256_file


def reviewed_paths(cfg: Config, strict: bool = True) -> dict[str, Path]:
    """Expand the reviewed globs: {relative posix path: absolute path}.

    strict: a pattern matching nothing is bad input (when recording a review);
    otherwise it is left out, so a comparison reports the file as missing.
    A pattern reaching into the state dir (the ledger, leg logs, the default
    store) or a local store is refused: those change with every launch, so
    reviewing them would lock every later one."""
    out: dict[str, Path] = {}
    own = _launcher_dirs(cfg)
    for i, pattern in enumerate(cfg.reviewed):
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise BadInput(f"launcher.yaml: reviewed: {pattern!r} must be a path inside the project dir")
        try:
            matches = sorted(p for p in cfg.root.glob(pattern) if p.is_file())
        except (ValueError, OSError) as err:
            raise BadInput(f"launcher.yaml: reviewed[{i}]: {pattern!r} is not a usable glob ({err})") from None
        if not matches and strict:
            raise BadInput(f"launcher.yaml: reviewed: {pattern!r} matches no file under {cfg.root}")
        for path in matches:
            inside = next((d for d in own if path.resolve().is_relative_to(d)), None)
            if inside is not None:
                raise BadInput(
                    f"launcher.yaml: reviewed[{i}]: {pattern!r} matches {path.relative_to(cfg.root)}, "
                    f"inside {inside} (the launcher's own state, which changes with every launch)",
                    hint="list the trainer's files only, e.g. train.py or src/**/*.py",
                )
            out[path.relative_to(cfg.root).as_posix()] = path
    return dict(sorted(out.items()))


def _launcher_dirs(cfg: Config) -> list[Path]:
    from launcher.config.schema import store_uri

    dirs = [cfg.state_path.resolve()]
    uri = store_uri(cfg)
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        dirs.append(Path(unquote(urlparse(uri).path)).resolve())
    return dirs


def hash_reviewed(cfg: Config, strict: bool = True) -> dict[str, str]:
    """sha256 of every reviewed file, by relative path."""
    return {rel: sha256_file(path) for rel, path in reviewed_paths(cfg, strict).items()}


def stage_files(files: dict[str, Path], expected: dict[str, str], dest: Path) -> None:
    """Copy reviewed files onto a leg's disk, refusing bytes that no longer hash
    as reviewed (a file edited between the guard and the launch)."""
    for rel, source in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        got = sha256_file(target)
        if got != expected[rel]:
            raise Refused(
                f"{rel} changed while staging: sha256 {got[:12]} != reviewed {expected[rel][:12]}",
                hint="read the change, then run `launcher review` again",
            )


def record_review(cfg: Config, ledger: Ledger, files: dict[str, str] | None = None) -> Review:
    """Record the reviewed files' hashes (taken now unless given) as the reviewed set."""
    files = hash_reviewed(cfg) if files is None else files
    digest = digest_lines(files)
    review_id = ledger.record_review(digest, files)
    review = ledger.latest_review()
    assert review is not None and review.id == review_id
    return review


@dataclass(frozen=True)
class HashComparison:
    """Current hashes against the latest review."""

    review: Review
    current: dict[str, str]
    changed: list[str]
    added: list[str]
    removed: list[str]

    @property
    def ok(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def describe(self) -> str:
        parts = []
        for label, paths in (("changed", self.changed), ("new", self.added), ("missing", self.removed)):
            if paths:
                parts.append(f"{label}: {', '.join(paths)}")
        return "; ".join(parts) or f"{len(self.current)} files match review #{self.review.id}"


def compare_with_review(cfg: Config, ledger: Ledger) -> HashComparison:
    """Hash the reviewed files and compare with the latest review."""
    review = ledger.latest_review()
    if review is None:
        raise Refused(
            "no review recorded: nothing to compare the files against",
            hint="run `launcher review` after reading the files to be run",
        )
    current = hash_reviewed(cfg, strict=False)
    changed = sorted(p for p in current if p in review.files and review.files[p] != current[p])
    added = sorted(set(current) - set(review.files))
    removed = sorted(set(review.files) - set(current))
    return HashComparison(review, current, changed, added, removed)


def guard_hashes(cfg: Config, ledger: Ledger) -> HashComparison:
    """Refuse (exit 3) when the files to be run differ from the reviewed ones."""
    cmp = compare_with_review(cfg, ledger)
    if not cmp.ok:
        raise Refused(
            f"reviewed files differ from review #{cmp.review.id}: {cmp.describe()}",
            hint="read the changes, then run `launcher review` to accept them",
        )
    return cmp

"""`launcher init [DIR]`: a starter project that runs the reference trainer."""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.config.schema import CONFIG_NAME
from launcher.errors import BadInput

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "launcher.yaml"


def reference_trainer() -> Path:
    import runtime  # torch-free package init; the trainer module itself is not imported

    return Path(runtime.__file__).parent / "reference" / "trainer.py"


def project_name(directory: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")[:39]
    return name if name and name[0].isalnum() else "preflight"


def init_project(directory: Path, force: bool = False) -> list[Path]:
    """Write launcher.yaml and train.py into `directory`; refuse to overwrite unless forced,
    and never write through a symlink (it could point out of the project)."""
    config_path, trainer_path = directory / CONFIG_NAME, directory / "train.py"
    links = [p for p in (config_path, trainer_path) if p.is_symlink()]
    if links:
        raise BadInput(
            f"{links[0]} is a symlink: init writes only plain files inside the project",
            hint="remove the link, or choose another DIR",
        )
    existing = [p for p in (config_path, trainer_path) if p.exists()]
    if existing and not force:
        raise BadInput(f"{existing[0]} already exists", hint="pass --force to overwrite, or choose another DIR")
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    texts = {
        config_path: TEMPLATE.read_text().replace("__PROJECT__", project_name(directory)).encode(),
        trainer_path: reference_trainer().read_bytes(),
    }
    for path, data in texts.items():
        _write_plain(path, data)
    return [config_path, trainer_path]


def _write_plain(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder and rename over `path`: a symlink put there
    in the meantime is replaced, never followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

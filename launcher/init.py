"""`launcher init [DIR]`: a starter project that runs the reference trainer."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from launcher.config import CONFIG_NAME
from launcher.errors import BadInput

TEMPLATE = Path(__file__).parent / "templates" / "launcher.yaml"


def reference_trainer() -> Path:
    import runtime  # torch-free package init; the trainer module itself is not imported

    return Path(runtime.__file__).parent / "trainer.py"


def project_name(directory: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")[:39]
    return name if name and name[0].isalnum() else "preflight"


def init_project(directory: Path, force: bool = False) -> list[Path]:
    """Write launcher.yaml and train.py into `directory`; refuse to overwrite unless forced."""
    config_path, trainer_path = directory / CONFIG_NAME, directory / "train.py"
    existing = [p for p in (config_path, trainer_path) if p.exists()]
    if existing and not force:
        raise BadInput(f"{existing[0]} already exists", hint="pass --force to overwrite, or choose another DIR")
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    config_path.write_text(TEMPLATE.read_text().replace("__PROJECT__", project_name(directory)))
    shutil.copyfile(reference_trainer(), trainer_path)
    return [config_path, trainer_path]

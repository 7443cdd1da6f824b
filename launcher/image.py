"""`launcher image build|push`: one image per reviewed set, labelled with what it bakes in.

With an image, rung 0's question "do the files about to run match the reviewed
ones?" becomes "is the image I launch the one built from the reviewed files?".
The build context is assembled here: the reviewed files (hash-checked while
staged), runtime/, the lock, and a wheelhouse downloaded on the host from the
lock (hashes required), so the build needs no network and rebuilds the same.
The image's labels carry the sha256 of every baked file; launching refuses
(exit 3) when they differ from the current review.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher.config.schema import Config
from launcher.errors import BadInput, DockerError, LauncherError, Refused
from launcher.ledger.db import Ledger
from launcher.manifest import guard_hashes, reviewed_paths, stage_files
from runtime.hashing import digest_lines, sha256_file

SOURCE_ROOT = Path(__file__).resolve().parent.parent
CPU_BASE = "python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91"
GPU_BASE = (
    "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
    "@sha256:2b59b1b91885677814f78be1f8df48a25d5dc952eb6580eaecfefca510f9afd3"
)
LABEL = "org.preflight"
SKY_NODE_PACKAGES = ("rsync", "curl", "wget", "patch", "openssh-server", "python3-pip", "fuse")
"""What SkyPilot 0.14's docker runtime apt-installs in the container on every fresh node
(sky/provision/docker_utils.py): baked into images meant for clouds, so a leg's billed
provisioning does not download and install them (bench/sky_node_setup.py)."""
PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
]


@dataclass(frozen=True)
class BuiltImage:
    row: int
    tag: str
    image_id: str
    seconds: float


def docker_cli() -> str:
    path = shutil.which("docker")
    if path is None:
        raise BadInput("the docker CLI is not installed", hint="install Docker (on Debian: apt-get install docker.io)")
    return path


def docker(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; a failure is one line naming the command and docker's own words."""
    proc = subprocess.run([docker_cli(), *args], capture_output=capture, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip()
        tail = text.splitlines()[-1:] or ["no output"]
        raise DockerError(f"`docker {args[0]}` failed: {tail[0]}", hint=_hint(text))
    return proc


def _hint(text: str) -> str:
    if "Cannot connect to the Docker daemon" in text:
        return "start the engine (scripts/docker-engine.sh does, as root)"
    if "registry" in text or "pull access denied" in text or "no such host" in text:
        return (
            "the base image cannot be pulled from here: pass --base with a local image "
            "(scripts/make-base-image.sh builds one with debootstrap)"
        )
    return "`docker info` says whether the engine is healthy"


def runtime_files() -> dict[str, Path]:
    root = SOURCE_ROOT / "runtime"
    return {p.relative_to(SOURCE_ROOT).as_posix(): p for p in sorted(root.rglob("*.py"))}


def wheelhouse(cfg: Config, lock: Path, say: Callable[[str], None]) -> Path:
    """Wheels for `lock`, downloaded once per lock content (hashes checked by pip)."""
    key = sha256_file(lock)[:16]
    target = cfg.state_path / "wheelhouse" / key
    if (target / ".complete").is_file():
        return target
    say(f"downloading wheels for {lock.name} into {target}")
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--require-hashes",
            *PLATFORM_FLAGS,
            "-d",
            str(target),
            "-r",
            str(lock),
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "is ignored" not in ln] or ["no output"]
        raise LauncherError(f"pip could not download the wheels of {lock.name}: {lines[-1]}")
    (target / ".complete").write_text(key)
    return target


def build_context(cfg: Config, reviewed: dict[str, str], lock: Path, dest: Path, say: Callable[[str], None]) -> None:
    shutil.copyfile(SOURCE_ROOT / "Dockerfile", dest / "Dockerfile")
    (dest / "docker").mkdir()
    shutil.copyfile(lock, dest / "docker" / lock.name)
    for rel, src in runtime_files().items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
    stage_files(reviewed_paths(cfg, strict=False), reviewed, dest / "app")
    shutil.copytree(wheelhouse(cfg, lock, say), dest / "wheelhouse", ignore=shutil.ignore_patterns(".complete"))


def build(
    cfg: Config, ledger: Ledger, base: str | None, gpu: bool, say: Callable[[str], None], sky: bool | None = None
) -> BuiltImage:
    """Build the leg image from the reviewed files and record it in the ledger. `sky` (default:
    with `gpu`) bakes in what SkyPilot's runtime installs on each fresh node."""
    docker_cli()
    cmp = guard_hashes(cfg, ledger)  # an image is built only from reviewed bytes
    lock = SOURCE_ROOT / "docker" / ("gpu.lock" if gpu else "cpu.lock")
    base = base or (GPU_BASE if gpu else CPU_BASE)
    digest = digest_lines(cmp.current)
    runtime = {rel: sha256_file(p) for rel, p in runtime_files().items()}
    tag = f"preflight/{cfg.project}:{digest[:12]}"
    labels = {
        f"{LABEL}.files": json.dumps(cmp.current, sort_keys=True),
        f"{LABEL}.files-digest": digest,
        f"{LABEL}.runtime-digest": digest_lines(runtime),
        f"{LABEL}.base": base,
        f"{LABEL}.lock-sha256": sha256_file(lock),
    }
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="preflight-image-") as tmp:
        build_context(cfg, cmp.current, lock, Path(tmp), say)
        argv = ["build", "-t", tag, "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"LOCK=docker/{lock.name}"]
        if gpu if sky is None else sky:
            argv += ["--build-arg", "SKY_NODE_PACKAGES=" + " ".join(SKY_NODE_PACKAGES)]
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        say(f"docker build -t {tag} (base {base})")
        docker(*argv, tmp)
    seconds = time.time() - began
    image_id = docker("image", "inspect", tag, "--format", "{{.Id}}").stdout.strip()
    row = ledger.record_image(
        {
            "tag": tag,
            "image_id": image_id,
            "base": base,
            "lock": lock.name,
            "files_digest": digest,
            "files": cmp.current,
            "runtime_digest": labels[f"{LABEL}.runtime-digest"],
            "built_at": began,
            "seconds": seconds,
        }
    )
    return BuiltImage(row, tag, image_id, seconds)


def baked_files(image: str) -> dict[str, str]:
    """The reviewed-file hashes an image says it was built from (its label)."""
    proc = docker("image", "inspect", image, "--format", "{{json .Config.Labels}}", check=False)
    if proc.returncode != 0:
        raise Refused(f"image {image} is not in the local engine", hint="run `launcher image build`")
    labels = json.loads(proc.stdout or "null") or {}
    if f"{LABEL}.files" not in labels:
        raise Refused(f"image {image} carries no {LABEL}.files label: it was not built by `launcher image build`")
    return json.loads(labels[f"{LABEL}.files"])


def image_for_launch(cfg: Config, ledger: Ledger, reviewed: dict[str, str]) -> str:
    """The newest image built from exactly the reviewed files; refuse (exit 3) otherwise."""
    built = ledger.images(digest_lines(reviewed))
    newest = ledger.images()
    if not built:
        if newest:
            baked = newest[0]["files"]
            differ = sorted(p for p in set(baked) | set(reviewed) if baked.get(p) != reviewed.get(p))
            raise Refused(
                f"image {newest[0]['tag']} was built from other files ({', '.join(differ)} differ from the review)",
                hint="run `launcher image build` to bake the reviewed files",
            )
        raise Refused("no image has been built for this project", hint="run `launcher image build`")
    image = built[0]["image_id"]
    baked = baked_files(image)
    if baked != reviewed:  # the label in the engine, not just our own record, must agree
        differ = sorted(p for p in set(baked) | set(reviewed) if baked.get(p) != reviewed.get(p))
        raise Refused(
            f"image {image[:19]} bakes files that differ from the review: {', '.join(differ)}",
            hint="run `launcher image build`",
        )
    return image


def push(cfg: Config, ledger: Ledger, repository: str, say: Callable[[str], None]) -> str:
    """Tag the newest image built from the reviewed files and push it; returns repo@sha256:..."""
    cmp = guard_hashes(cfg, ledger)
    image = image_for_launch(cfg, ledger, cmp.current)
    row = ledger.images(digest_lines(cmp.current))[0]
    target = f"{repository}:{row['files_digest'][:12]}"
    docker("tag", image, target)
    say(f"docker push {target}")
    docker("push", target)
    digests = json.loads(docker("image", "inspect", target, "--format", "{{json .RepoDigests}}").stdout or "[]")
    ref = next((d for d in digests if d.startswith(repository + "@")), None)
    if ref is None:
        raise DockerError(f"pushed {target} but the engine reports no digest for {repository}")
    ledger.set_pushed(row["id"], ref)
    return ref

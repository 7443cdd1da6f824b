"""The verified mark (`verified.json`): what read-back found, bound to the manifest it checked.

A checkpoint counts for resume only when its mark binds it. The mark names the
manifest's sha256 and every window the verifier read back (path, offset,
length, sha256 of the bytes), and, where the project has a key, an HMAC-SHA256
over all of it. The launcher gives every leg the project's key as a secret
(`LAUNCHER_STORE_KEY`, never recorded), so a mark written without a read-back,
copied from another checkpoint, or forged by anyone who can write the store but
does not hold the key does not bind, and the checkpoint does not count. A
resume also re-reads the recorded windows from the bytes it fetched.

Without a key (the trainer run by hand, outside the launcher) the mark still
binds the manifest and the windows, which catches a stale or hand-made mark
but not a deliberate forgery: the README says so.

`classify_folder` is where every store's listing applies this: a folder counts as a
checkpoint if its manifest parses, and as verified only if its mark binds it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path
from typing import Any

from runtime.contract import STORE_KEY
from runtime.store.base import (
    MANIFEST,
    SHA256_RE,
    VERIFIED,
    CheckpointDamaged,
    CheckpointInfo,
    Damaged,
    Manifest,
    StoreError,
    canonical_json,
    parse_small_json,
    step_of,
)

KEY_ENV = STORE_KEY
SEAL_VERSION = 1
MAX_WINDOWS = 100_000

Window = tuple[str, int, int, str]  # (path, start, length, sha256 of those bytes)


def key_from_env() -> bytes | None:
    """The sealing key the launcher passed this leg, or None when run by hand."""
    text = os.environ.get(KEY_ENV, "").strip()
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise StoreError(f"{KEY_ENV} is not a hex key") from None
    if len(key) < 16:
        raise StoreError(f"{KEY_ENV} is shorter than 16 bytes")
    return key


def _mac(key: bytes, record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "mac"}
    return hmac.new(key, canonical_json(body), hashlib.sha256).hexdigest()


def make_seal(manifest: Manifest, windows: list[Window], bytes_read: int, key: bytes | None) -> dict[str, Any]:
    """The verified mark for `manifest`, after a read-back that matched in `windows`."""
    record: dict[str, Any] = {
        "version": SEAL_VERSION,
        "name": manifest.name,
        "manifest_sha256": manifest.digest(),
        "windows": [list(w) for w in windows],
        "bytes_read": bytes_read,
        "verified_at": round(time.time(), 3),
    }
    if key is not None:
        record["mac"] = _mac(key, record)
    return record


def check_seal(manifest: Manifest, record: Any, key: bytes | None) -> dict[str, Any]:
    """`record` if it binds `manifest` (and carries this key's MAC); else CheckpointDamaged."""
    if not isinstance(record, dict) or record.get("version") != SEAL_VERSION:
        raise CheckpointDamaged("verified.json is not a verified mark of this version (no read-back recorded)")
    if record.get("name") != manifest.name or record.get("manifest_sha256") != manifest.digest():
        raise CheckpointDamaged("verified.json was not written for this manifest")
    sizes = {f.path: f.size for f in manifest.files}
    windows = record.get("windows")
    if not isinstance(windows, list) or not 0 < len(windows) <= MAX_WINDOWS:
        raise CheckpointDamaged("verified.json records no read-back windows")
    covered = set()
    for w in windows:
        if not (
            isinstance(w, list)
            and len(w) == 4
            and w[0] in sizes
            and isinstance(w[3], str)
            and SHA256_RE.match(w[3])
            and all(isinstance(n, int) and not isinstance(n, bool) for n in w[1:3])
            and w[1] >= 0
            and w[2] > 0
            and w[1] + w[2] <= sizes[w[0]]
        ):
            raise CheckpointDamaged(f"verified.json has a window that does not fit the manifest: {str(w)[:80]}")
        covered.add(w[0])
    unread = [p for p, size in sizes.items() if size and p not in covered]
    if unread:
        raise CheckpointDamaged(f"verified.json read nothing back of {unread[0]}")
    if key is not None:
        mac = record.get("mac")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, record)):
            raise CheckpointDamaged("verified.json is not sealed with this project's key (forged or foreign)")
    return record


def classify_folder(
    name: str, manifest_raw: bytes, seal_raw: bytes | None, key: bytes | None
) -> tuple[CheckpointInfo | None, Damaged | None]:
    """One listed folder -> a checkpoint (verified only if its mark binds the manifest), or damage."""
    step = step_of(name)
    assert step is not None
    try:
        manifest = Manifest.from_json(parse_small_json(manifest_raw, MANIFEST))
        if manifest.name != name:
            raise CheckpointDamaged(f"manifest names {manifest.name}, found in folder {name}")
    except CheckpointDamaged as err:
        return None, Damaged(name, step, str(err))
    if seal_raw is None:
        return CheckpointInfo(name, step, manifest, False), None
    try:
        seal = check_seal(manifest, parse_small_json(seal_raw, VERIFIED), key)
    except CheckpointDamaged as err:
        return CheckpointInfo(name, step, manifest, False), Damaged(name, step, f"not counted as verified: {err}")
    return CheckpointInfo(name, step, manifest, True, seal), None


def check_windows(folder: Path, seal: dict[str, Any]) -> None:
    """The fetched bytes hold, at every window the verifier read, what it read there."""
    for path, start, length, sha in seal["windows"]:
        with (folder / path).open("rb") as fh:
            fh.seek(start)
            got = hashlib.sha256(fh.read(length)).hexdigest()
        if got != sha:
            raise CheckpointDamaged(f"{path}[{start}:+{length}] differs from what the verifier read back")

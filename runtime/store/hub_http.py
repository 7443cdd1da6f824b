"""The Hub store's GETs (runtime.store.hub), one attempt each, on the `huggingface_hub` client's
shared httpx session, and that session's timeout. The store retries them (its `_call`); each
reads no more than it expects: a small JSON up to its limit, a range to the bytes asked (+1 to
know it was more), a file to the size its manifest says, the whole checked against its sha256.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import httpx
from huggingface_hub import get_session

from runtime.store.base import CheckpointDamaged, StoreError, TransientStoreError
from runtime.store.hub_errors import classify_status
from runtime.store.safeio import create_inside

CHUNK = 1 << 20

_session_lock = threading.Lock()
_session_timeout: float | None = None


def configure_session(timeout_s: float) -> None:
    """Give the client's shared httpx session a timeout (it has none by default).

    Process-wide, as the session is: set once, by the first store opened."""
    global _session_timeout
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import hf_request_event_hook  # pinned client version

    with _session_lock:
        if _session_timeout == timeout_s:
            return
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        set_client_factory(
            lambda: httpx.Client(
                event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True, timeout=timeout
            )
        )
        _session_timeout = timeout_s


def get_small(url: str, headers: dict[str, str], timeout_s: float, path_in_repo: str, limit: int) -> bytes:
    """GET a small file whole (a manifest, a verified mark, a parts index); CheckpointDamaged past `limit` bytes."""
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout_s) as resp:
        if resp.status_code != 200:
            raise classify_status(resp.status_code, f"GET {path_in_repo}")
        body = b""
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise CheckpointDamaged(f"GET {path_in_repo}: larger than {limit} bytes")
        return body


def range_get(url: str, headers: dict[str, str], timeout_s: float, where: str, start: int, length: int) -> bytes:
    """GET `length` bytes from `start`: status 206 and a Content-Range naming exactly those bytes, or StoreError."""
    end = start + length - 1
    headers = {**headers, "Range": f"bytes={start}-{end}"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout_s) as resp:
        if resp.status_code != 206:
            if resp.status_code in (401, 403, 404, 429) or resp.status_code >= 500:
                raise classify_status(resp.status_code, f"range GET {where}")
            raise StoreError(f"status {resp.status_code}, expected 206 (Range not honored)")
        got = resp.headers.get("Content-Range", "")
        want = f"bytes {start}-{end}/"
        if not got.startswith(want):
            raise StoreError(f"Content-Range {got!r}, expected {want}<size>")
        body = b""
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > length:  # never read past what was asked (+1 to know it was more)
                break
        return body


def download(
    sources: list[tuple[str, str, int]],
    headers: dict[str, str],
    timeout_s: float,
    root: Path,
    rel: str,
    sha256: str,
    label: str,
) -> None:
    """GET one file into root/rel from its `sources` (the file, or its parts in order, each its path
    in the repo, its URL and its size): never more bytes than a source's size + 1, the whole checked
    against `sha256`."""
    (root / rel).unlink(missing_ok=True)  # a retry starts over
    digest, fh = hashlib.sha256(), None
    try:
        for where, url, size in sources:
            got = 0
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout_s) as resp:
                if resp.status_code != 200:
                    raise classify_status(resp.status_code, f"GET {where}")
                fh = fh or os.fdopen(create_inside(root, rel), "wb")
                for chunk in resp.iter_bytes(CHUNK):
                    got += len(chunk)
                    if got > size:
                        raise CheckpointDamaged(f"GET {where}: more than the {size} bytes the manifest says")
                    digest.update(chunk)
                    fh.write(chunk)
            if got != size:
                raise TransientStoreError(f"GET {where}: {got} bytes, expected {size}")
    finally:
        if fh is not None:
            fh.close()
    if digest.hexdigest() != sha256:
        raise CheckpointDamaged(f"{label} does not match its manifest's sha256")

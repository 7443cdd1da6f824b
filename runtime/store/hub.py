"""Hugging Face Hub store (`hf://owner/repo[@revision]`), on the real `huggingface_hub` client.

Wire protocol only: commits, listings, ranged GETs. What to verify or prune is
decided in `runtime.cycle`, never here.

- A checkpoint is pushed as one commit holding its files and its manifest, so
  it exists whole or not at all; a checkpoint of more files than a commit may hold
  (`files_per_commit`, 100: the Hub's advice) goes in several, the manifest in the
  last, so it still exists only once whole (a folder without its manifest is never
  listed). `verified.json` is a commit of its own, made only after a read-back
  matched; delete is one commit removing the folder.
- Listing is one `list_repo_tree` call (a missing or empty repo: one
  round-trip, "nothing here"), plus one small GET per checkpoint manifest.
- Sizes and LFS sha256 come from `get_paths_info`; regular (non-LFS) files
  carry their git blob id, which the verifier checks instead.
- `read_range` is a Range GET through the client's own session that checks the
  status is 206 and `Content-Range` names exactly the bytes asked for, and
  never reads more than asked + 1 byte (a server that ignores Range cannot make
  verification read the whole object).
- Errors: 401/403 -> StoreAuthError (never "nothing here"); 429, 5xx, timeouts
  and connection errors -> TransientStoreError, retried with backoff within a
  bounded time; 404 -> FileNotFoundError. Every request has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_session, hf_hub_url
from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import build_hf_headers

from runtime.store.base import (MANIFEST, MAX_SMALL_JSON, VERIFIED, CheckpointDamaged, CheckpointInfo, Damaged,
                                Manifest, RemoteFile, StoreAuthError, StoreError, StoreScan, TransientStoreError,
                                canonical_json, step_of)
from runtime.store.retry import RetryPolicy, with_retry
from runtime.store.safeio import create_inside
from runtime.store.seal import classify_folder

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 60.0
CHUNK = 1 << 20
FILES_PER_COMMIT = 100
"""The most files one commit holds: the Hub's advice (its docs: "Repositories: recommendations and
limits"); a sharded checkpoint of many ranks has more, and is pushed in several commits."""

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
        set_client_factory(lambda: httpx.Client(event_hooks={"request": [hf_request_event_hook]},
                                                follow_redirects=True, timeout=timeout))
        _session_timeout = timeout_s


def classify(err: BaseException, what: str) -> BaseException:
    """Map a client/transport error to the store's error types."""
    if isinstance(err, RepositoryNotFoundError):
        status = err.response.status_code if err.response is not None else 404
        if status in (401, 403):
            return StoreAuthError(f"{what}: repo not found or not readable with this token (HTTP {status})")
        return FileNotFoundError(f"{what}: repository not found")
    if isinstance(err, (RevisionNotFoundError, EntryNotFoundError)):
        return FileNotFoundError(f"{what}: {type(err).__name__}")
    if isinstance(err, HfHubHTTPError) and err.response is not None:
        status = err.response.status_code
        if status in (401, 403):
            return StoreAuthError(f"{what}: HTTP {status}, the token was refused (check HF_TOKEN)")
        if status == 429 or status >= 500:
            return TransientStoreError(f"{what}: HTTP {status}")
        return StoreError(f"{what}: HTTP {status}")
    if isinstance(err, httpx.HTTPStatusError):
        return classify_status(err.response.status_code, what)
    if isinstance(err, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)):
        return TransientStoreError(f"{what}: {type(err).__name__}: {err}")
    if isinstance(err, httpx.HTTPError):  # a local protocol or URL error: a retry will not fix it
        return StoreError(f"{what}: {type(err).__name__}: {err}")
    return err


def classify_status(status: int, what: str) -> BaseException:
    if status in (401, 403):
        return StoreAuthError(f"{what}: HTTP {status}, the token was refused (check HF_TOKEN)")
    if status == 404:
        return FileNotFoundError(f"{what}: HTTP 404")
    if status == 429 or status >= 500:
        return TransientStoreError(f"{what}: HTTP {status}")
    return StoreError(f"{what}: HTTP {status}")


def parse_hf_uri(uri: str) -> tuple[str, str]:
    """hf://owner/repo[@revision] -> (repo_id, revision)."""
    rest = uri[len("hf://"):]
    repo_id, _, revision = rest.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise StoreError(f"expected hf://owner/repo[@revision], got {uri!r}")
    return repo_id, revision or "main"


class HubStore:
    """Checkpoints as folders `<namespace>/step-<N>/` in a Hub model repo."""

    def __init__(self, uri: str, namespace: str = "", *, token: str | None = None, endpoint: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 key: bytes | None = None, files_per_commit: int = FILES_PER_COMMIT) -> None:
        self.repo_id, self.revision = parse_hf_uri(uri)
        self.files_per_commit = max(2, files_per_commit)
        self.key = key
        self.prefix = f"{namespace.strip('/')}/" if namespace.strip("/") else ""
        self.uri = f"hf://{self.repo_id}@{self.revision}/{self.prefix}".rstrip("/")
        # None: take HF_TOKEN; "" (or no HF_TOKEN): anonymous, never a token file lying around.
        self.token = (os.environ.get("HF_TOKEN") if token is None else token) or None
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.api = HfApi(endpoint=self.endpoint, token=self.token or False)
        self._repo_ready = False
        configure_session(timeout_s)
        # The runtime reports pushes as events; tqdm bars would only garble the leg log.
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    # --- plumbing ------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        def attempt() -> T:
            try:
                return fn()
            except (HfHubHTTPError, httpx.HTTPError) as err:
                raise classify(err, what) from err
        return with_retry(attempt, policy=self.retry)

    def _path(self, name: str, path: str = "") -> str:
        if step_of(name) is None:
            raise StoreError(f"not a checkpoint name: {name!r}")
        return f"{self.prefix}{name}/{path}" if path else f"{self.prefix}{name}"

    def _url(self, path_in_repo: str) -> str:
        return hf_hub_url(self.repo_id, path_in_repo, revision=self.revision, endpoint=self.endpoint)

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return build_hf_headers(token=self.token or False, headers=extra)

    def _get_small(self, path_in_repo: str, limit: int = MAX_SMALL_JSON) -> bytes:
        def get() -> bytes:
            with get_session().stream("GET", self._url(path_in_repo), headers=self._headers(),
                                      follow_redirects=True, timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    raise classify_status(resp.status_code, f"GET {path_in_repo}")
                body = b""
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise CheckpointDamaged(f"GET {path_in_repo}: larger than {limit} bytes")
                return body
        return self._call(f"GET {path_in_repo}", get)

    def _commit(self, what: str, make_ops: Callable[[], list[Any]]) -> None:
        """One commit; the operations are rebuilt on every attempt (they cache upload state)."""
        if not self._repo_ready:
            self._call("create repo", lambda: self.api.create_repo(self.repo_id, private=True, exist_ok=True))
            self._repo_ready = True
        self._call(what, lambda: self.api.create_commit(self.repo_id, make_ops(), commit_message=what,
                                                        revision=self.revision))

    # --- the Store interface -------------------------------------------------

    def scan(self) -> StoreScan:
        def tree() -> list[Any]:
            return list(self.api.list_repo_tree(self.repo_id, path_in_repo=self.prefix.rstrip("/") or None,
                                                recursive=True, revision=self.revision))
        try:
            entries = self._call("list checkpoints", tree)
        except FileNotFoundError:
            return StoreScan([], [])  # no repo, no revision or no folder yet: nothing here
        present: dict[str, set[str]] = {}
        for entry in entries:
            rel = entry.path[len(self.prefix):] if entry.path.startswith(self.prefix) else None
            if rel and rel.count("/") == 1:
                folder, leaf = rel.split("/")
                if step_of(folder) is not None:
                    present.setdefault(folder, set()).add(leaf)
        good, damaged = [], []
        for name, leaves in present.items():
            if MANIFEST not in leaves:
                continue
            try:
                manifest_raw = self._get_small(self._path(name, MANIFEST))
                seal_raw = self._get_small(self._path(name, VERIFIED)) if VERIFIED in leaves else None
            except (CheckpointDamaged, FileNotFoundError) as err:  # too big, or gone between listing and reading
                damaged.append(Damaged(name, step_of(name) or 0, str(err)))
                continue
            info, bad = classify_folder(name, manifest_raw, seal_raw, self.key)
            good += [info] if info else []
            damaged += [bad] if bad else []
        return StoreScan(sorted(good, key=lambda c: c.step), sorted(damaged, key=lambda d: d.step))

    def list(self) -> list[CheckpointInfo]:
        return self.scan().checkpoints

    def push(self, local_dir: Path, manifest: Manifest) -> None:
        body = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode()

        paths = [f.path for f in manifest.files] + [MANIFEST]
        per = self.files_per_commit
        parts = [paths[i:i + per] for i in range(0, len(paths), per)]  # the manifest in the last
        for index, part in enumerate(parts, 1):
            def ops(part: list[str] = part) -> list[Any]:
                return [CommitOperationAdd(self._path(manifest.name, path),
                                           body if path == MANIFEST else str(local_dir / path)) for path in part]
            suffix = f" ({index}/{len(parts)})" if len(parts) > 1 else ""
            self._commit(f"checkpoint {manifest.name}{suffix}", ops)

    def push_part(self, local_dir: Path, name: str, paths: list[str]) -> None:
        """One node's files of checkpoint `name`, in commits of `files_per_commit`; no manifest,
        so nothing lists the checkpoint until `commit`."""
        per = self.files_per_commit
        for start in range(0, len(paths), per):
            part = paths[start:start + per]
            self._commit(f"checkpoint {name} part", lambda part=part: [
                CommitOperationAdd(self._path(name, path), str(local_dir / path)) for path in part])

    def commit(self, manifest: Manifest) -> None:
        """The manifest, in a commit of its own: the checkpoint exists from here."""
        body = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode()
        self._commit(f"checkpoint {manifest.name}", lambda: [CommitOperationAdd(self._path(manifest.name, MANIFEST), body)])

    def drop_parts(self, name: str) -> None:
        """Files an earlier attempt committed are overwritten by the next; nothing to do first."""

    def remote_files(self, name: str, paths: list[str]) -> dict[str, RemoteFile]:
        full = {self._path(name, p): p for p in paths}
        infos = self._call(f"paths-info {name}", lambda: self.api.get_paths_info(
            self.repo_id, list(full), revision=self.revision))
        out = {}
        for info in infos:
            if info.path in full and hasattr(info, "size"):
                sha = info.lfs.sha256 if getattr(info, "lfs", None) else None
                out[full[info.path]] = RemoteFile(info.size, sha, None if sha else info.blob_id)
        return out

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        where = self._path(name, path)
        end = start + length - 1

        def get() -> bytes:
            headers = self._headers({"Range": f"bytes={start}-{end}"})
            with get_session().stream("GET", self._url(where), headers=headers, follow_redirects=True,
                                      timeout=self.timeout_s) as resp:
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
        return self._call(f"range GET {where}", get)

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        body = json.dumps(record, indent=1, sort_keys=True).encode()
        self._commit(f"verified {name}", lambda: [CommitOperationAdd(self._path(name, VERIFIED), body)])

    def fetch(self, name: str, dest: Path) -> Path:
        info, bad = classify_folder(name, self._get_small(self._path(name, MANIFEST)), None, None)
        if info is None:
            raise CheckpointDamaged(f"{name}: {bad.reason if bad else 'damaged'}")
        target = dest / name
        target.mkdir(parents=True)
        for entry in info.manifest.files:
            self._download(self._path(name, entry.path), target, entry.path, entry.size, entry.sha256)
        (target / MANIFEST).write_bytes(canonical_json(info.manifest.to_json()))
        return target

    def _download(self, path_in_repo: str, root: Path, rel: str, size: int, sha256: str) -> None:
        """GET one file into root/rel: never more than `size` + 1 bytes, checked against `sha256`."""
        def get() -> None:
            (root / rel).unlink(missing_ok=True)  # a retry starts over
            digest, got = hashlib.sha256(), 0
            with get_session().stream("GET", self._url(path_in_repo), headers=self._headers(),
                                      follow_redirects=True, timeout=self.timeout_s) as resp:
                if resp.status_code != 200:
                    raise classify_status(resp.status_code, f"GET {path_in_repo}")
                with os.fdopen(create_inside(root, rel), "wb") as fh:
                    for chunk in resp.iter_bytes(CHUNK):
                        got += len(chunk)
                        if got > size:
                            raise CheckpointDamaged(f"GET {path_in_repo}: more than the {size} bytes the manifest says")
                        digest.update(chunk)
                        fh.write(chunk)
            if got != size:
                raise TransientStoreError(f"GET {path_in_repo}: {got} bytes, expected {size}")
            if digest.hexdigest() != sha256:
                raise CheckpointDamaged(f"{path_in_repo} does not match its manifest's sha256")
        self._call(f"download {path_in_repo}", get)

    def delete(self, name: str) -> None:
        folder = self._path(name)
        self._commit(f"delete {name}", lambda: [CommitOperationDelete(f"{folder}/", is_folder=True)])

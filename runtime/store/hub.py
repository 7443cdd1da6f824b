"""Hugging Face Hub store (`hf://owner/repo[@revision]`), on the real `huggingface_hub` client.

Wire protocol only: commits, listings, ranged GETs. What to verify or prune is
decided in `runtime.checkpoint.cycle`, never here.

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
  verification read the whole object). Every GET: `runtime.store.hub_http`.
- Errors: 401/403 -> StoreAuthError (never "nothing here"); 429, 5xx, timeouts
  and connection errors -> TransientStoreError, retried with backoff within a
  bounded time; 404 -> FileNotFoundError. Every request has a timeout.
- The Hub's limits (`runtime.store.hub_limits`, launcher.yaml `hub:`): a file above
  `max_file_bytes` is stored in parts (`runtime.store.hub_parts`, the parts counted in
  `files_per_commit`); every commit request counts against `commits_per_hour` in a
  rolling hour, and a push that would go over is refused before its first commit.
"""

from __future__ import annotations

import builtins  # builtins.list in signatures below the class's own list() method, which shadows the name there
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import build_hf_headers

from runtime.store.base import (
    MANIFEST,
    MAX_SMALL_JSON,
    VERIFIED,
    CheckpointDamaged,
    CheckpointInfo,
    Damaged,
    Manifest,
    RemoteFile,
    StoreError,
    StoreScan,
    canonical_json,
    step_of,
)
from runtime.store.hub_errors import classify
from runtime.store.hub_http import configure_session, download, get_small, range_get
from runtime.store.hub_limits import (
    CYCLE_EXTRA_COMMITS,
    DEFAULT_MAX_FILE_BYTES,
    HUB_COMMITS_PER_HOUR,
    HUB_FILES_PER_COMMIT,
    CommitBudget,
)
from runtime.store.hub_parts import (
    MAX_INDEX_BYTES,
    PARTS_INDEX,
    FileWindow,
    PartsIndex,
    batches,
    close_windows,
    joined_size,
    parse_index,
    plan,
    upload_items,
)
from runtime.store.retry import RetryPolicy, with_retry
from runtime.store.seal import classify_folder

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 60.0
FILES_PER_COMMIT = HUB_FILES_PER_COMMIT
"""The most files one commit holds: the Hub's advice (its docs: "Repositories: recommendations and
limits"); a sharded checkpoint of many ranks has more, and is pushed in several commits."""


def parse_hf_uri(uri: str) -> tuple[str, str]:
    """hf://owner/repo[@revision] -> (repo_id, revision)."""
    rest = uri[len("hf://") :]
    repo_id, _, revision = rest.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise StoreError(f"expected hf://owner/repo[@revision], got {uri!r}")
    return repo_id, revision or "main"


class HubStore:
    """Checkpoints as folders `<namespace>/step-<N>/` in a Hub model repo."""

    def __init__(
        self,
        uri: str,
        namespace: str = "",
        *,
        token: str | None = None,
        endpoint: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        key: bytes | None = None,
        files_per_commit: int = FILES_PER_COMMIT,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        commits_per_hour: int = HUB_COMMITS_PER_HOUR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repo_id, self.revision = parse_hf_uri(uri)
        self.files_per_commit = max(2, files_per_commit)
        self.max_file_bytes = max(1, max_file_bytes)
        self.budget = CommitBudget(max(1, commits_per_hour), clock)
        self._indexes: dict[str, PartsIndex | None] = {}
        """Each checkpoint's parts index (None: no file split), as pushed or read; a scan resets it."""
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
        return self._call(
            f"GET {path_in_repo}",
            lambda: get_small(self._url(path_in_repo), self._headers(), self.timeout_s, path_in_repo, limit),
        )

    def _commit(self, what: str, make_ops: Callable[[], list[Any]]) -> None:
        """One commit; the operations are rebuilt on every attempt (they cache upload state), and
        every attempt counts against the commit budget (the Hub may have made one that timed out)."""
        if not self._repo_ready:
            self._call("create repo", lambda: self.api.create_repo(self.repo_id, private=True, exist_ok=True))
            self._repo_ready = True

        def attempt() -> Any:
            ops = make_ops()
            try:
                self.budget.check(1, what)
                self.budget.spend()
                return self.api.create_commit(self.repo_id, ops, commit_message=what, revision=self.revision)
            finally:
                close_windows(ops)

        self._call(what, attempt)

    def _add(self, name: str, local_dir: Path, item: Any, blobs: dict[str, bytes]) -> Any:
        """The operation adding one push item: a small JSON (by name), a whole file or one part."""
        if isinstance(item, str):
            return CommitOperationAdd(self._path(name, item), blobs[item])
        dest, src, start, length = item
        whole = dest == src
        return CommitOperationAdd(
            self._path(name, dest), str(local_dir / src) if whole else FileWindow(local_dir / src, start, length)
        )

    def _parts(self, name: str) -> PartsIndex | None:
        """The checkpoint's parts index (None: no file is split); untrusted, checked on read."""
        if name not in self._indexes:
            where = self._path(name, PARTS_INDEX)
            try:
                raw = self._get_small(where, MAX_INDEX_BYTES)
            except FileNotFoundError:
                self._indexes[name] = None
            else:
                self._indexes[name] = parse_index(raw, where)
        return self._indexes[name]

    # --- the Store interface -------------------------------------------------

    def scan(self) -> StoreScan:
        def tree() -> list[Any]:
            return list(
                self.api.list_repo_tree(
                    self.repo_id, path_in_repo=self.prefix.rstrip("/") or None, recursive=True, revision=self.revision
                )
            )

        try:
            entries = self._call("list checkpoints", tree)
        except FileNotFoundError:
            return StoreScan([], [])  # no repo, no revision or no folder yet: nothing here
        present: dict[str, set[str]] = {}
        for entry in entries:
            rel = entry.path[len(self.prefix) :] if entry.path.startswith(self.prefix) else None
            if rel and rel.count("/") == 1:
                folder, leaf = rel.split("/")
                if step_of(folder) is not None:
                    present.setdefault(folder, set()).add(leaf)
        self._indexes = {name: None for name, leaves in present.items() if PARTS_INDEX not in leaves}
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
        self._push(local_dir, manifest.name, {f.path: f.size for f in manifest.files}, manifest)

    def push_part(self, local_dir: Path, name: str, paths: builtins.list[str]) -> None:
        """One node's files of checkpoint `name`, in commits of `files_per_commit`; no manifest,
        so nothing lists the checkpoint until `commit`."""
        self._push(local_dir, name, {p: (local_dir / p).stat().st_size for p in paths}, None)

    def commit(self, manifest: Manifest) -> None:
        """The manifest (with the parts index), in a commit of its own: the checkpoint exists from here."""
        self._push(
            Path(), manifest.name, {}, manifest, plan({f.path: f.size for f in manifest.files}, self.max_file_bytes)
        )

    def _push(
        self,
        local_dir: Path,
        name: str,
        sizes: dict[str, int],
        manifest: Manifest | None,
        index: PartsIndex | None = None,
    ) -> None:
        """Commit `sizes`' files (split where above `max_file_bytes`), then the manifest and the
        parts index together in the last commit; refused up front if the commits, and for a
        checkpoint its verified mark and a prune's delete, do not fit in the hour's budget."""
        index = index or plan(sizes, self.max_file_bytes)
        blobs = {PARTS_INDEX: index.to_json() if index else b""}
        tail = [PARTS_INDEX] if index and manifest else []
        if manifest is not None:
            blobs[MANIFEST] = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode()
            tail.append(MANIFEST)
        chunks = batches(upload_items(sizes, index), tail, self.files_per_commit)
        extra = CYCLE_EXTRA_COMMITS if manifest else 0
        self.budget.check(
            len(chunks) + extra,
            f"pushing {name} ({len(chunks)} commit(s)"
            + (", then its verified mark and a prune's delete)" if extra else ")"),
        )
        self._indexes.pop(name, None)
        for n, chunk in enumerate(chunks, 1):
            suffix = f" ({n}/{len(chunks)})" if len(chunks) > 1 else ""
            title = f"checkpoint {name}{suffix}" if manifest else f"checkpoint {name} part"

            def ops(chunk: list[Any] = chunk) -> list[Any]:
                return [self._add(name, local_dir, item, blobs) for item in chunk]

            self._commit(title, ops)
        if manifest is not None:
            self._indexes[name] = index

    def drop_parts(self, name: str) -> None:
        """Files an earlier attempt committed are overwritten by the next; nothing to do first."""

    def remote_files(self, name: str, paths: builtins.list[str]) -> dict[str, RemoteFile]:
        """A split file: its parts' summed size (or -1 when they cannot make one file), no hash."""
        index = self._parts(name)
        split = {p: index.parts(p) for p in paths if index and p in index.files}
        if set(paths) & {part for parts in split.values() for part in parts}:
            raise CheckpointDamaged(f"{name}/{PARTS_INDEX}: a part name is a file of the checkpoint")
        full = {self._path(name, q): q for p in paths for q in split.get(p, [p])}
        infos = self._call(
            f"paths-info {name}", lambda: self.api.get_paths_info(self.repo_id, list(full), revision=self.revision)
        )
        found = {full[i.path]: i for i in infos if i.path in full and hasattr(i, "size")}
        out = {}
        for path in paths:
            if path in split:
                assert index is not None
                size = joined_size([found[q].size if q in found else None for q in split[path]], index.part_bytes)
                out.update({path: RemoteFile(size)} if size is not None else {})
            elif path in found:
                info = found[path]
                sha = info.lfs.sha256 if getattr(info, "lfs", None) else None
                out[path] = RemoteFile(info.size, sha, None if sha else info.blob_id)
        return out

    def read_range(self, name: str, path: str, start: int, length: int) -> bytes:
        index = self._parts(name)
        if index is None or path not in index.files:
            return self._range_get(self._path(name, path), start, length)
        out = b""
        for part, offset, take in index.spans(path, start, length):
            data = self._range_get(self._path(name, part), offset, take)
            out += data
            if len(data) != take:  # the caller sees the wrong length
                break
        return out

    def _range_get(self, where: str, start: int, length: int) -> bytes:
        return self._call(
            f"range GET {where}",
            lambda: range_get(self._url(where), self._headers(), self.timeout_s, where, start, length),
        )

    def mark_verified(self, name: str, record: dict[str, Any]) -> None:
        body = json.dumps(record, indent=1, sort_keys=True).encode()
        self._commit(f"verified {name}", lambda: [CommitOperationAdd(self._path(name, VERIFIED), body)])

    def fetch(self, name: str, dest: Path) -> Path:
        info, bad = classify_folder(name, self._get_small(self._path(name, MANIFEST)), None, None)
        if info is None:
            raise CheckpointDamaged(f"{name}: {bad.reason if bad else 'damaged'}")
        index = self._parts(name)
        if index is not None:
            index.check_against({f.path: f.size for f in info.manifest.files}, f"{name}/{PARTS_INDEX}")
        target = dest / name
        target.mkdir(parents=True)
        for entry in info.manifest.files:
            if index is not None and entry.path in index.files:
                sources = list(
                    zip(
                        (self._path(name, p) for p in index.parts(entry.path)), index.part_sizes(entry.path, entry.size)
                    )
                )
            else:
                sources = [(self._path(name, entry.path), entry.size)]
            self._download(sources, target, entry.path, entry.sha256, self._path(name, entry.path))
        (target / MANIFEST).write_bytes(canonical_json(info.manifest.to_json()))
        return target

    def _download(self, sources: builtins.list[tuple[str, int]], root: Path, rel: str, sha256: str, label: str) -> None:
        """GET one file into root/rel from its `sources` (the file, or its parts in order, each with
        its size), retried (runtime.store.hub_http.download)."""
        located = [(where, self._url(where), size) for where, size in sources]
        self._call(
            f"download {label}", lambda: download(located, self._headers(), self.timeout_s, root, rel, sha256, label)
        )

    def delete(self, name: str) -> None:
        folder = self._path(name)
        self._indexes.pop(name, None)
        self._commit(f"delete {name}", lambda: [CommitOperationDelete(f"{folder}/", is_folder=True)])

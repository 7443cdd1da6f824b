"""A loopback Hugging Face Hub that the real `huggingface_hub` 1.16 client talks to, with faults on demand.

Why: the Hub store must be tested against the client's real wire behaviour (preupload -> LFS batch ->
PUT to another origin -> ndjson commit; 302 redirects to a CDN; ranged GETs) and against servers that
misbehave, with no network. Stdlib only; model repos only; repo ids are always `namespace/name`.

Two origins, both on 127.0.0.1 with ephemeral ports: `url` (the Hub API and `/resolve/`) and `lfs_url`
(stands in for the S3/CDN: LFS uploads are PUT there and LFS downloads are redirected there).

Pointing the client at it (checked against huggingface_hub 1.16.1):
- In-process: `HfApi(endpoint=server.url, token=...)`, `hf_hub_download(..., endpoint=server.url)` and
  `hf_hub_url(..., endpoint=server.url)` all honour `endpoint=`; `HF_ENDPOINT` is NOT needed (and setting
  it after import has no effect: `constants.ENDPOINT` is read at import time).
- Subprocess: set `HF_ENDPOINT=<url>`, `HF_HUB_DISABLE_XET=1`, `HF_HOME=<tmp>` and `HF_TOKEN` in its env.
- Xet: `HF_HUB_DISABLE_XET` is also import-time, but `is_xet_available()` reads
  `huggingface_hub.constants.HF_HUB_DISABLE_XET` per call, so a test can monkeypatch that. Even with Xet
  enabled this server answers the LFS batch with `"transfer": "basic"` and never sends `X-Xet-Hash`, so
  the client falls back to plain LFS either way.
- Tokens: with `token=None` the client sends `HF_TOKEN` or the token file under `HF_HOME` (read per call);
  pass the token explicitly, or `token=False` for anonymous calls, or a stray token gets a 401.
- `hf_hub_download` caches by ETag under `HF_HUB_CACHE` (import-time): pass `cache_dir=`.
- Redirects: the metadata HEAD does not follow the 302 to `lfs_url`; the GET goes straight to `Location`
  without `Authorization` (other port = other origin), so `lfs_url` needs no token. Raw session calls
  need `follow_redirects=True` for LFS files (the shared session has it on by default).
- The client verifies only the size of a download, never its sha256 (flip_byte/shift_span pass it).
- Errors: the client maps `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound). A wrong token
  gets 401 + `X-Error-Message: Invalid credentials in Authorization header`, which the client raises as a
  plain `HfHubHTTPError` (status 401). An anonymous read that is refused (`require_auth=True` or a
  private repo) gets 401 + `X-Error-Code: RepoNotFound`, as the real Hub does:
  `RepositoryNotFoundError` with status 401. Anonymous writes get a plain 401.
- Retries: `hf_hub_download` retries 429/5xx on its HEAD and 429 on its GET (sleeping 1 s first);
  preupload, LFS batch, LFS PUT/verify and tree pages after the first go through `http_backoff`
  (429/5xx retried); the first tree page, paths-info, create_repo and the commit POST are not retried.

Differences from the real Hub, on purpose: a new repo has an empty initial commit (the Hub seeds
`.gitattributes`); a file is LFS when its size exceeds `lfs_threshold` (the Hub also sniffs binary
content); LFS objects are stored once for the whole server; listing a path that is a file is a 404.

Limits, the Hub's by default (its docs: "Repositories: recommendations and limits"): a file above
`max_file_bytes` (50 GB) is refused at preupload and at commit with 413; a commit of more than
`max_files_per_commit` operations (100) with 422; a commit past `max_commits_per_hour` (128) to one
repo in the last hour (`clock`, monotonic) with 429 -- a commit refused counts for none. Each raises
in the client as `HfHubHTTPError` with that status.

Faults (`inject`) are taken first-in first-out; a request takes at most one status/hang fault (before it
is handled, even before auth) and at most one body fault (after). A file request is a GET/HEAD on
`/resolve/` or on an `lfs_url` object; `path` globs (fnmatch) its path in the repo. Body faults
(flip_byte, shift_span, ignore_range, truncate; see hub_server_faults.py) are taken only by GETs answered
with file bytes (200/206; not a 302, not a HEAD). status_429, status_503 and hang are taken by any file
request, and with `api=True` by every other request too (API calls, LFS batch/verify, LFS PUTs).

`requests` logs every answered request as LoggedRequest(method, path, query, status, range, origin):
raw percent-encoded path, raw query, the Range header or None, origin "hub" or "lfs".
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, Callable, NamedTuple
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlencode, urlsplit

from tests.fakes.hub_server_faults import (BODY_MODES, REQUEST_MODES, Fault, HubError, Origin, Reply, corrupt,
                                      serve_bytes)


class LoggedRequest(NamedTuple):
    """One answered request; `path` is the raw (percent-encoded) URL path, `origin` is "hub" or "lfs"."""

    method: str
    path: str
    query: str
    status: int
    range: str | None
    origin: str


@dataclass(frozen=True)
class Entry:
    """A file in a commit's tree: regular bytes (`data`) or an LFS pointer (`sha256`)."""

    size: int
    git_oid: str
    sha256: str | None
    data: bytes | None
    commit: str


@dataclass
class Commit:
    oid: str
    title: str
    date: str
    files: dict[str, Entry]


@dataclass
class Repo:
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


class HubServer:
    """The fake Hub. `token` is the one accepted token; `require_auth` refuses anonymous reads too;
    files larger than `lfs_threshold` bytes are LFS; tree listings are paginated by `page_size`;
    `user` is the namespace of repos created without one and the whoami name; the `max_*` limits
    are the Hub's unless a test lowers them (module docstring)."""

    def __init__(self, token: str = "hf_good", *, require_auth: bool = False, lfs_threshold: int = 1024,
                 page_size: int = 1000, user: str = "tester", max_file_bytes: int = 50 * 10**9,
                 max_files_per_commit: int = 100, max_commits_per_hour: int = 128,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.token, self.require_auth, self.user = token, require_auth, user
        self.lfs_threshold, self.page_size = lfs_threshold, page_size
        self.max_file_bytes, self.max_files_per_commit = max_file_bytes, max_files_per_commit
        self.max_commits_per_hour, self.clock = max_commits_per_hour, clock
        self._commit_times: dict[str, deque[float]] = {}
        self.requests: list[LoggedRequest] = []
        self.repos: dict[str, Repo] = {}
        self.objects: dict[str, bytes] = {}  # LFS objects by sha256
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._commit_counter = 0
        self.commit_sizes: list[tuple[str, int]] = []
        """(title, operations) of every commit made through the API, in order."""
        self._hub, self._lfs = Origin(self, "hub"), Origin(self, "lfs")
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.lfs_url = f"http://127.0.0.1:{self._lfs.server_address[1]}"
        self._threads: list[threading.Thread] = []

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> HubServer:
        for origin in (self._hub, self._lfs):
            thread = threading.Thread(target=origin.serve_forever, kwargs={"poll_interval": 0.05},
                                      name=f"hub-server-{origin.origin}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Release hung requests, stop both origins, close their connections and join every thread."""
        self._stopping.set()
        for origin in (self._hub, self._lfs):
            if self._threads:
                origin.shutdown()
            origin.server_close()
            origin.close_connections(timeout=5)
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults -----------------------------------------------------------------------------

    def inject(self, mode: str, times: int = 1, path: str | None = None, *, api: bool = False,
               seconds: float = 30.0, offset: int = 1) -> None:
        """Queue a fault for the next `times` matching requests (see the module docstring).

        Modes: flip_byte, shift_span, truncate, ignore_range (body faults, see hub_server_faults.py);
        status_429 (with `Retry-After: 0`), status_503; hang (holds the request `seconds`, released early
        by stop(), then answers normally). `offset`: how far `shift_span` moves the span (mod the file
        size, so it must not be a multiple of it). `path`: fnmatch glob on the file's path in the repo."""
        if mode not in BODY_MODES + REQUEST_MODES or times < 1:
            raise ValueError(f"bad fault {mode!r} x{times}")
        if api and (mode in BODY_MODES or path is not None):
            raise ValueError("api=True is for status/hang faults with path=None")
        with self._lock:
            self._faults.append(Fault(mode, times, path, api, seconds, offset))

    def reset_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def faults(self) -> list[Fault]:
        """The faults not yet used up (copies)."""
        with self._lock:
            return [Fault(**vars(f)) for f in self._faults]

    def _take_fault(self, modes: tuple[str, ...], file_path: str | None) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.mode in modes and fault.matches(file_path):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    # --- request entry point ------------------------------------------------------------------

    def handle(self, origin: str, method: str, raw_path: str, headers: Message, body: bytes) -> Reply:
        url = urlsplit(raw_path)
        segs = [unquote(s) for s in url.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        file_path = self._file_path(origin, method, segs, query)
        fault = self._take_fault(REQUEST_MODES, file_path)
        if fault and fault.mode == "hang":
            self._stopping.wait(fault.seconds)
        if fault and fault.mode != "hang":
            status = 429 if fault.mode == "status_429" else 503
            extra = {"Retry-After": "0", "RateLimit": '"api";r=0;t=0'} if status == 429 else {}
            reply = HubError(status, f"injected {fault.mode}", headers=extra).reply()
        else:
            try:
                route = self._route_lfs if origin == "lfs" else self._route_hub
                reply = route(method, url, segs, query, headers, body)
            except HubError as err:
                reply = err.reply()
            except Exception as err:  # a server bug: surface it as a 500 the test will see
                reply = HubError(500, f"{type(err).__name__}: {err}").reply()
            carries_bytes = method == "GET" and reply.content is not None
            if carries_bytes and (body_fault := self._take_fault(BODY_MODES, file_path)):
                reply = corrupt(body_fault, reply)
        with self._lock:
            self.requests.append(LoggedRequest(method, url.path, url.query, reply.status,
                                               headers.get("Range"), origin))
        return reply

    @staticmethod
    def _file_path(origin: str, method: str, segs: list[str], query: dict[str, str]) -> str | None:
        if method not in ("GET", "HEAD"):
            return None
        if origin == "lfs":
            return query.get("path", "") if segs[:1] == ["objects"] else None
        return "/".join(segs[4:]) if len(segs) > 4 and segs[2] == "resolve" else None

    # --- routing ------------------------------------------------------------------------------

    def _route_lfs(self, method: str, url: SplitResult, segs: list[str], query: dict[str, str], headers: Message,
                   body: bytes) -> Reply:
        if method == "PUT" and len(segs) == 3 and segs[0] == "upload":
            oid, size = segs[1], int(segs[2])
            if len(body) != size or hashlib.sha256(body).hexdigest() != oid:
                raise HubError(400, f"uploaded bytes do not match oid {oid} / size {size}")
            with self._lock:
                self.objects[oid] = body
            return Reply(200, {"ETag": f'"{oid}"'})
        if method in ("GET", "HEAD") and len(segs) == 2 and segs[0] == "objects":
            data = self.objects.get(segs[1])
            if data is None:
                raise HubError(404, "NoSuchKey")
            return serve_bytes(data, headers.get("Range"), {"ETag": f'"{segs[1]}"'})
        raise HubError(404, f"no route for {method} {url.path}")

    def _route_hub(self, method: str, url: SplitResult, segs: list[str], query: dict[str, str], headers: Message,
                   body: bytes) -> Reply:
        anonymous = self._check_token(headers)
        route = (method, *segs[:4])
        if route == ("GET", "api", "whoami-v2"):
            self._need_token(anonymous)
            return self._json({"type": "user", "name": self.user,
                               "auth": {"accessToken": {"displayName": "test", "role": "write"}}})
        if route == ("POST", "api", "repos", "create"):
            return self._create_repo(anonymous, json.loads(body))
        if route == ("DELETE", "api", "repos", "delete"):
            self._need_token(anonymous)
            payload = json.loads(body)
            with self._lock:
                if self.repos.pop(self._repo_id(payload), None) is None:
                    raise HubError(404, "Repository not found", "RepoNotFound")
            return self._json({})
        if len(segs) >= 4 and segs[:2] == ["api", "models"]:
            return self._route_repo_api(method, url, f"{segs[2]}/{segs[3]}", segs[4:], query, anonymous, body)
        if len(segs) == 6 and segs[1].endswith(".git") and segs[2:5] == ["info", "lfs", "objects"]:
            self._need_token(anonymous)
            repo_id = f"{segs[0]}/{segs[1][:-4]}"
            self._repo(repo_id, anonymous)
            if (method, segs[5]) == ("POST", "batch"):
                return self._lfs_batch(repo_id, json.loads(body))
            if (method, segs[5]) == ("POST", "verify"):
                return self._lfs_verify(json.loads(body))
        if method in ("GET", "HEAD") and len(segs) > 4 and segs[2] == "resolve":
            return self._resolve(f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:]), anonymous,
                                 headers.get("Range"))
        raise HubError(404, f"no route for {method} {url.path}")

    def _route_repo_api(self, method: str, url: SplitResult, repo_id: str, rest: list[str], query: dict[str, str],
                        anonymous: bool, body: bytes) -> Reply:
        verb = rest[0] if rest else ""
        if verb in ("preupload", "commit"):
            self._need_token(anonymous)
        repo = self._repo(repo_id, anonymous)
        if method == "GET" and (not rest or (verb == "revision" and len(rest) == 2)):
            return self._repo_info(repo_id, repo, rest[1] if rest else "main")
        if method == "GET" and verb == "tree" and len(rest) >= 2:
            return self._tree(repo, url, rest[1], "/".join(rest[2:]).strip("/"), query)
        if method == "POST" and len(rest) == 2 and verb == "paths-info":
            return self._paths_info(repo, rest[1], body)
        if method == "POST" and len(rest) == 2 and verb == "preupload":
            return self._preupload(repo, rest[1], json.loads(body))
        if method == "POST" and len(rest) == 2 and verb == "commit":
            if query.get("create_pr"):
                raise HubError(400, "create_pr is not supported by this test server")
            return self._commit(repo_id, repo, rest[1], body)
        raise HubError(404, f"no route for {method} {url.path}")

    # --- auth and lookups -----------------------------------------------------------------------

    def _check_token(self, headers: Message) -> bool:
        """True when anonymous; a present but wrong token is refused for every request."""
        auth = headers.get("Authorization")
        if auth is None:
            return True
        if auth != f"Bearer {self.token}":
            raise HubError(401, "Invalid credentials in Authorization header")
        return False

    @staticmethod
    def _need_token(anonymous: bool) -> None:
        if anonymous:
            raise HubError(401, "You must be authenticated to do this")

    def _repo(self, repo_id: str, anonymous: bool) -> Repo:
        with self._lock:
            repo = self.repos.get(repo_id)
        if anonymous and (self.require_auth or (repo is not None and repo.private)):
            raise HubError(401, "Invalid username or password.", "RepoNotFound")
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _repo_id(self, payload: dict[str, Any]) -> str:
        if payload.get("type", "model") != "model":
            raise HubError(400, "only model repos are supported by this test server")
        return f"{payload.get('organization') or self.user}/{payload['name']}"

    @staticmethod
    def _revision(repo: Repo, revision: str) -> Commit:
        oid = repo.branches.get(revision, revision)
        if oid not in repo.commits:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    @staticmethod
    def _json(value: Any, headers: dict[str, str] | None = None) -> Reply:
        return Reply(200, {"Content-Type": "application/json", **(headers or {})}, json.dumps(value).encode())

    def _new_commit(self, repo_id: str, title: str, files: dict[str, Entry]) -> Commit:
        self._commit_counter += 1
        oid = hashlib.sha1(f"{repo_id}:{self._commit_counter}:{time.time_ns()}".encode()).hexdigest()
        return Commit(oid, title, now(), files)

    # --- endpoints ------------------------------------------------------------------------------

    def _create_repo(self, anonymous: bool, payload: dict[str, Any]) -> Reply:
        self._need_token(anonymous)
        repo_id = self._repo_id(payload)
        with self._lock:
            if repo_id in self.repos:
                # The client reads `url` from the 409 body when exist_ok=True.
                raise HubError(409, "You already created this model repo", fields={"url": f"{self.url}/{repo_id}"})
            repo = Repo(private=bool(payload.get("private")) or payload.get("visibility") == "private")
            initial = self._new_commit(repo_id, "initial commit", {})
            repo.commits[initial.oid], repo.branches["main"] = initial, initial.oid
            self.repos[repo_id] = repo
        return self._json({"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _repo_info(self, repo_id: str, repo: Repo, revision: str) -> Reply:
        commit = self._revision(repo, revision)
        return self._json({"id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": commit.oid,
                           "private": repo.private, "lastModified": commit.date, "disabled": False,
                           "gated": False, "siblings": [{"rfilename": p} for p in sorted(commit.files)]})

    def _entry_json(self, repo: Repo, path: str, files: dict[str, Entry], expand: bool) -> dict[str, Any]:
        """A tree / paths-info item: a file (with `lfs` when LFS) or a directory (when `path` is one)."""
        entry = files.get(path)
        if entry is not None:
            out: dict[str, Any] = {"type": "file", "path": path, "size": entry.size, "oid": entry.git_oid}
            if entry.sha256:
                out["lfs"] = {"oid": entry.sha256, "size": entry.size,
                              "pointerSize": len(lfs_pointer(entry.sha256, entry.size))}
            commits = [entry.commit]
        else:
            inside = sorted(p for p in files if p.startswith(path + "/"))
            tree = json.dumps([(p, files[p].git_oid) for p in inside]).encode()
            out = {"type": "directory", "path": path, "oid": hashlib.sha1(tree).hexdigest()}
            commits = [files[p].commit for p in inside]
        if expand:
            order = list(repo.commits)
            last = repo.commits[max(commits, key=order.index)]
            out["lastCommit"] = {"id": last.oid, "title": last.title, "date": last.date}
        return out

    def _tree(self, repo: Repo, url: SplitResult, revision: str, base: str, query: dict[str, str]) -> Reply:
        commit = self._revision(repo, revision)
        recursive = query.get("recursive", "").lower() == "true"
        prefix = f"{base}/" if base else ""
        if base and not any(p.startswith(prefix) for p in commit.files):
            raise HubError(404, f"Entry not found: {base}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        paths: set[str] = set()
        for path in commit.files:
            if path.startswith(prefix):
                parts = path[len(prefix):].split("/")
                depth = len(parts) if recursive else 1
                paths.update(prefix + "/".join(parts[:i]) for i in range(1, depth + 1))
        expand = query.get("expand", "").lower() == "true"
        items = [self._entry_json(repo, p, commit.files, expand) for p in sorted(paths)]
        cursor = int(query.get("cursor", 0))
        headers = {"X-Repo-Commit": commit.oid}
        if cursor + self.page_size < len(items):
            next_query = urlencode({**query, "cursor": cursor + self.page_size})
            headers["Link"] = f'<{self.url}{url.path}?{next_query}>; rel="next"'
        return self._json(items[cursor:cursor + self.page_size], headers)

    def _paths_info(self, repo: Repo, revision: str, body: bytes) -> Reply:
        commit = self._revision(repo, revision)
        if body.lstrip().startswith(b"{"):
            payload = json.loads(body)
            paths, expand = payload.get("paths", []), bool(payload.get("expand"))
        else:
            form = parse_qs(body.decode())
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[-1].lower() == "true"
        found = [p.strip("/") for p in dict.fromkeys(paths)
                 if p.strip("/") in commit.files or any(f.startswith(p.strip("/") + "/") for f in commit.files)]
        return self._json([self._entry_json(repo, p, commit.files, expand) for p in found])

    def _preupload(self, repo: Repo, revision: str, payload: dict[str, Any]) -> Reply:
        commit = self._revision(repo, revision)
        out = []
        for item in payload["files"]:
            self._check_size(item["path"], item["size"])
            entry = commit.files.get(item["path"])
            info = {"path": item["path"], "uploadMode": "lfs" if item["size"] > self.lfs_threshold else "regular",
                    "shouldIgnore": False}
            if entry is not None:  # lets the client skip unchanged files (it compares sha256 / git oid)
                info["oid"] = entry.sha256 or entry.git_oid
            out.append(info)
        return self._json({"files": out, "commitOid": commit.oid})

    def _lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> Reply:
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise HubError(422, "only the 'upload' operation with the 'basic' transfer is supported")
        objects = []
        for obj in payload["objects"]:
            item: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            with self._lock:
                stored = obj["oid"] in self.objects
            if not stored:
                item["actions"] = {
                    "upload": {"href": f"{self.lfs_url}/upload/{obj['oid']}/{obj['size']}"},
                    "verify": {"href": f"{self.url}/{repo_id}.git/info/lfs/objects/verify"},
                }
            objects.append(item)
        return Reply(200, {"Content-Type": "application/vnd.git-lfs+json"},
                     json.dumps({"transfer": "basic", "objects": objects}).encode())

    def _lfs_verify(self, payload: dict[str, Any]) -> Reply:
        with self._lock:
            data = self.objects.get(payload["oid"])
        if data is None or len(data) != payload["size"]:
            raise HubError(404, f"object {payload['oid']} not uploaded (or wrong size)")
        return self._json({"message": "ok"})

    def _commit(self, repo_id: str, repo: Repo, revision: str, body: bytes) -> Reply:
        """Apply every operation to a copy of the branch head's tree; keep it only if all succeed."""
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first ndjson line must be the header")
        header = lines[0]["value"]
        if len(lines) - 1 > self.max_files_per_commit:
            raise HubError(422, f"a commit holds at most {self.max_files_per_commit} files, this one "
                           f"{len(lines) - 1}: split it in several commits")
        with self._lock:
            self._check_rate(repo_id)
            if revision not in repo.branches:
                raise HubError(404, f"Invalid rev id: {revision} (commits go to a branch)", "RevisionNotFound")
            head = repo.branches[revision]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            commit = self._new_commit(repo_id, header.get("summary", ""), dict(repo.commits[head].files))
            for line in lines[1:]:
                self._apply(commit, line["key"], line["value"])
            for path in commit.files:
                parents = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
                if any(p in commit.files for p in parents):
                    raise HubError(400, f"{path}: a parent folder is a file")
            repo.commits[commit.oid], repo.branches[revision] = commit, commit.oid
            self.commit_sizes.append((commit.title, len(lines) - 1))
            self._commit_times.setdefault(repo_id, deque()).append(self.clock())
        return self._json({"commitOid": commit.oid, "commitUrl": f"{self.url}/{repo_id}/commit/{commit.oid}",
                           "pullRequestUrl": None, "success": True})

    def _check_size(self, path: str, size: int) -> None:
        if size > self.max_file_bytes:
            raise HubError(413, f"{path}: {size} bytes, above the {self.max_file_bytes} bytes a file may have")

    def _check_rate(self, repo_id: str) -> None:
        """429 once `max_commits_per_hour` commits were made to the repo in the last hour."""
        times, now = self._commit_times.setdefault(repo_id, deque()), self.clock()
        while times and now - times[0] >= 3600:
            times.popleft()
        if len(times) >= self.max_commits_per_hour:
            wait = str(int(3600 - (now - times[0])))
            raise HubError(429, f"rate limit: {len(times)} commits to {repo_id} in the last hour (at most "
                           f"{self.max_commits_per_hour})", headers={"Retry-After": wait})

    def _apply(self, commit: Commit, key: str, value: dict[str, Any]) -> None:
        path = value["path"].strip("/") if key == "deletedFolder" else value["path"]
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise HubError(400, f"invalid path {value['path']!r}")
        files = commit.files
        if key == "file":
            data = base64.b64decode(value["content"])
            self._check_size(path, len(data))
            files[path] = Entry(len(data), git_blob_oid(data), None, data, commit.oid)
        elif key == "lfsFile":
            oid = value["oid"]
            data = self.objects.get(oid)
            if data is None or value.get("size", len(data)) != len(data):
                raise HubError(400, f"{path}: LFS object {oid} was never uploaded (or has another size)")
            self._check_size(path, len(data))
            files[path] = Entry(len(data), git_blob_oid(lfs_pointer(oid, len(data))), oid, None, commit.oid)
        elif key == "deletedFile":
            if files.pop(path, None) is None:
                raise HubError(404, f"{path}: A file with this name doesn't exist", "EntryNotFound")
        elif key == "deletedFolder":
            doomed = [p for p in files if p.startswith(path + "/")]
            if not doomed:
                raise HubError(404, f"{path}: A folder with this name doesn't exist", "EntryNotFound")
            for p in doomed:
                del files[p]
        else:
            raise HubError(400, f"unknown commit operation {key!r}")

    def _resolve(self, repo_id: str, revision: str, path: str, anonymous: bool, range_header: str | None) -> Reply:
        commit = self._revision(self._repo(repo_id, anonymous), revision)
        entry = commit.files.get(path)
        headers = {"X-Repo-Commit": commit.oid}
        if entry is None:
            raise HubError(404, "Entry not found", "EntryNotFound", headers)
        headers["ETag"] = f'"{entry.git_oid}"'
        if entry.sha256:
            headers.update({"Location": f"{self.lfs_url}/objects/{entry.sha256}?path={quote(path)}",
                            "X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
            return Reply(302, headers)
        return serve_bytes(entry.data or b"", range_header, headers)

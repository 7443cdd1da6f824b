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

import hashlib
import json
import threading
import time
from collections import deque
from email.message import Message
from typing import Any, Callable, NamedTuple
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from tests.fakes.hub_repos import Commit, Entry, Repo, RepoEndpoints, now
from tests.fakes.hub_server_faults import (
    BODY_MODES,
    REQUEST_MODES,
    Fault,
    HubError,
    Origin,
    Reply,
    corrupt,
    serve_bytes,
)


class LoggedRequest(NamedTuple):
    """One answered request; `path` is the raw (percent-encoded) URL path, `origin` is "hub" or "lfs"."""

    method: str
    path: str
    query: str
    status: int
    range: str | None
    origin: str


class HubServer(RepoEndpoints):
    """The fake Hub. `token` is the one accepted token; `require_auth` refuses anonymous reads too;
    files larger than `lfs_threshold` bytes are LFS; tree listings are paginated by `page_size`;
    `user` is the namespace of repos created without one and the whoami name; the `max_*` limits
    are the Hub's unless a test lowers them (module docstring)."""

    def __init__(
        self,
        token: str = "hf_good",
        *,
        require_auth: bool = False,
        lfs_threshold: int = 1024,
        page_size: int = 1000,
        user: str = "tester",
        max_file_bytes: int = 50 * 10**9,
        max_files_per_commit: int = 100,
        max_commits_per_hour: int = 128,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
            thread = threading.Thread(
                target=origin.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"hub-server-{origin.origin}",
                daemon=True,
            )
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

    def inject(
        self,
        mode: str,
        times: int = 1,
        path: str | None = None,
        *,
        api: bool = False,
        seconds: float = 30.0,
        offset: int = 1,
    ) -> None:
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
            self.requests.append(LoggedRequest(method, url.path, url.query, reply.status, headers.get("Range"), origin))
        return reply

    @staticmethod
    def _file_path(origin: str, method: str, segs: list[str], query: dict[str, str]) -> str | None:
        if method not in ("GET", "HEAD"):
            return None
        if origin == "lfs":
            return query.get("path", "") if segs[:1] == ["objects"] else None
        return "/".join(segs[4:]) if len(segs) > 4 and segs[2] == "resolve" else None

    # --- routing ------------------------------------------------------------------------------

    def _route_lfs(
        self, method: str, url: SplitResult, segs: list[str], query: dict[str, str], headers: Message, body: bytes
    ) -> Reply:
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

    def _route_hub(
        self, method: str, url: SplitResult, segs: list[str], query: dict[str, str], headers: Message, body: bytes
    ) -> Reply:
        anonymous = self._check_token(headers)
        route = (method, *segs[:4])
        if route == ("GET", "api", "whoami-v2"):
            self._need_token(anonymous)
            return self._json(
                {"type": "user", "name": self.user, "auth": {"accessToken": {"displayName": "test", "role": "write"}}}
            )
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
            return self._resolve(f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:]), anonymous, headers.get("Range"))
        raise HubError(404, f"no route for {method} {url.path}")

    def _route_repo_api(
        self,
        method: str,
        url: SplitResult,
        repo_id: str,
        rest: list[str],
        query: dict[str, str],
        anonymous: bool,
        body: bytes,
    ) -> Reply:
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

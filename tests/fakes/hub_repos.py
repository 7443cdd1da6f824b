"""The repositories of the loopback Hub in tests/fakes/hub_server.py: what a repo holds (commits of
files, regular or LFS) and the endpoints that read and write them (create, info, tree, paths-info,
preupload, LFS batch/verify, commit, resolve), with the Hub's limits on files and commits.

Why apart: hub_server.py takes a request in (faults, auth, routing) and logs it; this is what the
Hub does with it, as `RepoEndpoints`, a part of HubServer (its lock, token check and lookups).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qs, quote, urlencode

from tests.fakes.hub_server_faults import HubError, Reply, serve_bytes


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


class RepoEndpoints:
    """HubServer's endpoints (a mixin: the state, lock and lookups are HubServer's)."""

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
        return self._json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit.oid,
                "private": repo.private,
                "lastModified": commit.date,
                "disabled": False,
                "gated": False,
                "siblings": [{"rfilename": p} for p in sorted(commit.files)],
            }
        )

    def _entry_json(self, repo: Repo, path: str, files: dict[str, Entry], expand: bool) -> dict[str, Any]:
        """A tree / paths-info item: a file (with `lfs` when LFS) or a directory (when `path` is one)."""
        entry = files.get(path)
        if entry is not None:
            out: dict[str, Any] = {"type": "file", "path": path, "size": entry.size, "oid": entry.git_oid}
            if entry.sha256:
                out["lfs"] = {
                    "oid": entry.sha256,
                    "size": entry.size,
                    "pointerSize": len(lfs_pointer(entry.sha256, entry.size)),
                }
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
                parts = path[len(prefix) :].split("/")
                depth = len(parts) if recursive else 1
                paths.update(prefix + "/".join(parts[:i]) for i in range(1, depth + 1))
        expand = query.get("expand", "").lower() == "true"
        items = [self._entry_json(repo, p, commit.files, expand) for p in sorted(paths)]
        cursor = int(query.get("cursor", 0))
        headers = {"X-Repo-Commit": commit.oid}
        if cursor + self.page_size < len(items):
            next_query = urlencode({**query, "cursor": cursor + self.page_size})
            headers["Link"] = f'<{self.url}{url.path}?{next_query}>; rel="next"'
        return self._json(items[cursor : cursor + self.page_size], headers)

    def _paths_info(self, repo: Repo, revision: str, body: bytes) -> Reply:
        commit = self._revision(repo, revision)
        if body.lstrip().startswith(b"{"):
            payload = json.loads(body)
            paths, expand = payload.get("paths", []), bool(payload.get("expand"))
        else:
            form = parse_qs(body.decode())
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[-1].lower() == "true"
        found = [
            p.strip("/")
            for p in dict.fromkeys(paths)
            if p.strip("/") in commit.files or any(f.startswith(p.strip("/") + "/") for f in commit.files)
        ]
        return self._json([self._entry_json(repo, p, commit.files, expand) for p in found])

    def _preupload(self, repo: Repo, revision: str, payload: dict[str, Any]) -> Reply:
        commit = self._revision(repo, revision)
        out = []
        for item in payload["files"]:
            self._check_size(item["path"], item["size"])
            entry = commit.files.get(item["path"])
            info = {
                "path": item["path"],
                "uploadMode": "lfs" if item["size"] > self.lfs_threshold else "regular",
                "shouldIgnore": False,
            }
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
        return Reply(
            200,
            {"Content-Type": "application/vnd.git-lfs+json"},
            json.dumps({"transfer": "basic", "objects": objects}).encode(),
        )

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
            raise HubError(
                422,
                f"a commit holds at most {self.max_files_per_commit} files, this one "
                f"{len(lines) - 1}: split it in several commits",
            )
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
        return self._json(
            {
                "commitOid": commit.oid,
                "commitUrl": f"{self.url}/{repo_id}/commit/{commit.oid}",
                "pullRequestUrl": None,
                "success": True,
            }
        )

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
            raise HubError(
                429,
                f"rate limit: {len(times)} commits to {repo_id} in the last hour (at most {self.max_commits_per_hour})",
                headers={"Retry-After": wait},
            )

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
            headers.update(
                {
                    "Location": f"{self.lfs_url}/objects/{entry.sha256}?path={quote(path)}",
                    "X-Linked-Etag": f'"{entry.sha256}"',
                    "X-Linked-Size": str(entry.size),
                }
            )
            return Reply(302, headers)
        return serve_bytes(entry.data or b"", range_header, headers)

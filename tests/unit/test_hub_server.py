"""The loopback Hub (tests/fakes/hub_server.py) driven by the real huggingface_hub client.

Why: the Hub store's tests trust this server to answer where the client looks exactly as the Hub does,
and to misbehave exactly as asked; these tests pin both, through the client's own code paths.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    get_hf_file_metadata,
    get_session,
    hf_hub_download,
    hf_hub_url,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFolder
from huggingface_hub.utils.sha import git_hash

from tests.fakes.hub_server import HubServer

TOKEN = "hf_good"
REPO = "team/ckpts"
LFS_PATH, REG_PATH = "ckpt/weights.bin", "ckpt/meta.bin"
CONTENT = {LFS_PATH: os.urandom(3 * 1024 * 1024), REG_PATH: os.urandom(1000)}  # LFS above 1 KiB, regular below


@pytest.fixture(autouse=True)
def client_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Plain LFS (no Xet), and no stray token from the environment or ~/.cache/huggingface."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def api(hub: HubServer) -> HfApi:
    return HfApi(endpoint=hub.url, token=TOKEN)


@pytest.fixture
def seeded(hub: HubServer, api: HfApi) -> str:
    """REPO with one LFS and one regular file under ckpt/; returns the commit id."""
    api.create_repo(REPO)
    ops = [CommitOperationAdd(path, data) for path, data in CONTENT.items()]
    return api.create_commit(REPO, ops, commit_message="seed").oid


def url(hub: HubServer, path: str, revision: str = "main") -> str:
    return hf_hub_url(REPO, path, revision=revision, endpoint=hub.url)


def get(hub: HubServer, path: str, byte_range: str | None = None, **kwargs) -> httpx.Response:
    """A raw GET through the client's shared session, following the LFS redirect like the store does."""
    headers = {"Range": byte_range} if byte_range else {}
    return get_session().get(url(hub, path), headers=headers, follow_redirects=True, **kwargs)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_create_repo_conflict_exist_ok_and_delete(hub: HubServer, api: HfApi) -> None:
    api.create_repo(REPO)
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(REPO)
    assert err.value.response.status_code == 409
    assert len(api.repo_info(REPO).sha) == 40
    api.delete_repo(REPO)
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info(REPO)
    api.delete_repo(REPO, missing_ok=True)


def test_commit_sends_lfs_bytes_to_the_second_origin(hub: HubServer, seeded: str) -> None:
    oid = sha256(CONTENT[LFS_PATH])
    assert [(r.method, r.origin, r.path) for r in hub.requests] == [
        ("POST", "hub", "/api/repos/create"),
        ("POST", "hub", f"/api/models/{REPO}/preupload/main"),
        ("POST", "hub", f"/{REPO}.git/info/lfs/objects/batch"),
        ("PUT", "lfs", f"/upload/{oid}/{len(CONTENT[LFS_PATH])}"),
        ("POST", "hub", f"/{REPO}.git/info/lfs/objects/verify"),
        ("POST", "hub", f"/api/models/{REPO}/commit/main"),
    ]
    assert hub.objects == {oid: CONTENT[LFS_PATH]}


def test_unchanged_files_and_known_objects_are_not_uploaded_again(hub: HubServer, api: HfApi, seeded: str) -> None:
    hub.requests.clear()
    same = api.create_commit(REPO, [CommitOperationAdd(p, d) for p, d in CONTENT.items()], commit_message="same")
    assert same.oid == seeded  # preupload returned the remote oids: nothing to commit
    copy = api.create_commit(REPO, [CommitOperationAdd("copy.bin", CONTENT[LFS_PATH])], commit_message="copy")
    assert copy.oid != seeded
    assert not [r for r in hub.requests if r.method == "PUT"]  # the batch answer had no upload action


def test_tree_and_paths_info_give_sizes_blob_ids_and_lfs_sha256(api: HfApi, seeded: str) -> None:
    tree = {entry.path: entry for entry in api.list_repo_tree(REPO, recursive=True)}
    assert set(tree) == {"ckpt", LFS_PATH, REG_PATH}
    assert isinstance(tree["ckpt"], RepoFolder)
    assert (tree[LFS_PATH].size, tree[LFS_PATH].lfs.sha256) == (len(CONTENT[LFS_PATH]), sha256(CONTENT[LFS_PATH]))
    assert (tree[REG_PATH].size, tree[REG_PATH].lfs) == (1000, None)
    assert tree[REG_PATH].blob_id == git_hash(CONTENT[REG_PATH])
    assert [e.path for e in api.list_repo_tree(REPO)] == ["ckpt"]
    expanded = list(api.list_repo_tree(REPO, "ckpt", expand=True))
    assert {e.last_commit.oid for e in expanded} == {seeded}
    infos = {i.path: i for i in api.get_paths_info(REPO, [LFS_PATH, REG_PATH, "ckpt/absent", "ckpt"])}
    assert set(infos) == {LFS_PATH, REG_PATH, "ckpt"}
    assert (infos[LFS_PATH].size, infos[LFS_PATH].lfs.sha256) == (len(CONTENT[LFS_PATH]), sha256(CONTENT[LFS_PATH]))


def test_tree_listing_is_paginated_like_the_hub() -> None:
    with HubServer(token=TOKEN, page_size=2) as small:
        api = HfApi(endpoint=small.url, token=TOKEN)
        api.create_repo(REPO)
        api.create_commit(REPO, [CommitOperationAdd(f"d/{i}.txt", b"x") for i in range(5)], commit_message="5")
        assert len(list(api.list_repo_tree(REPO, recursive=True))) == 6
        assert len([r for r in small.requests if "/tree/" in r.path]) == 3


def test_hf_hub_download_and_metadata(hub: HubServer, seeded: str, tmp_path) -> None:
    for path, data in CONTENT.items():
        local = hf_hub_download(REPO, path, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)
        assert Path(local).read_bytes() == data
    meta = get_hf_file_metadata(url(hub, LFS_PATH), token=TOKEN)
    assert (meta.etag, meta.size, meta.commit_hash) == (sha256(CONTENT[LFS_PATH]), len(CONTENT[LFS_PATH]), seeded)
    assert meta.location.startswith(hub.lfs_url)


@pytest.mark.parametrize("path", [LFS_PATH, REG_PATH])
def test_range_gets_are_exact_on_both_origins(hub: HubServer, seeded: str, path: str) -> None:
    data, n = CONTENT[path], len(CONTENT[path])
    resp = get(hub, path, "bytes=3-9")
    assert (resp.status_code, resp.headers["Content-Range"], resp.content) == (206, f"bytes 3-9/{n}", data[3:10])
    assert resp.headers["Content-Length"] == "7" and resp.headers["Accept-Ranges"] == "bytes"
    assert str(resp.url).startswith(hub.lfs_url if path == LFS_PATH else hub.url)
    resp = get(hub, path, "bytes=5-")
    assert (resp.status_code, resp.headers["Content-Range"], resp.content) == (206, f"bytes 5-{n - 1}/{n}", data[5:])
    resp = get(hub, path, f"bytes={n}-")
    assert (resp.status_code, resp.headers["Content-Range"]) == (416, f"bytes */{n}")


def test_delete_folder_commit_keeps_history(hub: HubServer, api: HfApi, seeded: str, tmp_path) -> None:
    ops = [CommitOperationDelete("ckpt/", is_folder=True), CommitOperationAdd("keep.txt", b"k")]
    after = api.create_commit(REPO, ops, commit_message="rm").oid
    assert [e.path for e in api.list_repo_tree(REPO, recursive=True)] == ["keep.txt"]
    assert {e.path for e in api.list_repo_tree(REPO, recursive=True, revision=seeded)} == {"ckpt", *CONTENT}
    old = hf_hub_download(REPO, REG_PATH, revision=seeded, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)
    assert Path(old).read_bytes() == CONTENT[REG_PATH]
    top = hf_hub_download(REPO, "keep.txt", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)
    assert Path(top).read_bytes() == b"k"
    assert api.repo_info(REPO).sha == after
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree(REPO, revision="f" * 40))


def test_commits_are_all_or_nothing(hub: HubServer, api: HfApi, seeded: str) -> None:
    ops = [CommitOperationAdd("new.txt", b"x"), CommitOperationDelete("absent.txt")]
    with pytest.raises(RemoteEntryNotFoundError, match="doesn't exist"):
        api.create_commit(REPO, ops, commit_message="bad delete")
    never_uploaded = (
        '{"key": "header", "value": {"summary": "raw"}}\n'
        '{"key": "file", "value": {"path": "new.txt", "content": "eA==", "encoding": "base64"}}\n'
        f'{{"key": "lfsFile", "value": {{"path": "x.bin", "algo": "sha256", "oid": "{"a" * 64}"}}}}\n'
    )
    resp = get_session().post(
        f"{hub.url}/api/models/{REPO}/commit/main",
        content=never_uploaded,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"},
    )
    assert resp.status_code == 400 and "never uploaded" in resp.headers["X-Error-Message"]
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(REPO, [CommitOperationAdd("new.txt", b"x")], commit_message="stale", parent_commit="0" * 40)
    assert err.value.response.status_code == 412
    assert api.repo_info(REPO).sha == seeded
    assert {e.path for e in api.list_repo_tree(REPO, recursive=True)} == {"ckpt", *CONTENT}


def test_lfs_put_checks_sha256_and_size(hub: HubServer, api: HfApi) -> None:
    api.create_repo(REPO)
    data = os.urandom(4096)
    batch = {"operation": "upload", "transfers": ["basic"], "objects": [{"oid": sha256(data), "size": len(data)}]}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answer = get_session().post(f"{hub.url}/{REPO}.git/info/lfs/objects/batch", json=batch, headers=auth).json()
    href = answer["objects"][0]["actions"]["upload"]["href"]
    assert href.startswith(hub.lfs_url)
    assert get_session().put(href, content=data[:-1] + b"!").status_code == 400
    assert get_session().put(href, content=data[:-1]).status_code == 400
    assert hub.objects == {}
    assert get_session().put(href, content=data).status_code == 200
    answer = get_session().post(f"{hub.url}/{REPO}.git/info/lfs/objects/batch", json=batch, headers=auth).json()
    assert "actions" not in answer["objects"][0]


def test_empty_repo_missing_repo_path_and_file(hub: HubServer, api: HfApi, tmp_path) -> None:
    api.create_repo(REPO)
    assert list(api.list_repo_tree(REPO, recursive=True)) == []
    with pytest.raises(RepositoryNotFoundError) as err:
        list(api.list_repo_tree("team/absent"))
    assert err.value.response.status_code == 404
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(REPO, "no/such/dir"))
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.bin", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)


def test_auth(hub: HubServer, api: HfApi, seeded: str) -> None:
    with pytest.raises(HfHubHTTPError) as err:
        list(HfApi(endpoint=hub.url, token="hf_bad").list_repo_tree(REPO))
    assert err.value.response.status_code == 401 and not isinstance(err.value, RepositoryNotFoundError)
    assert api.whoami()["name"] == "tester"
    anonymous = HfApi(endpoint=hub.url, token=False)
    assert len(list(anonymous.list_repo_tree(REPO, recursive=True))) == 3
    with pytest.raises(HfHubHTTPError) as err:
        anonymous.create_commit(REPO, [CommitOperationAdd("x.txt", b"x")], commit_message="anon")
    assert err.value.response.status_code == 401
    api.create_repo("team/private", private=True)
    with pytest.raises(RepositoryNotFoundError) as err:
        list(anonymous.list_repo_tree("team/private"))
    assert err.value.response.status_code == 401
    hub.require_auth = True
    with pytest.raises(RepositoryNotFoundError) as err:
        list(anonymous.list_repo_tree(REPO))
    assert err.value.response.status_code == 401
    assert get_session().get(url(hub, REG_PATH)).status_code == 401
    assert len(list(api.list_repo_tree(REPO, recursive=True))) == 3


@pytest.mark.parametrize("path", [LFS_PATH, REG_PATH])
def test_body_faults_on_range_gets(hub: HubServer, seeded: str, path: str) -> None:
    data, n = CONTENT[path], len(CONTENT[path])
    exact = (206, f"bytes 100-199/{n}", "100")
    origin = "lfs" if path == LFS_PATH else "hub"

    def fetch() -> httpx.Response:
        resp = get(hub, path, "bytes=100-199")
        assert hub.requests[-1].origin == origin
        return resp

    def head(resp: httpx.Response) -> tuple[int, str, str]:
        return resp.status_code, resp.headers["Content-Range"], resp.headers["Content-Length"]

    hub.inject("flip_byte", path=path)
    resp = fetch()
    assert head(resp) == exact and sum(a != b for a, b in zip(resp.content, data[100:200])) == 1
    hub.inject("shift_span", path=path, offset=4)
    resp = fetch()
    assert head(resp) == exact and resp.content == data[104:204]
    hub.inject("truncate", path=path)
    resp = fetch()
    assert head(resp) == (206, f"bytes 100-199/{n}", "50") and resp.content == data[100:150]
    hub.inject("ignore_range", path=path)
    resp = fetch()
    assert resp.status_code == 200 and "Content-Range" not in resp.headers and resp.content == data
    resp = fetch()
    assert head(resp) == exact and resp.content == data[100:200]
    assert hub.faults == []


def test_faults_target_paths_count_down_and_reach_whole_file_downloads(hub: HubServer, seeded: str, tmp_path) -> None:
    hub.inject("flip_byte", times=2, path="ckpt/weights*")
    assert get(hub, REG_PATH, "bytes=0-9").content == CONTENT[REG_PATH][:10]
    assert get_session().head(url(hub, LFS_PATH)).status_code == 200  # HEADs (both origins) carry no bytes
    assert [f.times for f in hub.faults] == [2]
    assert get(hub, LFS_PATH, "bytes=0-9").content != CONTENT[LFS_PATH][:10]
    local = hf_hub_download(REPO, LFS_PATH, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "a")
    corrupted = Path(local).read_bytes()  # the client checks the size only, never the sha256
    assert len(corrupted) == len(CONTENT[LFS_PATH]) and corrupted != CONTENT[LFS_PATH]
    assert hub.faults == []
    hub.inject("truncate", path=LFS_PATH)
    with pytest.raises(OSError, match="Consistency check failed"):
        hf_hub_download(REPO, LFS_PATH, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path / "b")
    hub.inject("hang", path="other/*")
    hub.inject("status_503")
    hub.reset_faults()
    assert hub.faults == [] and get(hub, REG_PATH).status_code == 200


def test_status_429_is_retried_by_hf_hub_download(hub: HubServer, seeded: str, tmp_path) -> None:
    hub.inject("status_429", times=2, path=LFS_PATH)
    hub.requests.clear()
    local = hf_hub_download(REPO, LFS_PATH, endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)
    assert Path(local).read_bytes() == CONTENT[LFS_PATH]
    assert [r.status for r in hub.requests] == [429, 429, 302, 200]


def test_status_503_reaches_api_calls_only_when_asked(hub: HubServer, api: HfApi, seeded: str) -> None:
    hub.inject("status_503")
    assert len(list(api.list_repo_tree(REPO, recursive=True))) == 3
    assert get(hub, REG_PATH).status_code == 503
    hub.inject("status_503", api=True)
    with pytest.raises(HfHubHTTPError) as err:
        list(api.list_repo_tree(REPO))
    assert err.value.response.status_code == 503
    assert len(list(api.list_repo_tree(REPO, recursive=True))) == 3


def test_hang_times_the_client_out_and_stop_releases_it(hub: HubServer, seeded: str) -> None:
    hub.inject("hang", path=REG_PATH, seconds=60)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        get(hub, REG_PATH, timeout=0.5)
    assert time.monotonic() - started < 3
    started = time.monotonic()
    hub.stop()
    assert time.monotonic() - started < 3
    assert not [t for t in threading.enumerate() if t.name.startswith("hub-server")]


def test_env_var_mode_in_a_subprocess(hub: HubServer, seeded: str, tmp_path) -> None:
    script = (
        "import hashlib, sys\nfrom huggingface_hub import hf_hub_download\n"
        "path = hf_hub_download(sys.argv[1], sys.argv[2])\n"
        "print(hashlib.sha256(open(path, 'rb').read()).hexdigest())\n"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_TOKEN": TOKEN,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", script, REPO, LFS_PATH], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == sha256(CONTENT[LFS_PATH])

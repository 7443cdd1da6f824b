"""The Hub client's and the transport's errors -> the store's error types (see runtime.store.hub):
401/403 -> StoreAuthError; 429, 5xx, timeouts, connection errors -> TransientStoreError;
404 -> FileNotFoundError; anything else -> StoreError."""

from __future__ import annotations

import httpx
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from runtime.store.base import StoreAuthError, StoreError, TransientStoreError


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

"""Retry only what a retry can fix: TransientStoreError, with exponential
backoff and jitter, within a bounded number of attempts and seconds."""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from runtime.store.base import TransientStoreError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    """Tries in all, the first included."""
    base_s: float = 0.5
    """First backoff; doubles each time, with +-50 % jitter."""
    max_backoff_s: float = 20.0
    deadline_s: float = 120.0
    """No new attempt starts later than this after the first."""


def with_retry(fn: Callable[[], T], *, policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep) -> T:
    began = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except TransientStoreError as err:
            backoff = min(policy.max_backoff_s, policy.base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            out_of_time = time.monotonic() - began + backoff > policy.deadline_s
            if attempt == policy.attempts or out_of_time:
                raise TransientStoreError(
                    f"{err} (gave up after {attempt} attempts, {time.monotonic() - began:.1f} s)"
                ) from err
            print(
                f"store: {err}; retry {attempt}/{policy.attempts - 1} in {backoff:.1f} s", file=sys.stderr, flush=True
            )
            sleep(backoff)
    raise AssertionError("unreachable")

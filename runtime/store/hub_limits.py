"""The Hub's limits on one repo, as the Hub store keeps them (launcher.yaml `hub:`).

The Hub refuses a file above 50 GB (and advises under 20 GB), advises at most 100
files per commit and answers more than 128 commits per hour to one repo with 429
(its docs: "Repositories: recommendations and limits"). The store splits larger
files (`runtime.store.hub_parts`), batches commits, and counts its own commits in
a rolling hour: a push that would go over is refused before its first commit
(`CommitBudgetExceeded`), so the store keeps what it had, the newest verified
checkpoint among it. The count is this process's: a leg restarted inside the hour
starts at zero (the Hub's own 429 is then retried, then a transient error).

Legs get the values in LAUNCHER_HUB_* (runtime.contract); a value there that is not
a whole number inside the Hub's limits is ignored for the default, with one line
on stderr (the launcher only ever writes checked ones).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping

from runtime import contract
from runtime.store.base import StoreError

GB = 10**9
HUB_MAX_FILE_BYTES = 50 * GB
"""The Hub refuses a larger file."""
DEFAULT_MAX_FILE_BYTES = 19 * GB
"""Under the Hub's 20 GB advice per file."""
HUB_FILES_PER_COMMIT = 100
HUB_COMMITS_PER_HOUR = 128
MIN_FILES_PER_COMMIT = 2
"""The last commit holds the manifest and at least one file (or the parts index)."""
MIN_COMMITS_PER_HOUR = 3
"""One checkpoint's cycle: its push, its verified mark, one prune delete."""
CYCLE_EXTRA_COMMITS = 2
"""What a push reserves past its own commits: the verified mark and one prune delete."""
WINDOW_S = 3600.0


class CommitBudgetExceeded(StoreError):
    """A commit would go over `commits_per_hour`: refused before it was made."""


@dataclass(frozen=True)
class HubLimits:
    """What the Hub store holds itself to."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    files_per_commit: int = HUB_FILES_PER_COMMIT
    commits_per_hour: int = HUB_COMMITS_PER_HOUR


BOUNDS = {  # env name -> (field, lowest, highest)
    contract.HUB_MAX_FILE_BYTES: ("max_file_bytes", 1, HUB_MAX_FILE_BYTES),
    contract.HUB_FILES_PER_COMMIT: ("files_per_commit", MIN_FILES_PER_COMMIT, HUB_FILES_PER_COMMIT),
    contract.HUB_COMMITS_PER_HOUR: ("commits_per_hour", MIN_COMMITS_PER_HOUR, HUB_COMMITS_PER_HOUR),
}


def limits_from_env(env: Mapping[str, str] | None = None) -> HubLimits:
    """The limits the launcher passed the leg; the Hub's defaults where unset or bad."""
    env = os.environ if env is None else env
    values = {}
    for name, (field, low, high) in BOUNDS.items():
        text = env.get(name)
        if text is None:
            continue
        if len(text) <= 20 and text.strip().isdigit() and low <= int(text) <= high:
            values[field] = int(text)
        else:
            default = getattr(HubLimits, field)
            print(
                f"store: {name}={text[:40]!r} is not a whole number from {low} to {high}: using {default}",
                file=sys.stderr,
                flush=True,
            )
    return HubLimits(**values)


class CommitBudget:
    """Commits made to the repo in the last hour (monotonic clock), at most `per_hour`."""

    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour = per_hour
        self.clock = clock
        self.made: deque[float] = deque()

    def left(self) -> int:
        now = self.clock()
        while self.made and now - self.made[0] >= WINDOW_S:
            self.made.popleft()
        return self.per_hour - len(self.made)

    def check(self, need: int, what: str) -> None:
        """Refuse `what` unless `need` more commits fit in the rolling hour."""
        left = self.left()
        if need > left:
            frees = WINDOW_S - (self.clock() - self.made[0]) if self.made else 0.0
            raise CommitBudgetExceeded(
                f"{what} needs {need} commit(s), but only {max(0, left)} of hub.commits_per_hour={self.per_hour} "
                f"are left in this hour (the Hub allows {HUB_COMMITS_PER_HOUR} per repo; the next frees in "
                f"{frees:.0f} s): refused before its first commit, the store keeps what it had"
            )

    def spend(self) -> None:
        """One commit request made (a retry counts again: the Hub may have made the first)."""
        self.made.append(self.clock())

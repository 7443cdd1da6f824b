"""launcher.yaml `hub:`: the Hugging Face Hub's limits an hf:// store keeps to (a section of
`launcher.config.schema.Config`; legs get them in LAUNCHER_HUB_*, read by runtime.store.hub_limits)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import BadInput, ConfigError
from runtime import contract
from runtime.store.hub_limits import (
    GB,
    HUB_COMMITS_PER_HOUR,
    HUB_FILES_PER_COMMIT,
    HUB_MAX_FILE_BYTES,
    MIN_COMMITS_PER_HOUR,
    MIN_FILES_PER_COMMIT,
)

HUB_MAX_FILE_GB = HUB_MAX_FILE_BYTES // GB


@dataclass(frozen=True)
class HubConfig:
    """The Hub's limits on one repo (its docs: "Repositories: recommendations and limits"),
    for an hf:// store; a value past the Hub's own is refused on load."""

    max_file_gb: float = 19.0
    """A file above this many GB (10^9 bytes) is stored on the Hub in parts of this size and
    read back whole (the Hub refuses a file above 50 GB and advises under 20)."""

    files_per_commit: int = 100
    """The most files (a part counts as one) one commit holds: a checkpoint of more goes in
    several, its manifest in the last (the Hub advises at most 100)."""

    commits_per_hour: int = 128
    """The most commits a leg makes to the repo in a rolling hour (the Hub allows 128): a push
    that would go over (its commits, its verified mark, a prune's delete) is refused before its
    first commit and reported as `push_failed`; the store keeps its newest verified checkpoint."""

    def __post_init__(self) -> None:
        gb = self.max_file_gb
        if gb > HUB_MAX_FILE_GB:
            raise ConfigError("hub.max_file_gb", f"{gb:g} is above the Hub's {HUB_MAX_FILE_GB} GB limit per file")
        if not gb * GB >= 1:
            raise ConfigError(
                "hub.max_file_gb",
                f"{gb:g} is not above 0 (files above it go in parts; the Hub "
                f"takes up to {HUB_MAX_FILE_GB} GB per file)",
            )
        per = self.files_per_commit
        if per > HUB_FILES_PER_COMMIT:
            raise ConfigError(
                "hub.files_per_commit", f"{per} is above the Hub's {HUB_FILES_PER_COMMIT} files per commit"
            )
        if per < MIN_FILES_PER_COMMIT:
            raise ConfigError(
                "hub.files_per_commit",
                f"{per} is below {MIN_FILES_PER_COMMIT}: the last commit holds the manifest and at least one file",
            )
        rate = self.commits_per_hour
        if rate > HUB_COMMITS_PER_HOUR:
            raise ConfigError(
                "hub.commits_per_hour", f"{rate} is above the Hub's {HUB_COMMITS_PER_HOUR} commits per hour to one repo"
            )
        if rate < MIN_COMMITS_PER_HOUR:
            raise ConfigError(
                "hub.commits_per_hour",
                f"{rate} is below {MIN_COMMITS_PER_HOUR}, the commits of one "
                "checkpoint (its push, its verified mark, a prune's delete)",
            )

    def env(self) -> dict[str, str]:
        """The LAUNCHER_HUB_* a leg with an hf:// store gets."""
        return {
            contract.HUB_MAX_FILE_BYTES: str(int(self.max_file_gb * GB)),
            contract.HUB_FILES_PER_COMMIT: str(self.files_per_commit),
            contract.HUB_COMMITS_PER_HOUR: str(self.commits_per_hour),
        }


STORE_TIMEOUT_S = 20.0
"""How long the store guard waits for a Hub store's one listing."""


def store_answers(uri: str) -> str:
    """The store guard: a Hub store lists its checkpoints once, with the token the legs will get
    (a repo that is not there yet is fine: the first push creates it); a refused token or no
    answer is refused here rather than on a leg's first push, billed. The launcher reads the
    store after every leg, so this host must reach it too. A file:// store: the config's check."""
    if not uri.startswith("hf://"):
        return uri
    from runtime.store import StoreAuthError, StoreError
    from runtime.store.hub import HubStore
    from runtime.store.retry import RetryPolicy

    store = HubStore(uri, "runs", timeout_s=STORE_TIMEOUT_S, retry=RetryPolicy(attempts=1), key=None)
    try:
        store.scan()
    except StoreAuthError as err:
        raise BadInput(
            f"store {uri} refuses this token: {err}",
            hint="set HF_TOKEN to a token that can write the repo (legs get it through `secrets:`)",
        ) from None
    except (StoreError, OSError) as err:
        raise BadInput(
            f"store {uri} does not answer: {err}",
            hint=f"check HF_ENDPOINT ({store.endpoint}) and the network, or use a file:// store",
        ) from None
    return uri

"""Which checkpoint a leg resumes from: the newest verified one that fetches,
checks and loads. A store is untrusted input, so a checkpoint that fails any of
that (a manifest that does not parse, bytes that do not match, a mark that does
not bind, a state that is not plain tensors) is skipped with a `resume_skip`
event naming why, and the next older verified one is tried: the same rule the
drill expects after a kill. Auth and transient errors are not damage: they
propagate, so they never read as "nothing here".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import events
from runtime.store.base import CheckpointDamaged, CheckpointInfo, Store


@dataclass
class Restored:
    """The checkpoint chosen, its state (loaded on `map_location`), and what was skipped."""

    info: CheckpointInfo | None
    state: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)
    """Names found damaged: a later push of the same step may replace them."""


def restore_newest(
    store: Store, restore_dir: Path, map_location: str = "cpu", keep_files: bool = False, check: Any = None
) -> Restored:
    """Fetch, check and load the newest usable verified checkpoint (None: start fresh).
    `check(folder, seal)`, when given, replaces the load (a checkpoint in another
    framework's format): it raises CheckpointDamaged, and returns the state or None."""
    from runtime.checkpoint.disk import load_local

    scan = store.scan()
    verified = [c for c in scan.checkpoints if c.verified]
    newest_ok = verified[-1].step if verified else -1
    skipped = []
    for bad in scan.damaged:
        if bad.step >= newest_ok:
            events.emit("resume_skip", name=bad.name, step=bad.step, reason=bad.reason)
            skipped.append(bad.name)
    for info in reversed(verified):
        folder = restore_dir / info.name
        try:
            shutil.rmtree(folder, ignore_errors=True)
            store.fetch(info.name, restore_dir)
            if check is not None:
                state = check(folder, info.seal)
            else:
                state, _ = load_local(folder, map_location=map_location, seal=info.seal, fetched=True)
        except (CheckpointDamaged, FileNotFoundError) as err:
            events.emit("resume_skip", name=info.name, step=info.step, reason=f"{type(err).__name__}: {err}")
            skipped.append(info.name)
            shutil.rmtree(folder, ignore_errors=True)
            continue
        if not keep_files:
            shutil.rmtree(folder, ignore_errors=True)
        return Restored(info, state, skipped)
    return Restored(None, skipped=skipped)


def load_tracked(
    tracked: dict[str, Any], state: dict[str, Any], name: str, extra: dict[str, Any], digests: bool
) -> dict[str, Any]:
    """Load each tracked object from checkpoint `name`'s state, and `extra` (its defaults
    updated with the saved values); the resume event's facts: each object's own
    (`resume_facts`) and, where `digests`, the digest of each object as loaded (restoration
    proved, not assumed: the launcher compares them with the digests saved at that step)."""
    from runtime.session.rules import ResumeRefused
    from runtime.session.step_evidence import state_digest

    facts: dict[str, Any] = {}
    loaded: dict[str, str] = {}
    for key, obj in tracked.items():
        if key not in state:
            raise ResumeRefused("state_mismatch", f"{name} holds no {key!r} (it holds {sorted(state)})")
        obj.load_state_dict(state[key])
        facts.update(getattr(obj, "resume_facts", dict)())
        if digests:
            loaded[key] = state_digest(as_loaded(obj))
    extra.update(state.get("extra", {}))
    if digests:
        facts["digests"] = {**loaded, "extra": state_digest({k: extra[k] for k in state.get("extra", {})})}
    return facts


def as_loaded(obj: Any) -> Any:
    """The state an object holds once loaded. torchdata's StatefulDataLoader keeps a loaded state
    (`next_iter_state`) until its next iter(), and its state_dict() before that describes its
    dataset as it is, fresh: an HF stream loaded at example 1000 said 0, and the restore check
    read a loader that resumed exactly as "changed by the restore"."""
    pending = getattr(obj, "next_iter_state", None)
    return pending if isinstance(pending, dict) else obj.state_dict()

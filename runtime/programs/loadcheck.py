"""Is a stored checkpoint loadable? Fetch it whole, check every file against its
manifest, deserialize the state, and print one JSON line.

    python -m runtime.programs.loadcheck STORE_URI PREFIX NAME

`launcher stop` runs this (in an interpreter that has torch; the launcher
itself never imports it) on the final checkpoint before it calls a stop clean.
It runs on the host, so it loads exactly as a leg does: no symlink followed,
no byte past the manifest's sizes, `torch.load(weights_only=True)`.
Exit 0 loadable, 1 not.

    python -m runtime.programs.loadcheck --serve STORE_URI PREFIX

reads one request a line on stdin (`{"name": NAME, "kinds": {tracked name: kind}}`) and
answers each with the same JSON line plus the state's digests: `digests`, per object as
the session's `state_digest` event computes them, and `trains_from`, the weights and
moments a leg resumed from it must train from (runtime.session.step_evidence). The drill runs one per
drill, in the trainer's interpreter, so torch is imported once, not once per kill.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.checkpoint.disk import load_local
from runtime.store import open_store
from runtime.store.base import Store


def _lightning(folder: Path, step: int) -> dict[str, Any]:
    """A Lightning checkpoint is one torch.save file: it must load with weights_only=True (as
    `trainer.fit(ckpt_path=...)` loads it) and say the step the store's name says (the adapter's
    `micro_step`: batches, where Lightning's global_step counts optimizer steps)."""
    import torch

    files = sorted(folder.glob("*.ckpt"))
    if len(files) != 1:
        return {"ok": False, "error": f"expected one .ckpt file, found {len(files)}"}
    ckpt = torch.load(files[0], map_location="cpu", weights_only=True)
    got, own = (ckpt.get("global_step"), ckpt.get("callbacks") or {}) if isinstance(ckpt, dict) else (None, {})
    micro = [v["micro_step"] for v in own.values() if isinstance(v, dict) and "micro_step" in v]
    got = micro[0] if micro and got is not None else got  # the adapter's step: batches (global_step: optimizer steps)
    if got != step:
        return {"ok": False, "error": f"the checkpoint says global_step {got!r}, its name step {step}"}
    return {"keys": sorted(ckpt)}


def _accelerate(folder: Path, step: int) -> dict[str, Any]:
    """`Accelerator.load_state` swallows a missing RNG file (it logs "Could not load random
    states" and goes on): a checkpoint without one is not loadable as saved."""
    if not any(folder.glob("random_states_*.pkl")):
        return {"ok": False, "error": "no random_states_*.pkl: Accelerator.load_state would go on without the RNG"}
    return {}


# format -> what else is checked beyond every file's bytes (the framework loads the rest itself).
FRAMEWORK_FORMATS = {"transformers": lambda folder, step: {}, "accelerate": _accelerate, "lightning": _lightning}


def check(uri: str, prefix: str, name: str) -> dict[str, Any]:
    return read(open_store(uri, prefix), name)[0]


def read(store: Store, name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the answer, the state loaded: None where there is none to digest)."""
    began = time.perf_counter()
    listed = {c.name: c for c in store.list()}
    info = listed.get(name)
    if info is None:
        return {"ok": False, "name": name, "error": "not in the store"}, None
    fmt = info.manifest.meta.get("format") if isinstance(info.manifest.meta, dict) else None
    with tempfile.TemporaryDirectory(prefix="loadcheck-") as tmp:
        try:
            folder = store.fetch(name, Path(tmp))
            if fmt in FRAMEWORK_FORMATS:  # a framework's own files: every one checked, loaded by the framework
                from runtime.store.seal import check_windows

                if info.seal is not None:
                    check_windows(folder, info.seal)
                out = {
                    "ok": True,
                    "name": name,
                    "step": info.step,
                    "verified": info.verified,
                    "files": len(info.manifest.files),
                    "bytes": info.manifest.total_bytes,
                    "format": fmt,
                }
                out.update(FRAMEWORK_FORMATS[fmt](folder, info.step))
                return {**out, "seconds": round(time.perf_counter() - began, 3)}, None
            if fmt == "dcp":  # every rank's shards, whole, in this one process (runtime.checkpoint.dcp)
                state, manifest = _load_sharded(folder, info), info.manifest
            else:
                state, manifest = load_local(folder, seal=info.seal, fetched=True)
        except Exception as err:  # noqa: BLE001 - the answer is "not loadable", with the reason
            return {"ok": False, "name": name, "verified": info.verified, "error": f"{type(err).__name__}: {err}"}, None
    # The session's own keys; everything else is whatever the trainer tracked (model, optimizer, ...).
    missing = [k for k in ("step", "rng") if k not in state]
    step_ok = state.get("step") == info.step
    error = (
        f"the state holds no {', '.join(missing)} (keys: {sorted(state)})"
        if missing
        else None
        if step_ok
        else f"the state says step {state.get('step')!r}, the checkpoint's name step {info.step}"
    )
    out = {
        "ok": not missing and step_ok,
        "name": name,
        "step": state.get("step"),
        "verified": info.verified,
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "keys": sorted(state),
        "missing_keys": missing,
        "seconds": round(time.perf_counter() - began, 3),
    }
    if error:
        out["error"] = error
    return out, state


def _load_sharded(folder: Path, info: Any) -> dict[str, Any]:
    """A sharded checkpoint as one state: the DCP-saved objects whole and flattened (as the session
    digests them), rank 0's own state, and every rank's RNG streams."""
    from runtime.checkpoint.dcp import full_flat, load_whole
    from runtime.store.seal import check_windows

    if info.seal is not None:
        check_windows(folder, info.seal)
    whole = load_whole(folder, {f.path for f in info.manifest.files}, int(info.manifest.meta.get("world_size") or 0))
    if not whole["ranks"]:
        raise ValueError("the manifest names no world_size")
    own = {k: v for k, v in whole["ranks"][0].items() if k != "rng"}
    return {**{k: full_flat(v) for k, v in whole["dcp"].items()}, **own, "rng": [r.get("rng") for r in whole["ranks"]]}


def serve(uri: str, prefix: str, requests: Any, answer: Any) -> None:
    """One answer line per request line (module docstring), until stdin closes."""
    from runtime.session.step_evidence import state_digests, trained_state_digests

    store = open_store(uri, prefix)
    for line in requests:
        try:
            request = json.loads(line)
            name, kinds = str(request["name"]), dict(request.get("kinds") or {})
        except (ValueError, KeyError, TypeError) as err:
            out: dict[str, Any] = {"ok": False, "error": f"bad request: {type(err).__name__}: {err}"}
        else:
            try:
                out, state = read(store, name)
            except Exception as err:  # noqa: BLE001 - a store error is this checkpoint's answer, not the server's end
                out, state = {"ok": False, "name": name, "error": f"{type(err).__name__}: {err}"}, None
            if state is not None:
                out["digests"] = state_digests(state, sorted(state))
                out["trains_from"] = trained_state_digests(state, kinds)
        answer.write(json.dumps(out) + "\n")
        answer.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "--serve":
        serve(args[1], args[2], sys.stdin, sys.stdout)
        return 0
    if len(args) != 3:
        print(
            "usage: python -m runtime.programs.loadcheck STORE_URI PREFIX NAME | --serve STORE_URI PREFIX",
            file=sys.stderr,
        )
        return 2
    result = check(*args)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

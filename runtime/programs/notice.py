"""The spot notice watcher every sky leg runs beside its trainer (issue 33).

SkyPilot 0.14.1 tells a job nothing when its spot VM is reclaimed (docs/notes-preemption.md,
section 2): the provider announces it on the VM's metadata service, and the VM is gone 30 s
(GCP, Azure) or 2 min (AWS) later. This process polls the metadata service of the cloud that
SKYPILOT_CLUSTER_INFO names, every `--every` seconds (5: what AWS advises), and on a notice:

1. prints a `notice` event (its `t` is when the leg learnt of it: the report times from it),
2. creates the file `--mark` (the `run:` script then exits with contract.EXIT_PREEMPTED, which the
   managed job's `recover_on_exit_codes` names, so SkyPilot recovers a leg that stopped on a
   notice instead of marking the job done, and does not count it against max_restarts_on_errors),
3. sends SIGTERM to its process group, as SkyPilot's graceful cancel does (`timeout` and torchrun
   in it hand it on; this process ignores it), so the trainer's own stop (a final checkpoint,
   pushed and verified) races the kill.

It ends when the leg does (`--parent` is gone) and never signals twice. Dialects:

- AWS (IMDSv2): PUT /latest/api/token, then GET /latest/meta-data/spot/instance-action with the
  token: 404 until a notice, then {"action": "terminate"|"stop", "time": ...}.
- GCP: GET /computeMetadata/v1/instance/preempted (Metadata-Flavor: Google): FALSE, then TRUE.
- Azure: GET /metadata/scheduledevents?api-version=2020-07-01 (Metadata: true): an event whose
  EventType is Preempt.

Anything else (Kubernetes, where SkyPilot's agent takes the pod's SIGTERM; no SKYPILOT_CLUSTER_INFO
on the local and docker backends): nothing to poll; it says so once and ends. It speaks in `log`
events (runtime.events.log): that one is a warning on a cloud whose spot legs then go without a
notice, info otherwise. PREFLIGHT_METADATA_URL replaces the provider's address (tests: a loopback
server answering in that provider's dialect).

    python -m runtime.programs.notice --mark FILE --parent PID [--every 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Callable

from runtime.events import INFO, WARNING, emit, log

ADDRESS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal", "azure": "http://169.254.169.254"}
TIMEOUT_S = 2.0


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310 (a fixed metadata address)
            return resp.status, resp.read(1 << 16)
    except urllib.error.HTTPError as err:
        return err.code, b""


def aws(base: str) -> str | None:
    status, token = _get(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT")
    if status != 200:
        return None
    status, body = _get(
        f"{base}/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": token.decode(errors="replace")}
    )
    if status != 200:
        return None
    action = json.loads(body or b"{}")
    return f"spot/instance-action {action.get('action')} at {action.get('time')}"


def gcp(base: str) -> str | None:
    status, body = _get(f"{base}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
    return "instance/preempted TRUE" if status == 200 and body.strip() == b"TRUE" else None


def azure(base: str) -> str | None:
    status, body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
    if status != 200:
        return None
    for event in json.loads(body or b"{}").get("Events", []):
        if event.get("EventType") == "Preempt":
            return f"scheduled event Preempt, not before {event.get('NotBefore')}"
    return None


DIALECTS: dict[str, Callable[[str], str | None]] = {"aws": aws, "gcp": gcp, "azure": azure}


def cloud_of(env: dict[str, str]) -> str | None:
    """The cloud SkyPilot launched this node on, lower-case (None: not on a cloud it names)."""
    try:
        return str(json.loads(env.get("SKYPILOT_CLUSTER_INFO") or "{}").get("cloud") or "").lower() or None
    except (ValueError, AttributeError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def node_rank() -> int:
    """The node the watcher runs on: it runs beside torchrun, so no rank variable tells it."""
    node = os.environ.get("SKYPILOT_NODE_RANK", "0")
    return int(node) if node.isdigit() else 0


def say(level: str, message: str) -> None:
    """The watcher's own line about itself, as a `log` event (runtime.events.log)."""
    log(level, message, source="notice watcher", node=node_rank())


def watch(cloud: str, base: str, mark: str, parent: int, every: float) -> int:
    """Poll until a notice (signal the group once) or until the leg ends."""
    poll = DIALECTS[cloud]
    errors = 0
    while alive(parent):
        try:
            said = poll(base)
        except (OSError, ValueError) as err:  # unreachable, a timeout, a reply that is not JSON
            said = None
            errors += 1
            if errors == 1:
                say(WARNING, f"{cloud} metadata at {base} did not answer ({err}); polling on")
        if said:
            emit("notice", cloud=cloud, detail=said, node=node_rank())
            with open(mark, "w") as f:
                f.write(said + "\n")
            os.killpg(os.getpgrp(), signal.SIGTERM)
            return 0
        time.sleep(every)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The spot notice watcher of a sky leg.")
    parser.add_argument("--mark", required=True, help="file created on a notice")
    parser.add_argument("--parent", type=int, required=True, help="the leg's process: the watch ends with it")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between polls")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its own group's SIGTERM is the one it sends
    cloud = cloud_of(dict(os.environ))
    if cloud not in DIALECTS:
        # Nothing is missed off a cloud (the local and docker backends' nodes) or on Kubernetes
        # (SkyPilot's agent hands the pod its SIGTERM): info. On another cloud a spot leg goes
        # without its notice: a warning.
        where = f"on {cloud}" if cloud else "without SKYPILOT_CLUSTER_INFO"
        level = INFO if cloud in (None, "kubernetes") else WARNING
        say(level, f"no metadata notice to watch {where}; the leg gets none")
        return 0
    base = os.environ.get("PREFLIGHT_METADATA_URL") or ADDRESS[cloud]
    return watch(cloud, base.rstrip("/"), args.mark, args.parent, args.every)


if __name__ == "__main__":
    sys.exit(main())

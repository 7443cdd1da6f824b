#!/usr/bin/env bash
# What SkyPilot's API server host needs that pip does not bring: rsync (it syncs
# workdirs and runtime files). Used by `make test`, whose real-SkyPilot tier starts
# SkyPilot's own API server offline (tests/fakes/sky_server.py).
set -euo pipefail
command -v rsync >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "rsync is missing and this is not root: install it (SkyPilot's API server needs it)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null

#!/usr/bin/env bash
# Make a Docker engine answer on this machine: install Debian's docker.io,
# debootstrap and docker-registry (a loopback registry for `image push` tests) if
# missing (needs root), start dockerd if it is not running, wait.
# Used by `make test` so the docker-backend tests run for real on a fresh machine.
set -euo pipefail
missing=0
for tool in dockerd debootstrap docker-registry; do
  command -v "$tool" >/dev/null 2>&1 || missing=1
done
if [ "$missing" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "docker.io, debootstrap or docker-registry is missing and this is not root: install them, or set PREFLIGHT_SKIP_DOCKER=1" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap docker-registry >/dev/null
fi
if docker info >/dev/null 2>&1; then
  exit 0
fi
log=${DOCKERD_LOG:-/tmp/preflight-dockerd.log}
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "dockerd started (log: $log)"
    exit 0
  fi
  sleep 1
done
echo "dockerd did not start within 60 s; its log ($log) ends with:" >&2
tail -n 20 "$log" >&2
exit 1

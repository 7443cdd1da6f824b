#!/usr/bin/env bash
# Build a local Debian bookworm base image (python3 + venv) with debootstrap and
# `docker import`, for machines that cannot pull from a registry. Its Python is
# 3.11, like the default digest-pinned base. Idempotent: an existing tag is kept.
set -euo pipefail
tag=${1:-preflight-base:bookworm}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag exists"
  exit 0
fi
# The machine's own Debian mirror, as apt is configured here.
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
echo "base image $tag built in $(( $(date +%s) - start )) s"

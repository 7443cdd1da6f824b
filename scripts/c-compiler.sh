#!/usr/bin/env bash
# The tests build a stand-in NVML library (tests/fakes/nvml/fake_nvml.c: a host "with GPUs" for
# the gpus guard) with the system's C compiler: install Debian's gcc if there is none (needs root).
set -euo pipefail
if command -v cc >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "no C compiler and this is not root: install gcc (the tests build tests/fakes/nvml/fake_nvml.c)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null

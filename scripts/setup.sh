#!/usr/bin/env bash
# scripts/setup.sh: install the Debian packages agentrl needs (only those missing), then
# configure and build into build/ (or $ARL_BUILD_DIR).  Run as root on a fresh Debian machine
# (or as a user with sudo, or with everything already installed).
#
#   bash scripts/setup.sh            # packages for building and running
#   ARL_SETUP_TESTS=1 bash scripts/setup.sh   # also the packages the test suite uses
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libsqlite3-dev sqlite3 libcurl4-openssl-dev libjansson-dev
      libopenblas-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin python3)
if [ "${ARL_SETUP_TESTS:-0}" = 1 ]; then
  # clang builds the libFuzzer targets; python3-numpy for interop tests (torch is NOT needed:
  # golden vectors are committed).
  pkgs+=(clang libclang-rt-14-dev python3-numpy)
fi
if [ -n "${ARL_EXTRA_PACKAGES:-}" ]; then
  # shellcheck disable=SC2206
  pkgs+=(${ARL_EXTRA_PACKAGES})
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing missing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
      echo "setup: error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; fi
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all required Debian packages are installed"
fi

build="${ARL_BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${ARL_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
echo "setup: built $build/agentrl"

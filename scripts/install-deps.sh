#!/usr/bin/env bash
# Installs, with apt-get, exactly the Debian 12 packages gradwire needs that are missing.
# Idempotent, and silent when everything is already present.
#   scripts/install-deps.sh            build and test dependencies
#   scripts/install-deps.sh --bench    also PyTorch 1.13 (python3-torch), the benchmark peer, and
#                                      matplotlib for scripts/plot-bench.py
#   scripts/install-deps.sh --torch    also LibTorch 1.13 (libtorch-dev), for the LibTorch
#                                      bridge torch_bridge/ and its tests and examples
#   scripts/install-deps.sh --checks   also clang and its runtimes, for the -Wthread-safety
#                                      build and the fuzzers (libFuzzer, ASan)
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config make
  libgtest-dev libgmock-dev
  libopenblas-dev libdlpack-dev zlib1g-dev
  libtensorpipe-dev libgloo-dev libuv1-dev libprotobuf-dev protobuf-compiler
  libssl-dev nlohmann-json3-dev
  iproute2
)
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(python3 python3-torch python3-matplotlib) ;;
    --torch) packages+=(libtorch-dev) ;;
    --checks) packages+=(clang libclang-rt-14-dev) ;;
    *) echo "usage: scripts/install-deps.sh [--bench] [--torch] [--checks]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "gradwire: installing ${missing[*]}" >&2
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "gradwire: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Package lists may be absent on a fresh machine, or stale: refresh once if needed.
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

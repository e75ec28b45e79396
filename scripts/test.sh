#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then runs CTest (all labels).
#   scripts/test.sh              the full suite
#   scripts/test.sh -L tensor    extra arguments go to ctest (one module, -R regex, ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "${GRADWIRE_JOBS:-$(nproc)}" "$@"

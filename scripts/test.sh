#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then runs CTest (all labels).
#   scripts/test.sh              the full suite
#   scripts/test.sh -L tensor    extra arguments go to ctest (one module, -R regex, ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
# The tests cover the LibTorch bridge too: LibTorch (libtorch-dev) is installed here, and only
# here (the main job, scripts/run-main.sh, does without it). GRADWIRE_WITH_TORCH=OFF skips
# it (and installs nothing for it); the bridge's absence is then what build.TorchBridgeOptional
# and the rest of the suite see.
with_torch=${GRADWIRE_WITH_TORCH:-AUTO}
deps=${GRADWIRE_DEPS:-}
[[ $with_torch == OFF ]] || deps="$deps --torch"
GRADWIRE_DEPS="$deps" "$root/scripts/build.sh" -DGRADWIRE_WITH_TORCH="$with_torch"
cd "$build"
ctest --output-on-failure -j "${GRADWIRE_JOBS:-$(nproc)}" "$@"

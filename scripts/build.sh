#!/usr/bin/env bash
# Configures and builds gradwire into build/ (or $GRADWIRE_BUILD_DIR) with Ninja.
# Extra arguments go to cmake's configure step, e.g. -DGRADWIRE_SANITIZE="address;undefined".
# GRADWIRE_BUILD_TARGETS="a b" builds only targets a and b (and what they need).
# GRADWIRE_DEPS="--torch ..." passes those options to scripts/install-deps.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
jobs=${GRADWIRE_JOBS:-$(nproc)}
# shellcheck disable=SC2086
"$root/scripts/install-deps.sh" ${GRADWIRE_DEPS:-}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${GRADWIRE_BUILD_TYPE:-RelWithDebInfo} \
  "$@" >/dev/null
# GRADWIRE_BUILD_TARGETS (space-separated) builds only those targets and what they need.
targets=()
for t in ${GRADWIRE_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"

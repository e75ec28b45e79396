#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the most complete demo there
# is (examples/quickstart until the parameter-server example exists).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
"$build/examples/quickstart/gradwire-quickstart" "$@"

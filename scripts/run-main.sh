#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the most complete demo there is
# (examples/train_mlp, until the parameter-server example exists): an MLP trained
# data-parallel over threads with concurrent backward passes, checked, saved and reloaded.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
"$build/examples/train_mlp/gradwire-train-mlp" --save "$build/spiral_model.gw" "$@"

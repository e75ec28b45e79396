#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the most complete demo there is
# (examples/train_mlp, until the parameter-server example exists): an MLP trained
# data-parallel, first over threads with concurrent backward passes, then over two rank
# processes whose gradients are summed by a Gloo all_reduce; each run is checked, saved
# and reloaded, and the processes check that they hold identical parameters.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
bin="$build/examples/train_mlp/gradwire-train-mlp"
"$bin" --save "$build/spiral_model.gw" "$@"
"$bin" --processes 2 --save "$build/spiral_model_processes.gw" "$@"

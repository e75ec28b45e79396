#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the parameter-server example
# (examples/parameter_server/ps_train under gradwire-run: one server holding the model
# behind an RRef, two trainers training it through dist_autograd and a
# DistributedOptimizer shared on the server, each checking its held-out accuracy), the same on
# the click-through task with a sparse table of 10^6 rows, the first again as an elastic job
# whose server is killed and restored from its snapshot, then hybrid_train (an embedding
# table on the server, dense layers replicated under DDP on the trainers, one backward for
# both), then examples/train_mlp: an
# MLP trained data-parallel, over threads and over two rank processes whose gradients a
# Gloo all_reduce sums; each run is checked, saved and reloaded.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
# Only what the main job runs: the launcher and the examples (scripts/test.sh builds the
# tests and benchmarks).
GRADWIRE_BUILD_TARGETS="gradwire-run gradwire-ps-train gradwire-hybrid-train gradwire-train-mlp" \
  "$root/scripts/build.sh"
# Parameter-server training: one server, two trainers, started by the launcher.
"$build/tools/gradwire-run" --nproc-per-node 3 "$build/examples/parameter_server/gradwire-ps-train"
# The parameter server's canonical workload: an embedding table of 10^6 rows on the server,
# trained by sparse gradients (a step costs the rows a batch touched, not the table).
"$build/tools/gradwire-run" --nproc-per-node 3 "$build/examples/parameter_server/gradwire-ps-train" \
  --embedding-rows 1000000 --sparse
# An elastic job that loses its server: the launcher runs a server and two trainers by
# role and hosts their store; the server snapshots its shard every 0.1 s, is killed mid-run,
# restarted alone and restores the newest snapshot, and the trainers go on to their accuracy.
ckpt=$(mktemp -d)
"$build/tools/gradwire-run" --role server:1:critical --role trainer:2 --restart-workers 1 \
  "$build/examples/parameter_server/gradwire-ps-train" --checkpoint "$ckpt" --checkpoint-every 0.1 \
  --kill-server-after 150
rm -rf "$ckpt"
# The hybrid: an embedding on the server, dense layers under DDP on the two trainers.
"$build/tools/gradwire-run" --nproc-per-node 3 "$build/examples/parameter_server/gradwire-hybrid-train"
bin="$build/examples/train_mlp/gradwire-train-mlp"
"$bin" --save "$build/spiral_model.gw" "$@"
"$bin" --processes 2 --save "$build/spiral_model_processes.gw" "$@"

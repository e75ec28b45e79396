#!/usr/bin/env bash
# DistributedDataParallel across two hosts: two workers on each node (static flags), one Gloo
# group of four ranks over env://. Each rank checks that every replica holds the same
# parameters and that they equal single-process training on the whole batch
# (multinode_ddp_worker, ddp_worker.cc).
source "$(dirname "$0")/lib.sh"
mn_begin ddp 2 45
master=$(mn_addr 0)
port=29514
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --nnodes 2 --node-rank $k \
    --master-addr "$master" --master-port $port --nproc-per-node 2 "$DDP_WORKER" --steps 15
  pid[k]=$mn_last_pid
done
mn_expect_status node0 "${pid[0]}" 0
mn_expect_status node1 "${pid[1]}" 0
for k in 0 1; do
  for r in $((2 * k)) $((2 * k + 1)); do
    mn_expect node$k "ddp rank $r of 4: 15 steps; replicas identical on all ranks; equal to single-process training"
  done
done
mn_say "passed"

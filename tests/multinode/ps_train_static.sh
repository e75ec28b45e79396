#!/usr/bin/env bash
# ps_train across two hosts, joined the static way (--nnodes 2 --node-rank K --master-addr
# --master-port): node 0 runs the two parameter servers (ps0, ps1: the model's layers split
# over them), node 1 the two trainers. The nodes pose as separate hosts (different
# GRADWIRE_HOST_ID), so every trainer reaches its servers over TCP at the address their
# agents advertise: the interface that routes to the master, never 127.0.0.1.
source "$(dirname "$0")/lib.sh"
mn_begin ps_train_static 2 45
master=$(mn_addr 0)
port=29511
train=("$PS_TRAIN" --servers 2 --epochs 6 --min-accuracy 0.8)
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --nnodes 2 --node-rank $k \
    --master-addr "$master" --master-port $port --nproc-per-node 2 "${train[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status node1 "${pid[1]}" 0
mn_expect_status node0 "${pid[0]}" 0
# Where each worker ran: the servers on node 0, the trainers on node 1.
mn_expect node0 "ps0 serving shard 1 of 2 to 2 trainers"
mn_expect node0 "ps1 serving shard 2 of 2 to 2 trainers"
mn_expect_not node0 "done: held-out accuracy"
for t in trainer1 trainer2; do
  mn_expect_accuracy node1 $t 0.8
done
mn_say "passed"

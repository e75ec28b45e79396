#!/usr/bin/env bash
# ps_train across two hosts, joined the static way (--nnodes 2 --node-rank K --master-addr
# --master-port), the layout of the issue that found workers advertising 127.0.0.1: node 0
# runs the parameter server alone (--nproc-per-node 1: rank 0, ps0), node 1 the two trainers
# (--nproc-per-node 2: ranks 1 and 2, numbered after node 0's worker). The nodes pose as
# separate hosts (different GRADWIRE_HOST_ID), so the trainers reach the server over TCP at
# the address its agent advertises: the interface that routes to the master.
source "$(dirname "$0")/lib.sh"
mn_begin ps_train_static 2 45
master=$(mn_addr 0)
port=29511
train=("$PS_TRAIN" --epochs 6 --min-accuracy 0.8)
nproc=(1 2)
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --nnodes 2 --node-rank $k \
    --master-addr "$master" --master-port $port --nproc-per-node "${nproc[k]}" "${train[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status node1 "${pid[1]}" 0
mn_expect_status node0 "${pid[0]}" 0
# Where each worker ran: the server on node 0, the trainers on node 1.
mn_expect node0 "[rank0]: ps0 serving shard 1 of 1 to 2 trainers"
mn_expect_not node0 "done: held-out accuracy"
mn_expect node1 "[rank1]: trainer1 done: held-out accuracy"
mn_expect node1 "[rank2]: trainer2 done: held-out accuracy"
for t in trainer1 trainer2; do
  mn_expect_accuracy node1 $t 0.8
done
mn_say "passed"

#!/usr/bin/env bash
# hybrid_train across two hosts: a parameter server (ps0) and three DDP trainers, whose Gloo
# group (formed through the store of env://) spans both nodes: node 0 runs ps0 and trainer1,
# node 1 trainer2 and trainer3. The trainers check at the end that their dense replicas are
# identical, and their held-out accuracy.
source "$(dirname "$0")/lib.sh"
mn_begin hybrid_train 2 45
master=$(mn_addr 0)
port=29513
train=("$HYBRID_TRAIN" --epochs 4 --min-accuracy 0.8)
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --nnodes 2 --node-rank $k \
    --master-addr "$master" --master-port $port --nproc-per-node 2 "${train[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status node0 "${pid[0]}" 0
mn_expect_status node1 "${pid[1]}" 0
mn_expect node0 "ps0 serving the embedding table to 3 trainers"
mn_expect node0 "trainer1 done: held-out accuracy"
mn_expect_accuracy node0 trainer1 0.8
for t in trainer2 trainer3; do
  mn_expect_accuracy node1 $t 0.8
done
for k in 0 1; do
  n=$(mn_count node$k "done: held-out accuracy [0-9.]+; dense replicas identical on 3 trainers")
  want=$((k == 0 ? 1 : 2))
  ((n == want)) || mn_fail "node $k: $n trainers reported identical replicas, expected $want"
done
mn_say "passed"

#!/usr/bin/env bash
# The issue's "must show": gradwire-run --rdzv-endpoint HOST:PORT --nnodes 1:2, run from two
# namespaces (separate hosts: different GRADWIRE_HOST_ID), forms ONE job of both nodes. Node
# ranks are given in arrival order, so which node gets the servers is not fixed; with two
# workers on each, one node holds ps0 and ps1 and the other the two trainers. A node that
# formed a job of its own would fail (ps_train needs a trainer beside its two servers), so
# both launchers exiting 0, with each trainer done once, shows one job.
source "$(dirname "$0")/lib.sh"
mn_begin ps_train_rendezvous 2 45
endpoint=$(mn_addr 0):29512
train=("$PS_TRAIN" --servers 2 --epochs 6 --min-accuracy 0.8)
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --rdzv-endpoint "$endpoint" \
    --rdzv-id ps-rdzv --nnodes 1:2 --rdzv-last-call 10s --nproc-per-node 2 "${train[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status node0 "${pid[0]}" 0
mn_expect_status node1 "${pid[1]}" 0
cat "$(mn_log node0)" "$(mn_log node1)" >"$(mn_log both)"
for text in "ps0 serving shard 1 of 2 to 2 trainers" "ps1 serving shard 2 of 2 to 2 trainers"; do
  n=$(grep -cF "$text" "$(mn_log both)")
  ((n == 1)) || mn_fail "'$text' appears $n times (expected once: one job of both nodes)"
done
for t in trainer1 trainer2; do
  n=$(mn_count both "$t done: held-out accuracy")
  ((n == 1)) || mn_fail "$t finished $n times (expected once)"
  mn_expect_accuracy both $t 0.8
done
# The servers share a node, the trainers the other one.
for k in 0 1; do
  servers=$(mn_count node$k "ps[01] serving shard")
  trainers=$(mn_count node$k "trainer[12] done:")
  ((servers + trainers == 2 && (servers == 0 || trainers == 0))) ||
    mn_fail "node $k ran $servers servers and $trainers trainers (expected 2 of one kind)"
done
mn_say "passed"

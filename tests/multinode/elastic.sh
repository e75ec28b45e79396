#!/usr/bin/env bash
# Elastic membership: three nodes join with --nnodes 2:3 (one worker each: ps0 and two
# trainers, wherever arrival order puts them). Once training runs, node 2's launcher is
# SIGKILLed, as a crashed host's would be. Its workers must die with it (PR_SET_PDEATHSIG);
# the other nodes must notice that its heartbeat stopped (--rdzv-heartbeat-timeout), stop
# their workers and go on as a new generation of two nodes (ps0 and one trainer), which
# trains to the end and exits 0 on both survivors.
#
# The first generation (WORLD_SIZE 3) is given far more epochs than the test waits for, so it
# can only end by the membership change; the second (WORLD_SIZE 2) trains 5 epochs.
# --max-restarts 1: when node 2 held ps0 (node ranks follow arrival), the surviving trainer
# fails at once, its server gone, and that failure counts as a restart; when node 2 held a
# trainer, only the membership change ends the generation, which counts as none.
source "$(dirname "$0")/lib.sh"
mn_begin elastic 3 75
endpoint=$(mn_addr 0):29515
program=(sh -c 'if [ "$WORLD_SIZE" -eq 3 ]; then e=400; else e=5; fi
exec "$0" --epochs "$e" --min-accuracy 0.7' "$PS_TRAIN")
for k in 0 1 2; do
  mn_start node$k $k GRADWIRE_HOST_ID=host-$k -- --rdzv-endpoint "$endpoint" --rdzv-id elastic \
    --nnodes 2:3 --rdzv-last-call 2s --rdzv-heartbeat-timeout 2s --max-restarts 1 \
    --nproc-per-node 1 "${program[@]}"
  pid[k]=$mn_last_pid
done
# Node 2 takes part in a three-node generation, and a trainer has finished an epoch in it.
mn_await_line node2 "serving shard 1 of 1 to 2 trainers|epoch +[0-9]+/400" "${pid[2]}"
until grep -qE "epoch +[0-9]+/400" "$(mn_log node0)" "$(mn_log node1)" "$(mn_log node2)"; do
  ((SECONDS < mn_deadline)) || mn_fail "no trainer finished an epoch of the 3-node generation"
  sleep 0.05
done
mn_say "training runs on 3 nodes; SIGKILL to node 2's launcher (pid ${pid[2]})"
kill -KILL "${pid[2]}"
wait "${pid[2]}" 2>/dev/null
# Its workers die with it: nothing is left in node 2's namespace.
until [[ -z $(ip netns pids "$BED-2" 2>/dev/null) ]]; do
  ((SECONDS < mn_deadline)) ||
    mn_fail "node 2's workers outlived their launcher: pids $(ip netns pids "$BED-2" | tr '\n' ' ')"
  sleep 0.05
done
mn_say "node 2's workers died with their launcher"
mn_expect_status node0 "${pid[0]}" 0
mn_expect_status node1 "${pid[1]}" 0
cat "$(mn_log node0)" "$(mn_log node1)" >"$(mn_log survivors)"
# The second generation: ps0 and one trainer, on the two survivors.
mn_expect survivors "ps0 serving shard 1 of 1 to 1 trainers"
mn_expect_accuracy survivors trainer1 0.7
mn_expect survivors "trainer1 done: held-out accuracy"
mn_expect_not survivors "after 400 epochs"
for k in 0 1; do
  n=$(mn_count node$k "serving shard 1 of 1 to 1 trainers|trainer1 done: held-out accuracy")
  ((n == 1)) || mn_fail "node $k ran $n workers of the 2-node generation (expected 1)"
done
mn_say "passed"

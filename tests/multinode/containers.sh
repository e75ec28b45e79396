#!/usr/bin/env bash
# Two containers on one host: two namespaces with the SAME host id (GRADWIRE_HOST_ID equal on
# both, as two pods of one machine would have). The abstract Unix socket of the `local`
# transport exists per network namespace, so workers of different nodes must use tcp, and
# workers of one node may still use local. Node 0 runs ps0 and trainer1, node 1 trainer2 and
# trainer3 (static flags). While the job runs, the nodes' sockets are watched:
#   - node 0: a connected Unix socket on a gradwire abstract address (ps0 <-> trainer1 over
#     local; /proc/net/unix, which lists the namespace's sockets);
#   - node 1: the trainers' established TCP connections to node 0 reach at least two ports
#     (the store, and ps0's rpc listener).
# The job must succeed, with every trainer's held-out accuracy.
source "$(dirname "$0")/lib.sh"
mn_begin containers 2 45
master=$(mn_addr 0)
port=29516
# Watchers: each writes one line to its log when it has seen what it looks for, and gives up
# at the deadline (or when killed with the bed's processes).
watch_time=$((mn_deadline - SECONDS))
"$TESTBED" exec "$BED" 0 timeout "$watch_time" bash -c '
  until awk '\''$6 == "03" && $8 ~ /^@gradwire-/ { found = 1 } END { exit !found }'\'' /proc/net/unix; do
    sleep 0.02
  done
  echo "local: connected unix socket $(awk '\''$6 == "03" && $8 ~ /^@gradwire-/ { print $8; exit }'\'' /proc/net/unix)"
' >"$(mn_log watch0)" 2>&1 &
watch[0]=$!
"$TESTBED" exec "$BED" 1 timeout "$watch_time" bash -c '
  master=$1
  while :; do
    ports=$(ss -Htnp state established "dst $master" 2>/dev/null | grep gradwire-ps |
      awk "{ n = split(\$4, a, \":\"); print a[n] }" | sort -u)
    if (($(echo "$ports" | grep -c .) >= 2)); then
      echo "tcp: trainers connected to $master ports" $ports
      exit 0
    fi
    sleep 0.02
  done
' watch "$master" >"$(mn_log watch1)" 2>&1 &
watch[1]=$!
train=("$PS_TRAIN" --epochs 8 --min-accuracy 0.8)
for k in 0 1; do
  mn_start node$k $k GRADWIRE_HOST_ID=shared-host -- --nnodes 2 --node-rank $k \
    --master-addr "$master" --master-port $port --nproc-per-node 2 "${train[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status node0 "${pid[0]}" 0
mn_expect_status node1 "${pid[1]}" 0
mn_expect node0 "ps0 serving shard 1 of 1 to 3 trainers"
mn_expect_accuracy node0 trainer1 0.8
mn_expect_accuracy node1 trainer2 0.8
mn_expect_accuracy node1 trainer3 0.8
kill "${watch[@]}" 2>/dev/null
wait "${watch[@]}" 2>/dev/null
mn_expect watch0 "local: connected unix socket @gradwire-"
mn_expect watch1 "tcp: trainers connected to $master ports"
mn_say "$(cat "$(mn_log watch0)")"
mn_say "$(cat "$(mn_log watch1)")"
mn_say "passed"

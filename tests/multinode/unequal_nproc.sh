#!/usr/bin/env bash
# Unequal --nproc-per-node across nodes (2 on node 0, 1 on node 1), joined through
# --rdzv-endpoint: global ranks come from the rendezvous, so they are distinct and dense
# (0..2), WORLD_SIZE is 3 everywhere, and each node's ranks are contiguous from its offset.
# Each worker prints its environment; then ps_train runs on the same layout (one server, two
# trainers) and must succeed.
source "$(dirname "$0")/lib.sh"
mn_begin unequal_nproc 2 45
endpoint=$(mn_addr 0):29517
show=(sh -c 'echo "env rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE node=$GROUP_RANK"')
nproc=(2 1)
for k in 0 1; do
  mn_start env$k $k GRADWIRE_HOST_ID=host-$k -- --rdzv-endpoint "$endpoint" --rdzv-id unequal-env \
    --nnodes 2 --nproc-per-node "${nproc[k]}" "${show[@]}"
  pid[k]=$mn_last_pid
done
mn_expect_status env0 "${pid[0]}" 0
mn_expect_status env1 "${pid[1]}" 0
declare -A seen=()
for k in 0 1; do
  lines=$(grep -oE "env rank=[0-9]+ world=[0-9]+ local=[0-9]+/[0-9]+ node=[0-9]+" "$(mn_log env$k)")
  n=$(grep -c . <<<"$lines")
  ((n == nproc[k])) || mn_fail "node $k printed $n worker environments, expected ${nproc[k]}"
  node_ranks=$(sed -E 's/.*node=//' <<<"$lines" | sort -u)
  (($(grep -c . <<<"$node_ranks") == 1)) || mn_fail "node $k's workers disagree on GROUP_RANK"
  node_rank[k]=$node_ranks
  first=""
  while read -r line; do
    [[ $line =~ rank=([0-9]+)\ world=([0-9]+)\ local=([0-9]+)/([0-9]+) ]] || continue
    r=${BASH_REMATCH[1]} world=${BASH_REMATCH[2]} l=${BASH_REMATCH[3]} lws=${BASH_REMATCH[4]}
    ((world == 3)) || mn_fail "node $k: a worker has WORLD_SIZE $world, expected 3"
    ((lws == nproc[k])) || mn_fail "node $k: LOCAL_WORLD_SIZE $lws, expected ${nproc[k]}"
    [[ -z ${seen[$r]:-} ]] || mn_fail "rank $r was given twice (nodes ${seen[$r]} and $k)"
    seen[$r]=$k
    [[ -z $first ]] && first=$((r - l))
    ((r - l == first)) || mn_fail "node $k's ranks are not contiguous from its offset"
  done <<<"$lines"
  offset[k]=$first
done
[[ ${node_rank[0]} != "${node_rank[1]}" ]] || mn_fail "both nodes got node rank ${node_rank[0]}"
for r in 0 1 2; do
  [[ -n ${seen[$r]:-} ]] || mn_fail "no worker got rank $r"
done
# The node of rank 0 is node rank 0, and the other node's ranks follow its workers.
for k in 0 1; do
  if ((node_rank[k] == 0)); then
    ((offset[k] == 0)) || mn_fail "node rank 0 (node $k) starts at rank ${offset[k]}"
  else
    ((offset[k] == nproc[1 - k])) || mn_fail "node $k starts at rank ${offset[k]}, expected ${nproc[1 - k]}"
  fi
done
mn_say "ranks: node 0 (node rank ${node_rank[0]}) from ${offset[0]}, node 1 (node rank ${node_rank[1]}) from ${offset[1]}"

# The same layout trains: one server and two trainers.
endpoint=$(mn_addr 0):29518
for k in 0 1; do
  mn_start train$k $k GRADWIRE_HOST_ID=host-$k -- --rdzv-endpoint "$endpoint" --rdzv-id unequal-train \
    --nnodes 2 --nproc-per-node "${nproc[k]}" "$PS_TRAIN" --epochs 6 --min-accuracy 0.8
  pid[k]=$mn_last_pid
done
mn_expect_status train0 "${pid[0]}" 0
mn_expect_status train1 "${pid[1]}" 0
cat "$(mn_log train0)" "$(mn_log train1)" >"$(mn_log train)"
mn_expect train "ps0 serving shard 1 of 1 to 2 trainers"
mn_expect_accuracy train trainer1 0.8
mn_expect_accuracy train trainer2 0.8
mn_say "passed"

#!/usr/bin/env bash
# The real parameter-server example as an elastic role job across hosts (gradwire-run --role,
# docs/launcher.md "Elastic parameter-server jobs", docs/elastic.md): gradwire-ps-train's
# server (critical) in node 0 and two trainers in node 1 form the job with --nnodes 2:3.
# While they train, a third trainer launcher started in node 2 joins the running job: its
# trainer, trainer3, gets rank 3, the server serves it, and it trains. Its launcher is then
# SIGKILLed mid-training, as a crashed host's would be: the worker dies with it, the server
# releases what trainer3 held and the trainer group stops waiting for it, and the job goes
# on. Nobody restarts: the server serves its shard once, and both initial trainers finish
# at their held-out accuracy (ps_train fails below --min-accuracy). The job uses a shared
# secret, so every store and connection of it authenticates across the hosts.
source "$(dirname "$0")/lib.sh"
mn_begin ps_train_elastic 3 75
: "${PS_TRAIN:?}"
endpoint=$(mn_addr 0):29520
secret=GRADWIRE_SECRET=ps-elastic-shared-secret-$RANDOM$RANDOM
# Enough epochs that the initial trainers still train when the third has joined and is lost.
epochs=150
common=(--rdzv-endpoint "$endpoint" --rdzv-id ps-train-elastic --nnodes 2:3 --rdzv-last-call 1s
  --rdzv-heartbeat-timeout 2s --rdzv-timeout 30s)
train=("$PS_TRAIN" --epochs "$epochs" --min-accuracy 0.85)
# still_training WHEN: both initial trainers have epochs left at WHEN.
still_training() {
  local t
  for t in trainer1 trainer2; do
    ! grep -qE "$t epoch +$epochs/$epochs" "$(mn_log trainers)" ||
      mn_fail "$t finished its $epochs epochs before $1; the case needs more of them"
  done
  mn_say "$1 after $(mn_count trainers "trainer1 epoch ") of trainer1's $epochs epochs"
}

mn_start servers 0 GRADWIRE_HOST_ID=host-0 "$secret" -- "${common[@]}" \
  --role server:1:critical "${train[@]}"
pid_servers=$mn_last_pid
# gradwire-run numbers an elastic job's nodes in arrival order and ps_train takes RANK 0 for
# its server, so node 1 starts once node 0's launcher is on its way in (it hosts the
# rendezvous store, and arrives right after saying so); the layout is checked below.
mn_await_line servers "rendezvous 'ps-train-elastic' on the store at .* \\(hosted by this launcher\\)" \
  "$pid_servers"
mn_start trainers 1 GRADWIRE_HOST_ID=host-1 "$secret" -- "${common[@]}" \
  --role trainer:2 "${train[@]}"
pid_trainers=$mn_last_pid
mn_await_line servers "generation 0 of 'ps-train-elastic': node" "$pid_servers"
grep -qF "node 0 of 2, ranks 0..0 of 3" "$(mn_log servers)" ||
  mn_fail "node 1's launcher arrived first: ps_train's server (RANK 0) would run in node 1"
# The initial group trains: the server serves its shard and both trainers finished an epoch.
mn_await_line servers "ps0 serving shard 1 of 1 to 2 trainers" "$pid_servers"
mn_expect trainers "generation 0 of 'ps-train-elastic': node 1 of 2, ranks 1..2 of 3"
mn_await_line trainers "trainer1 epoch +1/$epochs" "$pid_trainers"
mn_await_line trainers "trainer2 epoch +1/$epochs" "$pid_trainers"
mn_say "the initial group trains: the server in node 0, two trainers in node 1"

mn_start late 2 GRADWIRE_HOST_ID=host-2 "$secret" -- "${common[@]}" \
  --role trainer:1 "${train[@]}"
pid_late=$mn_last_pid
mn_await_line late "trainer3 joined the running job as rank 3" "$pid_late"
mn_await_line late "trainer3 epoch +1/$epochs" "$pid_late"
mn_await_line servers "ps0: trainer3 joined the job; serving it" "$pid_servers"
mn_expect late "joining the running generation 0 of 'ps-train-elastic' as node 2"
still_training "trainer3 joined and trained"
mn_say "SIGKILL to node 2's launcher (pid $pid_late)"
kill -KILL "$pid_late"
wait "$pid_late" 2>/dev/null
until [[ -z $(ip netns pids "$BED-2" 2>/dev/null) ]]; do
  ((SECONDS < mn_deadline)) ||
    mn_fail "node 2's worker outlived its launcher: pids $(ip netns pids "$BED-2" | tr '\n' ' ')"
  sleep 0.05
done
mn_await_line servers "ps0: lost trainer3" "$pid_servers"
still_training "the server lost trainer3"
mn_await_line servers "node 2 left the job: stopped answering" "$pid_servers"
kill -0 "$pid_servers" 2>/dev/null || mn_fail "node 0's launcher ended with node 2"
kill -0 "$pid_trainers" 2>/dev/null || mn_fail "node 1's launcher ended with node 2"
mn_say "trainer3 is lost and the job trains on"

mn_expect_status trainers "$pid_trainers" 0
mn_expect_status servers "$pid_servers" 0
# A trainer's role is not critical: its launcher exits 0 without it, saying so.
failed=$(grep -E "gradwire-run: rank [0-9]+ .*failed" "$(mn_log trainers)")
[[ -z $failed ]] || mn_fail "a trainer of node 1 failed: $failed"
for t in trainer1 trainer2; do
  (($(mn_count trainers "$t done: held-out accuracy") == 1)) || mn_fail "$t did not finish once"
  mn_expect trainers "$t epoch $epochs/$epochs"
  mn_expect_accuracy trainers "$t" 0.85
done
# Nobody was restarted: the server served its shard once, no trainer came back.
(($(mn_count servers "serving shard") == 1)) || mn_fail "the server started more than once"
mn_expect_not servers "rejoined"
mn_expect_not trainers "rejoined"
mn_expect_not servers "generation 1"
mn_expect_not trainers "generation 1"
mn_say "passed"

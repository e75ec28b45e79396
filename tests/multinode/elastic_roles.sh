#!/usr/bin/env bash
# An elastic role job across hosts (gradwire-run --role, docs/launcher.md "Elastic
# parameter-server jobs"): the server (critical) in node 0, two trainers in node 1, which
# form the job with --nnodes 2:3; a third trainer launcher started later in node 2 joins the
# running job (GRADWIRE_RPC_JOIN=1, a RANK past WORLD_SIZE) and meets it on the workers'
# store that node 0's launcher hosts. Its launcher is then SIGKILLed, as a crashed host's
# would be: its worker dies with it, node 0's launcher notes that node 2 stopped answering,
# and nothing restarts. The job still runs: a fourth launcher in node 2 joins with ranks
# nobody held, and its trainer opens the gate (a key on the workers' store) that lets every
# worker finish; every launcher still in the job exits 0. The job uses a shared secret, so
# every store and connection of it authenticates across the hosts.
#
# The workers are tests/multinode/elastic_worker.cc: they print what the launcher told them
# and wait on store keys.
source "$(dirname "$0")/lib.sh"
mn_begin elastic_roles 3 50
: "${ELASTIC_WORKER:?}"
endpoint=$(mn_addr 0):29519
addr0=$(mn_addr 0)
secret=GRADWIRE_SECRET=elastic-roles-shared-secret-$RANDOM$RANDOM
common=(--rdzv-endpoint "$endpoint" --rdzv-id elastic-roles --nnodes 2:3 --rdzv-last-call 1s
  --rdzv-heartbeat-timeout 2s --rdzv-timeout 30s)
mn_start servers 0 GRADWIRE_HOST_ID=host-0 "$secret" -- "${common[@]}" \
  --role server:1:critical "$ELASTIC_WORKER" --rendezvous --wait end --timeout-ms 45000
pid_servers=$mn_last_pid
mn_start trainers 1 GRADWIRE_HOST_ID=host-1 "$secret" -- "${common[@]}" \
  --role trainer:2 "$ELASTIC_WORKER" --rendezvous --wait end --timeout-ms 45000
pid_trainers=$mn_last_pid
# The initial group met: the server and both trainers returned from rendezvous.
mn_await_line servers "met rank=[0-9]+ world=3" "$pid_servers"
until (($(mn_count trainers "met rank=[0-9]+ world=3") == 2)); do
  ((SECONDS < mn_deadline)) || mn_fail "the trainers of node 1 did not meet the job"
  kill -0 "$pid_trainers" 2>/dev/null || mn_fail "node 1's launcher exited before its trainers met"
  sleep 0.05
done
mn_expect servers "(hosted by this launcher)"
mn_say "the initial group runs: a server in node 0, two trainers in node 1"

mn_start late 2 GRADWIRE_HOST_ID=host-2 "$secret" -- "${common[@]}" \
  --role trainer:1 "$ELASTIC_WORKER" --rendezvous --wait never --timeout-ms 45000
pid_late=$mn_last_pid
mn_await_line late "met rank=3 world=3" "$pid_late"
mn_expect late "join=1"
mn_expect late "role=trainer role_rank=2 role_world=2"
mn_expect late "master=$addr0:"
mn_expect late "joining the running generation 0 of 'elastic-roles' as node 2"
mn_say "a third trainer launcher joined the running job; SIGKILL to it (pid $pid_late)"
kill -KILL "$pid_late"
wait "$pid_late" 2>/dev/null
until [[ -z $(ip netns pids "$BED-2" 2>/dev/null) ]]; do
  ((SECONDS < mn_deadline)) ||
    mn_fail "node 2's worker outlived its launcher: pids $(ip netns pids "$BED-2" | tr '\n' ' ')"
  sleep 0.05
done
mn_await_line servers "node 2 left the job: stopped answering" "$pid_servers"
kill -0 "$pid_servers" 2>/dev/null || mn_fail "node 0's launcher ended with node 2"
kill -0 "$pid_trainers" 2>/dev/null || mn_fail "node 1's launcher ended with node 2"
mn_say "node 2 is gone and the job runs on; a fourth launcher joins and ends it"

mn_start final 2 GRADWIRE_HOST_ID=host-2 "$secret" -- "${common[@]}" \
  --role trainer:1 "$ELASTIC_WORKER" --rendezvous --set end --timeout-ms 45000
pid_final=$mn_last_pid
mn_expect_status final "$pid_final" 0
mn_expect_status servers "$pid_servers" 0
mn_expect_status trainers "$pid_trainers" 0
mn_expect final "met rank=4 world=3"
mn_expect final "role=trainer role_rank=3 role_world=2"
mn_expect final "as node 3"
# Nobody was restarted: one life per initial worker, each released by the gate.
(($(mn_count servers "worker pid=") == 1)) || mn_fail "the server started more than once"
(($(mn_count trainers "worker pid=") == 2)) || mn_fail "node 1's trainers started more than once"
(($(mn_count servers "released by end") == 1)) || mn_fail "the server was not released by the gate"
(($(mn_count trainers "released by end") == 2)) || mn_fail "node 1's trainers were not released"
(($(mn_count trainers "master=$addr0:") == 2)) || mn_fail "node 1's trainers met elsewhere than node 0"
mn_expect_not servers "generation 1"
mn_expect_not trainers "generation 1"
mn_say "passed"

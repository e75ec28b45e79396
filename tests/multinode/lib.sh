# shellcheck shell=bash
# Shared by the multinode test drivers (sourced, not run). Each driver runs one case on the
# test bed the CTest fixture brought up (scripts/netns-testbed.sh): it starts one
# gradwire-run per node inside that node's namespace, waits for them with a deadline, and
# checks their exit statuses and output. Whatever it started is killed when it exits, pass
# or fail, and on failure every node's log is printed.
#
# Ports: every node must be told the same rendezvous port, so each case names one of its own
# (29511...). They are bound only inside the bed's namespaces, which nothing else uses.
#
# The fixture passes, in the environment:
#   TESTBED       scripts/netns-testbed.sh
#   BED           the bed's name (its nodes are the namespaces BED-0, BED-1, ...)
#   BED_STATE     a folder where the fixture leaves its skip reason, if it skipped
#   LOG_ROOT      where each case keeps its nodes' logs (LOG_ROOT/<case>/node<K>.log)
#   GRADWIRE_RUN, PS_TRAIN, HYBRID_TRAIN, DDP_WORKER: the programs under test
set -uo pipefail

readonly MN_SKIP=77
mn_case=""
mn_log_dir=""
mn_pids=()
mn_deadline=0

mn_say() { echo "[$mn_case] $*"; }

mn_dump_logs() {
  local f
  for f in "$mn_log_dir"/*.log; do
    [[ -e $f ]] || continue
    echo "---------------- $(basename "$f")"
    cat "$f"
  done
  echo "----------------"
}

# Fails the case: the reason, then every node's log.
mn_fail() {
  echo "[$mn_case] FAILED: $*" >&2
  mn_dump_logs >&2
  exit 1
}

mn_cleanup() {
  local status=$?
  # Launchers first (they would restart what is killed under them), then whatever is left in
  # the bed's namespaces: workers of a killed launcher, a stuck store.
  if ((${#mn_pids[@]})); then
    kill -KILL "${mn_pids[@]}" 2>/dev/null
  fi
  "$TESTBED" kill "$BED" 2>/dev/null
  wait 2>/dev/null
  exit "$status"
}

# mn_begin CASE NODES SECONDS: starts a case that needs NODES nodes and must end within
# SECONDS; skips (status 77) with the fixture's reason when the bed is not up.
mn_begin() {
  mn_case=$1
  local need=$2 have reason
  mn_deadline=$((SECONDS + $3))
  for var in TESTBED BED BED_STATE LOG_ROOT GRADWIRE_RUN; do
    [[ -n ${!var:-} ]] || {
      echo "[$mn_case] $var is not set: run this through ctest -L multinode" >&2
      exit 2
    }
  done
  have=$("$TESTBED" nodes "$BED" 2>/dev/null)
  if ! [[ $have =~ ^[0-9]+$ ]] || ((have < need)); then
    reason="the test bed '$BED' is not up"
    [[ -s $BED_STATE/skip-reason ]] && reason=$(cat "$BED_STATE/skip-reason")
    echo "[$mn_case] skipped: needs $need network-namespace nodes: $reason"
    exit "$MN_SKIP"
  fi
  mn_log_dir=$LOG_ROOT/$mn_case
  rm -rf "$mn_log_dir"
  mkdir -p "$mn_log_dir"
  trap mn_cleanup EXIT
  trap 'exit 1' INT TERM
  # Whatever an earlier case (or a crashed run) left in the nodes.
  "$TESTBED" kill "$BED"
}

mn_addr() {
  "$TESTBED" addr "$BED" "$1" || mn_fail "node $1 has no address"
}

mn_log() { echo "$mn_log_dir/$1.log"; }

# mn_start ID K [VAR=VALUE...] -- LAUNCHER_ARGS...: runs gradwire-run in node K with the
# given environment, its output in the log ID (mn_log ID), in the background; sets
# mn_last_pid to the launcher's pid (`ip netns exec` and `env` exec into it).
mn_start() {
  local id=$1 k=$2
  shift 2
  local vars=()
  while (($#)) && [[ $1 != -- ]]; do
    vars+=("$1")
    shift
  done
  [[ ${1:-} == -- ]] && shift
  "$TESTBED" exec "$BED" "$k" env "${vars[@]}" "$GRADWIRE_RUN" "$@" >"$(mn_log "$id")" 2>&1 &
  mn_last_pid=$!
  mn_pids+=("$mn_last_pid")
  mn_say "node $k: ${vars[*]} gradwire-run $* (log $id)"
}

# mn_wait PID: waits until PID exits or the case's deadline passes (then fails the case);
# sets mn_status to PID's exit status.
mn_wait() {
  local pid=$1 left=$((mn_deadline - SECONDS))
  ((left > 0)) || left=1
  if ! timeout "$left" tail --pid="$pid" -f /dev/null; then
    mn_fail "pid $pid was still running at the case's deadline"
  fi
  wait "$pid"
  mn_status=$?
}

# mn_expect_status ID PID WANT: waits for the launcher PID (log ID) and checks its status.
mn_expect_status() {
  mn_wait "$2"
  ((mn_status == $3)) || mn_fail "$1's launcher exited with status $mn_status, expected $3"
  mn_say "$1's launcher exited with $mn_status"
}

# mn_await_line ID REGEX [PID]: waits (until the deadline) for a line matching the extended
# REGEX in log ID; fails early when PID (a launcher) exits first.
mn_await_line() {
  local log pid=${3:-}
  log=$(mn_log "$1")
  until grep -qE -- "$2" "$log" 2>/dev/null; do
    ((SECONDS < mn_deadline)) || mn_fail "no line matching '$2' in $1's log before the deadline"
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      grep -qE -- "$2" "$log" && break
      mn_fail "$1's launcher exited before a line matching '$2'"
    fi
    sleep 0.05
  done
}

# mn_expect ID TEXT: log ID holds TEXT (fixed string).
mn_expect() {
  grep -qF -- "$2" "$(mn_log "$1")" || mn_fail "$1's log lacks '$2'"
}

# mn_expect_not ID TEXT: log ID does not hold TEXT.
mn_expect_not() {
  ! grep -qF -- "$2" "$(mn_log "$1")" || mn_fail "$1's log holds '$2'"
}

# mn_count ID REGEX: how many lines of log ID match the extended REGEX.
mn_count() {
  grep -cE -- "$2" "$(mn_log "$1")"
}

# mn_expect_accuracy ID TRAINER MIN: TRAINER's "done: held-out accuracy A" line is in log ID
# and A >= MIN.
mn_expect_accuracy() {
  local line acc
  line=$(grep -oE "$2 done: held-out accuracy [0-9.]+" "$(mn_log "$1")" | tail -n 1)
  [[ -n $line ]] || mn_fail "$1's log has no '$2 done: held-out accuracy' line"
  acc=${line##* }
  awk -v a="$acc" -v m="$3" 'BEGIN { exit !(a >= m) }' ||
    mn_fail "$2's held-out accuracy $acc is below $3"
  mn_say "$2: held-out accuracy $acc"
}

#!/usr/bin/env bash
# Long chaos runs: scripts/chaos.sh SECONDS [FIRST_SEED]
# Runs the chaos suite's schedules (tests/chaos, docs/chaos.md) for random seeds, one
# process per schedule, until SECONDS have passed, and prints every seed that failed with
# the log of its run; the seed then becomes a regression seed in tests/chaos/chaos_test.cc.
# FIRST_SEED makes the run repeatable (seeds FIRST_SEED, FIRST_SEED+1, ...); without it the
# seeds are random 63-bit numbers. Uses build/tests/chaos_test (or $GRADWIRE_BUILD_DIR),
# which it does not build. Exit status: 0 when every schedule passed, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_BUILD_DIR:-$root/build}
binary=$build/tests/chaos_test
seconds=${1:?usage: scripts/chaos.sh SECONDS [FIRST_SEED]}
next=${2:-}
if [[ ! -x $binary ]]; then
  echo "chaos.sh: $binary is missing: build the chaos_test target first" >&2
  exit 2
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
end=$((SECONDS + seconds))
runs=0
failed=()
while ((SECONDS < end)); do
  if [[ -n $next ]]; then
    seed=$next
    next=$((next + 1))
  else
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    seed=$((seed & 0x7fffffffffffffff))
  fi
  runs=$((runs + 1))
  if ! GRADWIRE_CHAOS_SEED=$seed timeout 180 "$binary" --gtest_filter='ChaosRandom.*' \
      >"$logs/$seed.log" 2>&1; then
    failed+=("$seed")
    echo "FAILED seed $seed"
    sed 's/^/  | /' "$logs/$seed.log"
  fi
done
echo "chaos.sh: $runs schedules in $seconds s, ${#failed[@]} failed${failed:+: ${failed[*]}}"
((${#failed[@]} == 0))

#!/usr/bin/env bash
# The libFuzzer targets (fuzz/): builds them with clang, ASan+UBSan and coverage over every
# library (clang's -Wthread-safety analysis comes with the build), replays the inputs of
# past findings (fuzz/regressions/<target>/), then fuzzes each target for a bounded time
# from its committed seeds (fuzz/corpus/<target>/). New inputs go to the build folder; a
# crash, a hang or a leak stops with the input saved there.
#   scripts/fuzz.sh [SECONDS]     seconds per target (default 60)
#   scripts/fuzz.sh --seeds       rewrite fuzz/corpus/ with fuzz_seeds, then stop
#   GRADWIRE_FUZZ_TARGETS="fuzz_envelope fuzz_store_server" scripts/fuzz.sh 600
#   GRADWIRE_FUZZ_BUILD_DIR=...   build folder (default build-fuzz)
#   GRADWIRE_FUZZ_SEED=N          libFuzzer's random seed (default: a fresh one per run; CI
#                                 fixes it, so that its short runs are repeatable)
#   GRADWIRE_FUZZ_REPLAY_ONLY="t ..."  targets that only replay their seeds and past findings
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GRADWIRE_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${GRADWIRE_JOBS:-$(nproc)}
# The in-process targets first, then the two that drive real servers over loopback.
targets=${GRADWIRE_FUZZ_TARGETS:-fuzz_envelope fuzz_value_convert fuzz_tensor_meta fuzz_rref_message \
  fuzz_dist_autograd_message fuzz_store_server fuzz_transport}
seconds=60
seeds=0
case "${1:-}" in
  --seeds) seeds=1 ;;
  "") ;;
  *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS | --seeds]" >&2; exit 2 ;;
  *) seconds=$1 ;;
esac

"$root/scripts/install-deps.sh" --checks
CXX=clang++ CC=clang cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGRADWIRE_USE_CUDA=OFF -DGRADWIRE_BUILD_BENCH=OFF -DGRADWIRE_BUILD_EXAMPLES=OFF \
  -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_FUZZ=ON -DGRADWIRE_SANITIZE="address;undefined" \
  -DGRADWIRE_WITH_TORCH=OFF \
  -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" >/dev/null
cmake --build "$build" -j "$jobs"

if [[ $seeds == 1 ]]; then
  rm -rf "$root/fuzz/corpus"
  "$build/fuzz/fuzz_seeds" "$root/fuzz/corpus"
  exit 0
fi

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$build/artifacts"
for t in $targets; do
  echo "== $t"
  if compgen -G "$root/fuzz/regressions/$t/*" >/dev/null; then
    # A past finding that fails again prints its whole report (the stack included).
    "$build/fuzz/$t" -runs=1 "$root"/fuzz/regressions/"$t"/* >"$build/$t.replay.log" 2>&1 ||
      { cat "$build/$t.replay.log" >&2; echo "gradwire: $t fails on a past finding" >&2; exit 1; }
    echo "replayed $(grep -c '^Executed' "$build/$t.replay.log") past finding(s)"
  fi
  if [[ " ${GRADWIRE_FUZZ_REPLAY_ONLY:-} " == *" $t "* ]]; then
    "$build/fuzz/$t" -runs=0 "$root/fuzz/corpus/$t" >"$build/$t.log" 2>&1 ||
      { cat "$build/$t.log" >&2; echo "gradwire: $t failed on its seeds" >&2; exit 1; }
    echo "replayed $(ls "$root/fuzz/corpus/$t" | wc -l) seed(s)"
    continue
  fi
  work="$build/corpus/$t"
  mkdir -p "$work"
  # -timeout: one input taking longer is a hang; -rss_limit_mb: one taking more memory is a
  # finding too (every parser bounds what it allocates).
  # -max_len: the network targets get inputs of up to 1 MiB (frames past the first, long
  # transcripts); the in-process parsers up to 256 KiB.
  case "$t" in
    fuzz_store_server | fuzz_transport) max_len=1048576 ;;
    *) max_len=262144 ;;
  esac
  status=0
  "$build/fuzz/$t" "$work" "$root/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=30 \
    -max_len="$max_len" \
    ${GRADWIRE_FUZZ_SEED:+-seed="$GRADWIRE_FUZZ_SEED"} \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
    >"$build/$t.log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb|Done [0-9]+ runs)' \
    "$build/$t.log" || true
  if [[ $status -ne 0 ]]; then
    # The report whole: the sanitizer's stack, the input's bytes and libFuzzer's summary.
    grep -v '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\|INITED\|RELOAD\)' "$build/$t.log" | tail -n 400 >&2
    echo "gradwire: $t found a problem (exit $status); the input is in $build/artifacts" >&2
    exit 1
  fi
done

// Joining the futures of several messages sent at once (a release told to every worker a
// context reached, the parts of a backward pass, the forks a shutdown waits for).
// core's collect_all waits for every input and keeps values; these two keep no values and
// differ in how they treat failures:
//   - join_fail_fast: fails with the first failure as soon as it happens (the pass ends
//     with the first worker's error, not after the slowest one has answered);
//   - join_settled: completes when every input has completed, whatever the outcome (a
//     worker that is gone does not hold what it was told to drop; only the wait ends).
//
// Both complete on the thread that completes the deciding input; they run no user code.
// An empty input gives a ready future.
//
// Thread-safety: the inputs may complete on any threads.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "gradwire/core/future.h"

namespace gradwire::rpc {

template <typename T>
Future<void> join_fail_fast(const std::vector<Future<T>>& futures) {
  Future<void> result;
  if (futures.empty()) {
    result.set_value();
    return result;
  }
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  for (const Future<T>& f : futures) {
    gradwire::detail::on_complete_inline(f, [result, left](const Future<T>& done) mutable {
      if (done.has_error()) {
        result.try_set_error(done.error());
      } else if (left->fetch_sub(1, std::memory_order_acq_rel) == 1) {
        result.try_set_value();
      }
    });
  }
  return result;
}

template <typename T>
Future<void> join_settled(const std::vector<Future<T>>& futures) {
  Future<void> result;
  if (futures.empty()) {
    result.set_value();
    return result;
  }
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  for (const Future<T>& f : futures) {
    gradwire::detail::on_complete_inline(f, [result, left](const Future<T>&) mutable {
      if (left->fetch_sub(1, std::memory_order_acq_rel) == 1) result.try_set_value();
    });
  }
  return result;
}

}  // namespace gradwire::rpc

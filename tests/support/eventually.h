// Waiting for a condition that other threads make true, for tests with no event to wait
// on (a counter another thread bumps, a state a background loop reaches). Header-only.
//
// eventually polls `pred` with a short back-off (1 ms doubling to 10 ms) until it returns
// true or `timeout` passes; `pred` is asked once more at the deadline, so a condition that
// holds by then counts. A test asserts on the result, so a condition that never holds
// fails the test instead of hanging it.
//
// Thread-safety: call from any thread; `pred` runs on the calling thread.
// Errors: whatever `pred` throws propagates.
//
// Example:
//   ASSERT_TRUE(eventually([&] { return server.connections() == 0; }));
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

namespace gradwire::testing {

// True once `pred` returned true; false if it still returned false at `timeout`.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause(1);
  constexpr std::chrono::milliseconds kMaxPause(10);
  while (!pred()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return pred();
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kMaxPause);
  }
  return true;
}

}  // namespace gradwire::testing

// Per-function statistics of an rpc agent (RpcAgent::stats()): for each registered
// function and each peer, how many calls, how many failed, the bytes each way, and the
// latency's p50 and p99.
//
// Two sides are kept apart:
// - calls: the calls this worker made, by (function, callee). Latency runs from the call
//   leaving rpc_async to its end (reply, error, timeout, lost connection); an error is any
//   end other than a reply carrying a value. bytes_out is what the request took on the wire
//   (envelope and tensors), bytes_in what the reply did.
// - served: the requests this worker served, by (function, caller). Latency is the serving
//   time, from the moment the function starts on its thread to the reply being handed to
//   the transport (time queued for the pool is not in it; the trace's rpc.queue span shows
//   it). bytes_in is the request, bytes_out the reply; an error is a reply carrying an
//   error (the function threw, or the call was refused).
// Only calls of registered functions (the call handler) are counted; the protocol messages
// of the modules above rpc/ (rref, dist_autograd) are not.
//
// Cost: each (function, peer) pair gets its entry, with a fixed-size histogram, at its
// first call; later calls take the table's lock for a lookup, then only update atomics.
// GRADWIRE_RPC_STATS=1 prints both tables to stderr when the agent shuts down.
//
// Thread-safety: LatencyHistogram's record() and its readers may run concurrently (relaxed
// atomics: a reader sees each count whole, perhaps not the latest). RpcStats is a value.
//
// Example:
//   for (const rpc::FunctionStats& s : agent->stats().calls)
//     std::cout << s.function << " on " << s.peer << ": p99 " << s.p99_us << " us\n";
//   std::cout << agent->stats().table();
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gradwire::rpc {

// A log-scale histogram of durations in nanoseconds: kSubBuckets buckets per power of two,
// so a percentile is known within about 1/kSubBuckets of its value (12.5 %). Fixed size;
// recording allocates nothing.
class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 8;
  static constexpr int kBuckets = 64 * kSubBuckets;

  void record(int64_t ns);
  uint64_t count() const;
  // The duration below which a fraction q (in [0, 1]) of the recorded ones lie, as the
  // middle of its bucket, in nanoseconds; 0 when nothing was recorded.
  double percentile(double q) const;
  // The bucket of `ns`, and the smallest duration of bucket `index` (for tests).
  static int bucket_of(int64_t ns);
  static int64_t bucket_floor(int index);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
};

// What one side knows of one (function, peer) pair.
struct FunctionStats {
  std::string function;
  std::string peer;    // the worker's name
  uint64_t calls{0};   // ended (caller) or served (callee)
  uint64_t errors{0};  // of those, the ones that ended in an error
  uint64_t bytes_out{0};
  uint64_t bytes_in{0};
  double p50_us{0};
  double p99_us{0};
};

struct RpcStats {
  std::vector<FunctionStats> calls;   // made by this worker, by (function, callee)
  std::vector<FunctionStats> served;  // served by this worker, by (function, caller)

  // Both sides as aligned text tables, one line per (function, peer).
  std::string table() const;
};

}  // namespace gradwire::rpc

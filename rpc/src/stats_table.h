// StatsTable: the entries behind RpcAgent::stats() (rpc/stats.h), one per (function, peer).
//
// entry() finds or makes the entry of a pair under the table's lock (a lookup that does not
// allocate once the pair exists); an entry is never removed, so the reference stays valid
// as long as the table, and recording into it only updates atomics.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/rpc/stats.h"

namespace gradwire::rpc::detail {

class StatsTable {
 public:
  struct Entry {
    Entry(std::string f, std::string p) : function(std::move(f)), peer(std::move(p)) {}
    const std::string function;
    const std::string peer;
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> bytes_out{0};
    std::atomic<uint64_t> bytes_in{0};
    LatencyHistogram latency;

    // The count goes last (release), and snapshot() reads it first (acquire): a reader
    // that sees n calls sees at least their errors, bytes and latencies.
    void record(int64_t ns, bool error, uint64_t out, uint64_t in) {
      if (error) errors.fetch_add(1, std::memory_order_relaxed);
      bytes_out.fetch_add(out, std::memory_order_relaxed);
      bytes_in.fetch_add(in, std::memory_order_relaxed);
      latency.record(ns);
      calls.fetch_add(1, std::memory_order_release);
    }
  };

  // The entry of `function` with the peer of id `peer_id` (named `peer_name`).
  Entry& entry(std::string_view function, int peer_id, const std::string& peer_name);
  std::vector<FunctionStats> snapshot() const;

 private:
  mutable Mutex mutex_;
  // By peer id, then function name (transparent comparison: looked up by string_view).
  std::map<int, std::map<std::string, std::unique_ptr<Entry>, std::less<>>> entries_
      GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::rpc::detail

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>

#include "gradwire/rpc/stats.h"
#include "stats_table.h"

namespace gradwire::rpc {

namespace {
constexpr int kSubBits = std::countr_zero(static_cast<unsigned>(LatencyHistogram::kSubBuckets));
}  // namespace

int LatencyHistogram::bucket_of(int64_t ns) {
  if (ns < kSubBuckets) return ns < 0 ? 0 : static_cast<int>(ns);
  const uint64_t v = static_cast<uint64_t>(ns);
  const int octave = 63 - std::countl_zero(v);  // >= kSubBits
  const int sub = static_cast<int>((v >> (octave - kSubBits)) & (kSubBuckets - 1));
  const int index = (octave - kSubBits + 1) * kSubBuckets + sub;
  return std::min(index, kBuckets - 1);
}

int64_t LatencyHistogram::bucket_floor(int index) {
  if (index < kSubBuckets) return index;
  const int octave = index / kSubBuckets - 1 + kSubBits;
  const int sub = index % kSubBuckets;
  return static_cast<int64_t>((uint64_t{kSubBuckets} + static_cast<uint64_t>(sub))
                              << (octave - kSubBits));
}

void LatencyHistogram::record(int64_t ns) {
  counts_[static_cast<size_t>(bucket_of(ns))].fetch_add(1, std::memory_order_relaxed);
}

uint64_t LatencyHistogram::count() const {
  uint64_t total = 0;
  for (const auto& c : counts_)
    total += c.load(std::memory_order_relaxed);
  return total;
}

double LatencyHistogram::percentile(double q) const {
  std::array<uint64_t, kBuckets> counts;
  uint64_t total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    counts[static_cast<size_t>(i)] =
        counts_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
    total += counts[static_cast<size_t>(i)];
  }
  if (total == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // The rank of the wanted duration, from 1.
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(q * static_cast<double>(total) + 0.999999));
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[static_cast<size_t>(i)];
    if (seen >= rank) {
      const double lo = static_cast<double>(bucket_floor(i));
      const double hi = i + 1 < kBuckets ? static_cast<double>(bucket_floor(i + 1)) : lo;
      return i < kSubBuckets ? lo : (lo + hi) / 2;
    }
  }
  return static_cast<double>(bucket_floor(kBuckets - 1));
}

namespace {

void append_table(std::string& out, const char* title, const std::vector<FunctionStats>& rows) {
  out += title;
  out += "\n";
  if (rows.empty()) {
    out += "  (none)\n";
    return;
  }
  size_t fw = 8;
  size_t pw = 4;
  for (const auto& r : rows) {
    fw = std::max(fw, r.function.size());
    pw = std::max(pw, r.peer.size());
  }
  char line[512];
  std::snprintf(line, sizeof(line), "  %-*s  %-*s  %10s  %8s  %14s  %14s  %12s  %12s\n",
                static_cast<int>(fw), "function", static_cast<int>(pw), "peer", "calls", "errors",
                "bytes_out", "bytes_in", "p50_us", "p99_us");
  out += line;
  for (const auto& r : rows) {
    std::snprintf(
        line, sizeof(line), "  %-*s  %-*s  %10llu  %8llu  %14llu  %14llu  %12.1f  %12.1f\n",
        static_cast<int>(fw), r.function.c_str(), static_cast<int>(pw), r.peer.c_str(),
        static_cast<unsigned long long>(r.calls), static_cast<unsigned long long>(r.errors),
        static_cast<unsigned long long>(r.bytes_out), static_cast<unsigned long long>(r.bytes_in),
        r.p50_us, r.p99_us);
    out += line;
  }
}

}  // namespace

std::string RpcStats::table() const {
  std::string out;
  append_table(out, "rpc calls made (latency: call to reply)", calls);
  append_table(out, "rpc calls served (latency: serving time)", served);
  return out;
}

namespace detail {

StatsTable::Entry& StatsTable::entry(std::string_view function, int peer_id,
                                     const std::string& peer_name) {
  MutexLock lock(mutex_);
  auto& by_function = entries_[peer_id];
  auto it = by_function.find(function);
  if (it == by_function.end()) {
    it = by_function
             .emplace(std::string(function),
                      std::make_unique<Entry>(std::string(function), peer_name))
             .first;
  }
  return *it->second;
}

std::vector<FunctionStats> StatsTable::snapshot() const {
  std::vector<FunctionStats> out;
  MutexLock lock(mutex_);
  for (const auto& [peer, by_function] : entries_) {
    for (const auto& [name, e] : by_function) {
      FunctionStats s;
      s.function = e->function;
      s.peer = e->peer;
      s.calls = e->calls.load(std::memory_order_acquire);
      s.errors = e->errors.load(std::memory_order_relaxed);
      s.bytes_out = e->bytes_out.load(std::memory_order_relaxed);
      s.bytes_in = e->bytes_in.load(std::memory_order_relaxed);
      s.p50_us = e->latency.percentile(0.5) / 1000.0;
      s.p99_us = e->latency.percentile(0.99) / 1000.0;
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const FunctionStats& a, const FunctionStats& b) {
    return a.function != b.function ? a.function < b.function : a.peer < b.peer;
  });
  return out;
}

}  // namespace detail
}  // namespace gradwire::rpc

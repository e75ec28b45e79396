// The store's TIME request and the clock offset a traced worker records from it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;

int64_t system_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Server and client share this host's clock: the server's reading lies between a reading
// taken before the request and one taken after its reply.
TEST(TCPStoreClock, TheServersTimeIsItsSystemClockAtTheRequest) {
  TCPStore store(TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  for (int i = 0; i < 3; ++i) {
    const int64_t before = system_ns();
    const int64_t server = store.server_time_ns();
    const int64_t after = system_ns();
    EXPECT_LE(before, server);
    EXPECT_LE(server, after);
  }
  // The store itself is unchanged by it.
  EXPECT_EQ(store.num_keys(), 0);
}

// The offset maps this process's steady clock onto the server's system clock: a steady
// reading plus the offset is the system clock now, off by at most half the kept round trip.
TEST(TCPStoreClock, AProbeKeepsItsShortestRoundTripAndItsOffsetMapsSteadyToTheStore) {
  TCPStore store(TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  const ClockProbe p = store.probe_clock(8);
  EXPECT_EQ(p.samples, 8);
  EXPECT_GT(p.rtt_ns, 0);
  EXPECT_EQ(p.address, "127.0.0.1:" + std::to_string(store.port()));
  const int64_t before = system_ns();
  const int64_t steady = trace::now_ns();
  const int64_t after = system_ns();
  const int64_t mapped = steady + p.offset_ns;
  EXPECT_GE(mapped, before - p.rtt_ns / 2 - 1);
  EXPECT_LE(mapped, after + p.rtt_ns / 2 + 1);
  EXPECT_THROW(store.probe_clock(0), InvalidArgument);
  EXPECT_THROW(store.probe_clock(1001), InvalidArgument);
}

TEST(TCPStoreClock, TracingRecordsTheOffsetOfTheStoreUnderAPrefixOnlyWhenEnabled) {
  auto tcp = std::make_shared<TCPStore>(
      TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  auto prefixed = std::make_shared<PrefixStore>("job", tcp);
  trace::stop();
  EXPECT_FALSE(record_trace_clock_offset(prefixed));
  trace::start();
  EXPECT_FALSE(record_trace_clock_offset(std::make_shared<HashStore>()));
  ASSERT_TRUE(record_trace_clock_offset(prefixed, 4));
  trace::stop();
  const auto j = nlohmann::json::parse(trace::metadata("clock_offset"));
  EXPECT_EQ(j["samples"], 4);
  EXPECT_EQ(j["store"], "127.0.0.1:" + std::to_string(tcp->port()));
  EXPECT_GT(j["rtt_ns"].get<int64_t>(), 0);
  EXPECT_TRUE(j["offset_ns"].is_number_integer());
  EXPECT_THROW(trace::set_metadata("clock_sync", "1"), InvalidArgument);
  EXPECT_THROW(trace::set_metadata("worker_id", "{not json"), InvalidArgument);
  EXPECT_THROW(trace::set_metadata("", "1"), InvalidArgument);
  trace::clear();
}

}  // namespace
}  // namespace gradwire::c10d

// Hostile connections against real agents over gradwire's tcp (TransportHostile): random
// bytes, huge lengths and half handshakes are refused or closed, and the listener serves on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;

TEST(TransportHostile, RandomBytesNeverStopTheListener) {
  Registry reg;
  register_basics(reg);
  Group g = start_group(2, options_for(reg));
  const auto w1 = published_address(*g.store, 1);
  ASSERT_NE(w1.second, 0);
  std::mt19937 rng(7);
  constexpr int kJunk = 40;
  for (int i = 0; i < kJunk; ++i) {
    const int fd = raw_connect(w1);
    // At least a hello's worth, so that the handshake sees it is garbage at once (shorter
    // junk waits for the handshake deadline: AHalfHandshake... covers that).
    std::string junk(static_cast<size_t>(transport::kHelloBytes + rng() % 4096), '\0');
    for (char& c : junk)
      c = static_cast<char>(rng());
    send_all(fd, junk);
    EXPECT_TRUE(closed_by_peer(fd)) << "junk connection " << i;
    ::close(fd);
  }
  // One that connects and leaves at once, another that leaves after its first bytes.
  ::close(raw_connect(w1));
  {
    const int fd = raw_connect(w1);
    send_all(fd, "GW");
    ::close(fd);
  }
  expect_serving(g);
  // A peer that was never seen before still gets in.
  EXPECT_EQ(
      g.agents[2 - 1]->rpc_sync<std::string>("w0", "concat", std::string("a"), std::string("b")),
      "ab");
  EXPECT_GE(g.agents[1]->metrics().connections_refused, static_cast<uint64_t>(kJunk));
  test::shutdown_agents(g.agents);
}

TEST(TransportHostile, HugeLengthsAreRefusedBeforeAnythingIsAllocated) {
  Registry reg;
  register_basics(reg);
  Group g = start_group(2, options_for(reg));
  const auto w1 = published_address(*g.store, 1);
  // 1. Right after a valid handshake, a first frame claiming 2^62 bytes.
  {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, ""));
    const uint64_t huge = uint64_t{1} << 62;
    send_all(fd, std::string(reinterpret_cast<const char*>(&huge), sizeof(huge)));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  // 2. A well-formed TensorPipe hello (of a worker of the group: without a secret, a claim
  //    the store's record backs is admitted), then a control frame claiming 2^62 bytes: the
  //    pipe is closed for it, the listener is untouched.
  {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, "", {"w0", 0, 0}));
    const uint64_t huge = uint64_t{1} << 62;
    send_all(fd, frame(tensorpipe_hello("w0")) +
                     std::string(reinterpret_cast<const char*>(&huge), sizeof(huge)));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
    EXPECT_GE(g.agents[1]->metrics().frames_refused, 1u);
  }
  // 3. A first frame that is not TensorPipe's hello; an empty one, and a hello cut short
  //    by a byte (TensorPipe's decoder would read past the end of those: fuzz_transport).
  for (const std::string& first : {std::string("definitely not a nop packet"), std::string(),
                                   tensorpipe_hello().substr(0, tensorpipe_hello().size() - 1)}) {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, ""));
    send_all(fd, frame(first));
    EXPECT_TRUE(closed_by_peer(fd)) << first.size() << " bytes";
    ::close(fd);
  }
  expect_serving(g);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, 4u);
  test::shutdown_agents(g.agents);
}

TEST(TransportHostile, AHalfHandshakeIsClosedAtTheDeadlineAndBlocksNobody) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.handshake_timeout = 300ms;
  Group g = start_group(2, options);
  const auto w1 = published_address(*g.store, 1);
  const int stalled = raw_connect(w1);
  send_all(stalled, "GWTP\x01");  // 5 of the hello's 40 bytes, then nothing
  const auto t0 = std::chrono::steady_clock::now();
  expect_serving(g);  // served while the stalled connection waits
  EXPECT_TRUE(closed_by_peer(stalled));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, 5s);
  ::close(stalled);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, 1u);
  test::shutdown_agents(g.agents);
}

}  // namespace
}  // namespace gradwire::rpc

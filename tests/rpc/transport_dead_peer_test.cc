// A peer killed outright (TransportDeadPeer): its pending calls fail within two seconds, over
// the local transport and over tcp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"
#include "support/harness.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;

TEST(TransportDeadPeer, APeerKilledWithSigkillFailsPendingCallsWithinTwoSeconds) {
  Registry reg;
  register_basics(reg);
  reg.def("kill_me", []() -> int64_t {
    ::kill(::getpid(), SIGKILL);
    return 0;
  });
  for (const std::vector<std::string>& transports :
       {std::vector<std::string>{"local", "tcp"}, std::vector<std::string>{"tcp"}}) {
    AgentOptions options = options_for(reg);
    options.transports = transports;
    options.rpc_timeout = 30s;
    const std::string label = transports.front();
    test::RankResults results = test::run_agent_processes(
        "transport-kill-" + label, 2, options, [&](int rank, c10d::Store& store, RpcAgent& agent) {
          if (rank == 1) {
            // Serves until "kill_me" ends the process; the wait only bounds a broken test.
            store.wait({"never"}, 30s);
            return;
          }
          EXPECT_EQ(agent.rpc_sync<std::string>("w1", "concat", std::string("a"), std::string("b")),
                    "ab");
          const auto t0 = std::chrono::steady_clock::now();
          Future<int64_t> killed = agent.rpc_async<int64_t>("w1", "kill_me");
          ASSERT_TRUE(killed.wait(20s));
          const auto waited = std::chrono::steady_clock::now() - t0;
          EXPECT_LT(waited, 2s) << label;
          std::string text;
          try {
            killed.value();
          } catch (const NetworkError& e) {
            text = e.what();
          }
          EXPECT_NE(text.find("worker 'w1'"), std::string::npos) << label << ": " << text;
          // A later call to it fails at once too, and this worker shuts down cleanly.
          EXPECT_THROW(
              agent.rpc_sync<std::string>("w1", "concat", std::string("a"), std::string("b")),
              NetworkError);
          agent.shutdown(false);
        });
    EXPECT_TRUE(results.ranks[0].ok) << label << ": " << results.summary();
    EXPECT_EQ(results.ranks[1].term_signal, SIGKILL) << label << ": " << results.summary();
  }
}

}  // namespace
}  // namespace gradwire::rpc

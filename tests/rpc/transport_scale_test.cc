// Many worker processes (TransportScale): sixty-four call each other all to all.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
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

TEST(TransportScale, SixtyFourWorkerProcessesCallEachOtherAllToAll) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.num_worker_threads = 2;
  options.channels = {"cma", "basic"};
  options.rpc_timeout = 60s;
  options.join_timeout = 60s;
  constexpr int kWorkers = 64;
  test::RankResults results = test::run_agent_processes(
      "transport-64", kWorkers, options, [&](int rank, c10d::Store&, RpcAgent& agent) {
        std::vector<Future<std::string>> calls;
        for (int to = 0; to < kWorkers; ++to) {
          if (to == rank) continue;
          calls.push_back(agent.rpc_async<std::string>(test::worker_name(to), "concat",
                                                       std::to_string(rank), std::string(">")));
        }
        for (auto& f : calls) {
          if (f.get(60s) != std::to_string(rank) + ">") throw std::runtime_error("wrong reply");
        }
        agent.shutdown();
      });
  EXPECT_PRED_FORMAT1(test::AllRanksOk, results);
}

}  // namespace
}  // namespace gradwire::rpc

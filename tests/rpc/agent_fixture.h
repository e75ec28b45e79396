// What the agent suites share (agent_*_test.cc, free_functions_test.cc): options for test
// agents, starting and shutting down agents that run as threads of this process or as two
// worker processes, a held registered function, the text of an expected error, the
// functions most tests register and the calling thread's name. Header-only.
//
// Thread-safety: call from the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/harness.h"
#include "support/sync.h"

namespace gradwire::rpc::agent_fixture {

using namespace std::chrono_literals;
using test::Agents;
using test::shutdown_all;  // returns each agent's error, "" for success
using test::start_agents;  // agents "w0" ... on one store (a fresh HashStore by default)
using test::worker_name;

// A registered function that reports when a call has started (`entered`) and returns
// `result` only once the test opens `release` (failing the test after 20 s).
struct HeldFunction {
  test::CountdownLatch entered{1};
  test::CountdownLatch release{1};

  void define(Registry& reg, const std::string& name, int64_t result) {
    reg.def(name, [this, result] {
      entered.count_down();
      EXPECT_TRUE(release.wait(20s));
      return result;
    });
  }
};

// test::agent_options with two lanes per pair of workers.
inline AgentOptions test_options(Registry& reg) {
  AgentOptions o = test::agent_options(reg);
  o.mpt_lanes = 2;
  return o;
}

// Direct copies read the lender's process as a local connection names it: the tests of
// lending run over the local transport whatever the suite's.
inline AgentOptions lending_options(Registry& reg) {
  AgentOptions o = test_options(reg);
  o.transports = {"local", "tcp"};
  return o;
}

// Graceful shutdown of every agent at once; each error is a test failure.
inline void expect_clean_shutdown(const Agents& agents) {
  test::shutdown_agents(agents);
}

using test::error_text;

inline void register_basics(Registry& reg) {
  reg.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  reg.def("scale", [](const Tensor& a, double k) { return mul(a, k); });
  reg.def("concat", [](const std::string& a, const std::string& b) { return a + b; });
  reg.def("sum_list", [](const std::vector<int64_t>& xs) {
    int64_t s = 0;
    for (int64_t x : xs)
      s += x;
    return s;
  });
  reg.def("fail", [](const std::string& why) -> int64_t { throw std::runtime_error(why); });
  reg.def("echo", [](const Tensor& t) { return t; });
  reg.def("nothing", [] {});
}

inline std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

// Runs `body` in two worker processes that meet through a FileStore in a fresh directory,
// each with an agent on `reg`.
inline test::RankResults run_two_worker_processes(
    const std::string& tag, Registry& reg,
    const std::function<void(int rank, c10d::Store& store, RpcAgent& agent)>& body,
    const std::function<AgentOptions(Registry&)>& options = test_options) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-rpc-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "store").string();
  test::RankResults results = test::run_ranks_as_processes(
      2,
      [&](int rank) {
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = 2, .timeout = 20s});
        auto agent = make_tensorpipe_agent(worker_name(rank), rank, 2, store, options(reg));
        body(rank, *store, *agent);
      },
      60s);
  std::filesystem::remove_all(dir);
  return results;
}

}  // namespace gradwire::rpc::agent_fixture

// What the agent suites share (agent_*_test.cc, free_functions_test.cc): options for test
// agents, starting and shutting down agents that run as threads of this process or as two
// worker processes, a held registered function, the text of an expected error, and the
// functions most tests register. Header-only.
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
#include "support/harness.h"
#include "support/sync.h"

namespace gradwire::rpc::agent_fixture {

using namespace std::chrono_literals;
using Agents = std::vector<std::shared_ptr<RpcAgent>>;

inline std::string worker_name(int rank) {
  return "w" + std::to_string(rank);
}

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

inline AgentOptions test_options(Registry& reg) {
  AgentOptions o;
  o.registry = &reg;
  o.rpc_timeout = 20s;
  o.join_timeout = 20s;
  o.num_worker_threads = 4;
  o.mpt_lanes = 2;
  o.transports = test::transports_under_test(o.transports);
  return o;
}

// Direct copies read the lender's process as a local connection names it: the tests of
// lending run over the local transport whatever the suite's.
inline AgentOptions lending_options(Registry& reg) {
  AgentOptions o = test_options(reg);
  o.transports = {"local", "tcp"};
  return o;
}

// Starts `n` agents on one store, concurrently (each waits for all).
inline Agents start_agents(
    int n, const AgentOptions& options,
    std::shared_ptr<c10d::Store> store = std::make_shared<c10d::HashStore>(20s)) {
  Agents agents(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[static_cast<size_t>(r)] =
            make_tensorpipe_agent(worker_name(r), r, n, store, options);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]);
    }
  }
  return agents;
}

// Graceful shutdown of every agent, concurrently; returns the errors, "" for success.
inline std::vector<std::string> shutdown_all(const Agents& agents) {
  std::vector<std::string> errors(agents.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < agents.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[r]->shutdown();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

inline void expect_clean_shutdown(const Agents& agents) {
  for (const std::string& e : shutdown_all(agents))
    EXPECT_EQ(e, "");
}

template <typename E, typename F>
inline std::string error_text(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "(no exception)";
}

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

// RpcAgent::stats() (per-function statistics) and the rpc spans of gradwire::trace, between
// two real agents.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/stats.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/scoped_env.h"
#include "support/temp_dir.h"

namespace gradwire::rpc {
namespace {

using gradwire::testing::eventually;

const FunctionStats* find(const std::vector<FunctionStats>& rows, const std::string& function,
                          const std::string& peer) {
  for (const auto& r : rows) {
    if (r.function == function && r.peer == peer) return &r;
  }
  return nullptr;
}

TEST(LatencyHistogram, BucketsAreContiguousAndPercentilesOrdered) {
  // Each bucket's floor is the first duration that falls in it, and floors increase.
  for (int i = 1; i < 400; ++i) {
    EXPECT_EQ(LatencyHistogram::bucket_of(LatencyHistogram::bucket_floor(i)), i) << i;
    EXPECT_EQ(LatencyHistogram::bucket_of(LatencyHistogram::bucket_floor(i) - 1), i - 1) << i;
  }
  LatencyHistogram h;
  EXPECT_EQ(h.percentile(0.5), 0.0);
  // 90 durations of 1000 ns and 10 of 1'000'000 ns: the p50 is near 1 us, the p99 near
  // 1 ms, each within a bucket's width (1/8).
  for (int i = 0; i < 90; ++i)
    h.record(1000);
  for (int i = 0; i < 10; ++i)
    h.record(1'000'000);
  EXPECT_EQ(h.count(), 100u);
  EXPECT_NEAR(h.percentile(0.5), 1000.0, 1000.0 / 8);
  EXPECT_NEAR(h.percentile(0.99), 1e6, 1e6 / 8);
  EXPECT_LE(h.percentile(0.5), h.percentile(0.99));
}

// The callee counts a request just after handing its reply over, so the caller may see the
// reply first: waits (10 s at most) until `agent` has served `n` calls of `function`.
void wait_for_served(RpcAgent& agent, const std::string& function, uint64_t n) {
  const bool served = eventually([&] {
    const RpcStats stats = agent.stats();
    const FunctionStats* s = find(stats.served, function, "w0");
    return s != nullptr && s->calls >= n;
  });
  if (served) return;
  FAIL() << "worker " << agent.worker_info().name << " did not serve " << n << " calls of '"
         << function << "' in 10 s:\n"
         << agent.stats().table();
}

class RpcStatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
    reg_.def("fail",
             [](int64_t n) -> int64_t { throw std::runtime_error("fail " + std::to_string(n)); });
    agents_ = test::start_agents(2, test::agent_options(reg_));
  }
  void TearDown() override { test::shutdown_agents(agents_); }

  Registry reg_;
  test::Agents agents_;
};

TEST_F(RpcStatsTest, CountsCallsErrorsBytesAndLatencyPerFunctionAndPeer) {
  constexpr int kAdds = 30;
  constexpr int kFails = 7;
  const Tensor a = ones({256});
  const Tensor b = ones({256});
  for (int i = 0; i < kAdds; ++i)
    agents_[0]->rpc_sync<Tensor>("w1", "add", a, b);
  for (int i = 0; i < kFails; ++i)
    EXPECT_THROW(agents_[0]->rpc_sync<int64_t>("w1", "fail", int64_t{i}), RemoteError);
  // An unknown function is refused before anything runs: counted as a failed call made,
  // and nothing is kept for it on the callee (peers cannot grow its table).
  EXPECT_THROW(agents_[0]->rpc_sync<int64_t>("w1", "no_such_function"), InvalidArgument);

  wait_for_served(*agents_[1], "add", kAdds);
  wait_for_served(*agents_[1], "fail", kFails);
  const RpcStats caller = agents_[0]->stats();
  const FunctionStats* adds = find(caller.calls, "add", "w1");
  ASSERT_NE(adds, nullptr) << caller.table();
  EXPECT_EQ(adds->calls, uint64_t{kAdds});
  EXPECT_EQ(adds->errors, 0u);
  // Two 1 KiB tensors out, one back, each call.
  EXPECT_GE(adds->bytes_out, uint64_t{kAdds} * 2 * 1024);
  EXPECT_GE(adds->bytes_in, uint64_t{kAdds} * 1024);
  EXPECT_GT(adds->p50_us, 0.0);
  EXPECT_LE(adds->p50_us, adds->p99_us);
  const FunctionStats* fails = find(caller.calls, "fail", "w1");
  ASSERT_NE(fails, nullptr) << caller.table();
  EXPECT_EQ(fails->calls, uint64_t{kFails});
  EXPECT_EQ(fails->errors, uint64_t{kFails});
  EXPECT_GT(fails->bytes_out, 0u);
  EXPECT_GT(fails->bytes_in, 0u);
  EXPECT_LE(fails->p50_us, fails->p99_us);
  const FunctionStats* unknown = find(caller.calls, "no_such_function", "w1");
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(unknown->errors, 1u);
  EXPECT_TRUE(caller.served.empty()) << caller.table();

  const RpcStats callee = agents_[1]->stats();
  EXPECT_TRUE(callee.calls.empty()) << callee.table();
  const FunctionStats* served_adds = find(callee.served, "add", "w0");
  ASSERT_NE(served_adds, nullptr) << callee.table();
  EXPECT_EQ(served_adds->calls, uint64_t{kAdds});
  EXPECT_EQ(served_adds->errors, 0u);
  EXPECT_GE(served_adds->bytes_in, uint64_t{kAdds} * 2 * 1024);
  EXPECT_GE(served_adds->bytes_out, uint64_t{kAdds} * 1024);
  EXPECT_LE(served_adds->p50_us, served_adds->p99_us);
  const FunctionStats* served_fails = find(callee.served, "fail", "w0");
  ASSERT_NE(served_fails, nullptr) << callee.table();
  EXPECT_EQ(served_fails->calls, uint64_t{kFails});
  EXPECT_EQ(served_fails->errors, uint64_t{kFails});
  EXPECT_EQ(find(callee.served, "no_such_function", "w0"), nullptr);

  // The printed table names every row.
  const std::string table = caller.table() + callee.table();
  for (const char* word : {"add", "fail", "w0", "w1", "p99_us"})
    EXPECT_NE(table.find(word), std::string::npos) << table;
}

TEST_F(RpcStatsTest, TracedCallsAreFollowedFromCallerToCalleeByRequestId) {
  namespace fs = std::filesystem;
  const test::TempDir tmp("gradwire-rpc-trace");
  const fs::path dir = tmp.path();
  trace::clear();
  constexpr int kCalls = 5;
  {
    trace::ScopedCapture capture(dir.string());
    for (int i = 0; i < kCalls; ++i)
      agents_[0]->rpc_sync<Tensor>("w1", "add", ones({4}), ones({4}));
    EXPECT_THROW(agents_[0]->rpc_sync<int64_t>("w1", "fail", int64_t{1}), RemoteError);
    // The callee records its spans just after handing the reply over.
    wait_for_served(*agents_[1], "add", kCalls);
    wait_for_served(*agents_[1], "fail", 1);
  }
  const std::string path = trace::flush();
  trace::clear();
  trace::set_directory("");
  std::ifstream in(path);
  const nlohmann::json file = nlohmann::json::parse(in);

  // Both agents live in this process: the caller's spans and the callee's are in one file.
  std::map<int64_t, nlohmann::json> calls;  // by request id
  std::map<int64_t, nlohmann::json> serves;
  std::set<int64_t> queued;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("cat") != "rpc") continue;
    // (rpc.connect and rpc.accept, the connections' set-up, carry no request id.)
    if (e.at("name") == "rpc.connect" || e.at("name") == "rpc.accept") continue;
    const auto& args = e.at("args");
    const int64_t id = args.at("request_id");
    // Ids are per caller: only w0's calls to w1 and w1's serving of them.
    if (e.at("name") == "rpc.call" && args.at("peer") == 1) calls[id] = e;
    if (e.at("name") == "rpc.serve" && args.at("peer") == 0) serves[id] = e;
    if (e.at("name") == "rpc.queue" && args.at("peer") == 0) queued.insert(id);
  }
  ASSERT_EQ(calls.size(), size_t{kCalls + 1}) << file.dump(1);
  int failed = 0;
  for (const auto& [id, call] : calls) {
    const auto& args = call.at("args");
    EXPECT_EQ(args.at("peer"), 1);
    EXPECT_GT(args.at("bytes_out").get<int64_t>(), 0);
    EXPECT_GT(args.at("bytes_in").get<int64_t>(), 0);
    EXPECT_EQ(args.at("outcome"), "replied");
    ASSERT_TRUE(serves.count(id)) << "no rpc.serve for request " << id;
    EXPECT_TRUE(queued.count(id)) << "no rpc.queue for request " << id;
    const auto& serve = serves.at(id);
    EXPECT_EQ(serve.at("args").at("function"), args.at("function"));
    EXPECT_EQ(serve.at("args").at("peer"), 0);
    // The serving lies within the call (one process: one clock).
    EXPECT_GE(serve.at("ts").get<double>(), call.at("ts").get<double>());
    EXPECT_LE(serve.at("ts").get<double>() + serve.at("dur").get<double>(),
              call.at("ts").get<double>() + call.at("dur").get<double>());
    if (args.at("function") == "fail") {
      ++failed;
      EXPECT_EQ(serve.at("args").at("error"), 1);
    } else {
      EXPECT_EQ(args.at("function"), "add");
      EXPECT_EQ(serve.at("args").at("error"), 0);
    }
  }
  EXPECT_EQ(failed, 1);
}

TEST(RpcStatsPrint, GradwireRpcStatsPrintsTheTablesAtShutdown) {
  namespace fs = std::filesystem;
  Registry reg;
  reg.def("echo", [](const std::string& s) { return s; });
  test::Agents agents;
  {
    // Read when each agent is made.
    const test::ScopedEnv env({{"GRADWIRE_RPC_STATS", "1"}});
    agents = test::start_agents(2, test::agent_options(reg));
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "echo", std::string("hi")), "hi");
  wait_for_served(*agents[1], "echo", 3);
  // What the agents print on stderr during the shutdown goes to a file.
  const fs::path out =
      fs::temp_directory_path() / ("gradwire-rpc-stats-" + std::to_string(::getpid()));
  const int saved = ::dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = ::open(out.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  std::cerr.flush();
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
  test::shutdown_agents(agents);
  std::cerr.flush();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::ifstream in(out);
  const std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(out);
  for (const char* word :
       {"rpc worker 'w0'", "rpc worker 'w1'", "rpc calls made", "rpc calls served", "echo"})
    EXPECT_NE(printed.find(word), std::string::npos) << word << " not in:\n" << printed;
}

}  // namespace
}  // namespace gradwire::rpc

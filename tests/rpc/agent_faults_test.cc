// The TensorPipe agent under faults (RpcAgentFaults): throwing reply callbacks, calls with no
// timeout, shutdown from a handler or after a failed shutdown, nested remote errors, a peer
// over its in-flight budget, and a peer lost during a graceful shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent_fixture.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/eventually.h"
#include "support/sync.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;
using gradwire::testing::eventually;

TEST(RpcAgentFaults, AThrowingReplyCallbackDoesNotHurtTheAgent) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  test::CountdownLatch called{1};
  Request request;
  request.handler = kCallHandler;
  request.function = "nothing";
  agents[0]->send_request("w1", request, CallOptions{}, [&](Value, std::exception_ptr) {
    called.count_down();
    throw std::runtime_error("a careless callback");
  });
  ASSERT_TRUE(called.wait(10s));
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{2}), 2);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentFaults, NoTimeoutAndTheFuturesOwnWaitBound) {
  Registry reg;
  register_basics(reg);
  HeldFunction hold;
  hold.define(reg, "hold", 3);
  AgentOptions options = test_options(reg);
  options.rpc_timeout = std::chrono::hours(2);
  Agents agents = start_agents(2, options);
  Future<int64_t> held =
      agents[0]->rpc_async<int64_t>("w1", "hold", CallOptions{.timeout = kNoTimeout});
  EXPECT_EQ(held.default_timeout(), kNoTimeout);
  // get() on a call under a 2 h rpc_timeout waits longer than kDefaultFutureTimeout.
  Future<int64_t> slow = agents[0]->rpc_async<int64_t>("w1", "sum_list", std::vector<int64_t>{1});
  EXPECT_EQ(slow.default_timeout(), std::chrono::hours(2) + 30s);
  EXPECT_EQ(slow.get(), 1);
  ASSERT_TRUE(hold.entered.wait(10s));
  hold.release.count_down();
  EXPECT_EQ(held.get(), 3);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentFaults, ShutdownFromAHandlerIsRefused) {
  Registry reg;
  reg.def("stop_yourself", [](const CallContext& ctx) { ctx.agent()->shutdown(); });
  Agents agents = start_agents(2, test_options(reg));
  const std::string text =
      error_text<RemoteError>([&] { agents[0]->rpc_sync<void>("w1", "stop_yourself"); });
  EXPECT_NE(text.find("shutdown() was called from a request this agent is serving"),
            std::string::npos)
      << text;
  EXPECT_FALSE(agents[1]->is_shut_down());
  expect_clean_shutdown(agents);
}

TEST(RpcAgentFaults, AfterAFailedShutdownCallsFailWithThatError) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = test_options(reg);
  options.join_timeout = 300ms;
  Agents agents = start_agents(2, options);
  // w1 never takes part: w0's graceful shutdown times out naming it.
  const std::string failed = error_text<TimeoutError>([&] { agents[0]->shutdown(); });
  EXPECT_NE(failed.find("workers that did not: ['w1' (rank 1)]"), std::string::npos) << failed;
  const std::string later = error_text<TimeoutError>(
      [&] { agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}); });
  EXPECT_EQ(later, failed);
  agents[1]->shutdown(false);
}

TEST(RpcAgentFaults, NestedErrorsNameTheWorkerTheyCameFrom) {
  Registry reg;
  register_basics(reg);
  reg.def("relay", [](const CallContext& ctx, const std::string& why) {
    return ctx.agent()->rpc_sync<int64_t>("w2", "fail", why);
  });
  Agents agents = start_agents(3, test_options(reg));
  try {
    agents[0]->rpc_sync<int64_t>("w1", "relay", std::string("deep trouble"));
    FAIL() << "expected a RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w2");  // where it was raised, not the relay
    EXPECT_NE(std::string(e.what()).find("deep trouble"), std::string::npos) << e.what();
  }
  expect_clean_shutdown(agents);
}

TEST(RpcAgentFaults, APeerOverItsInFlightBudgetIsRefused) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = test_options(reg);
  options.max_inflight_bytes_per_peer = 64 << 10;
  options.direct_copy_threads = 0;  // every tensor travels, none is lent
  Agents agents = start_agents(2, options);
  // 32 KiB travels beside the payload and fits; 128 KiB alone is over the budget.
  EXPECT_EQ(agents[0]->rpc_sync<Tensor>("w1", "echo", ones({8192})).numel(), 8192);
  // Refused with an error reply; the connection goes with it (the unread tensor data cannot
  // be skipped), and the caller may see that first.
  const std::string text =
      error_text<Error>([&] { agents[0]->rpc_sync<Tensor>("w1", "echo", ones({32768})); });
  EXPECT_TRUE(text.find("max_inflight_bytes_per_peer (65536 bytes)") != std::string::npos ||
              text.find("the connection to it was lost") != std::string::npos ||
              text.find("to worker 'w1' (rank 1) could not be sent") != std::string::npos)
      << text;
  // The agent carries on: a later call opens a new connection (one made before the sender
  // saw the old one close may still fail with it).
  int64_t echoed = 0;
  eventually([&] {
    try {
      echoed = agents[0]->rpc_sync<Tensor>("w1", "echo", ones({8192})).numel();
    } catch (const NetworkError&) {
      // Sent on the closing connection before its loss was seen: the next call reconnects.
    }
    return echoed != 0;
  });
  EXPECT_EQ(echoed, 8192);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentFaults, LosingAPeerWakesAGracefulShutdownWaitingOnItsCalls) {
  Registry reg;
  HeldFunction hold;
  hold.define(reg, "hold", 1);
  AgentOptions options = test_options(reg);
  // w1's close closes its connections first, then waits for its handler, released below
  // once w0 has seen the loss: no handler is left running past the test.
  options.close_timeout = 20s;
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents = start_agents(2, options, store);
  Future<int64_t> held = agents[0]->rpc_async<int64_t>("w1", "hold");
  ASSERT_TRUE(hold.entered.wait(10s));
  // w1 will not take part in the barriers (it is closed below): they are passed for it here,
  // so that all w0's shutdown waits for is its own call.
  store->set("rpc/1/shutdown/1/1", "1");
  store->set("rpc/1/shutdown/2/1", "1");
  std::string error = "(still running)";
  const auto t0 = std::chrono::steady_clock::now();
  std::thread closer([&] { error = error_text<Error>([&] { agents[0]->shutdown(); }); });
  ASSERT_TRUE(eventually([&] { return agents[0]->metrics().shutting_down; }));
  // The connection goes; w0's call fails with it.
  std::thread killer([&] { agents[1]->shutdown(false); });
  closer.join();
  // Woken by the loss, not by join_timeout (20 s).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(error, "(no exception)");
  const bool failed = held.wait(1s);
  hold.release.count_down();
  killer.join();
  ASSERT_TRUE(failed);
  EXPECT_THROW(held.value(), NetworkError);
}

}  // namespace
}  // namespace gradwire::rpc

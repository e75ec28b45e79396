// dist_autograd/ off the straight path: a pass ends with the error that ended it, at once
// and on every worker; it has its own deadline; a failed pass leaves no gradients behind;
// a released context stays released; a Context keeps its agent; only the workers a
// message concerns may send it. Faults come from the fault injector (rpc/fault_injection.h),
// and every wait is bounded: nothing here sleeps to let an event happen.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/fault_injection.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/proto_bytes.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rpc::CallContext;
using rpc::FaultAction;
using rpc::FaultInjector;
using rpc::MessageKind;
using rpc::Registry;
using rpc::RpcAgent;
namespace da = dist_autograd;

constexpr uint32_t kHandler = da::kDistAutogradHandler;

Tensor leaf(std::vector<double> values) {
  Tensor t = tensor(values);
  t.set_requires_grad(true);
  return t;
}

void expect_values(const Tensor& got, const std::vector<double>& want) {
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  Tensor c = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_DOUBLE_EQ(c.data<double>()[i], want[i]) << "element " << i;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of what `fn` throws (as an Error); fails the test when it throws nothing.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

class DistAutogradFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("square", [](const Tensor& x) { return mul(x, x); });
    // w1 -> w2: the backward pass sends gradients from w1 to w2.
    reg_.def("nested", [](const CallContext& ctx, const Tensor& x) {
      return add(ctx.agent()->rpc_sync<Tensor>("w2", "square", mul(x, 3.0)), x);
    });
    // x · W with this worker's W = [[1, 2], [3, 4], [5, 6]].
    reg_.def("project", [this](const CallContext& ctx, const Tensor& x) {
      return matmul(x.reshape({1, 3}), weights_.at(ctx.agent()->worker_info().id));
    });
    reg_.def("fails_in_backward", [](const Tensor& x) {
      Tensor y = mul(x, x);
      y.register_hook([](const Tensor&) -> Tensor { throw std::runtime_error("hook exploded"); });
      return y;
    });
    reg_.def("fails_once_in_backward", [this](const Tensor& x) {
      Tensor y = mul(x, x);
      y.register_hook([this](const Tensor& g) -> Tensor {
        if (!failed_once_.exchange(true)) throw std::runtime_error("hook exploded once");
        return g;
      });
      return y;
    });
    for (int r = 0; r < 3; ++r) {
      weights_[r] = tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, Shape{3, 2});
      weights_[r].set_requires_grad(true);
    }
    rpc::AgentOptions options = test::agent_options(reg_);
    options.rpc_timeout = rpc_timeout();
    options.faults = faults_;
    agents_ = test::start_agents(3, options);
  }
  void TearDown() override {
    faults_->clear();
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  virtual std::chrono::milliseconds rpc_timeout() const { return 10s; }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  Registry reg_;
  std::map<int, Tensor> weights_;
  std::atomic<bool> failed_once_{false};
  std::shared_ptr<FaultInjector> faults_ = std::make_shared<FaultInjector>();
  test::Agents agents_;
};

// w0 -> w1 -> w2; the gradients w1 sends back to w2 are lost with their connection. The
// sender watches that send: the pass ends at once with an error naming the receiver, not
// at the agents' rpc_timeout with a TimeoutError that names nothing.
TEST_F(DistAutogradFaults, GradientsThatCannotBeDeliveredEndThePassAtOnceNamingTheReceiver) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "nested", x);
  Future<void> cut = faults_->add({.action = FaultAction::kCut,
                                   .from = "w1",
                                   .to = "w2",
                                   .kind = MessageKind::kRequest,
                                   .handler = kHandler,
                                   .function = "propagate"});
  const auto start = Clock::now();
  try {
    da::backward(w(0), ctx.id(), {sum(y)});
    ADD_FAILURE() << "the pass succeeded without w2's part";
  } catch (const RemoteError& e) {
    // The cut is seen at both of its ends, and whichever account reaches w0 first is the
    // pass's error: w1's (its gradients did not reach w2, or, since gradients flow while
    // discovery goes on, its Discover to w2 was lost with the same connection) or w2's (it
    // lost w1, and with it the context w1 had brought it). Each names both ends of the link.
    EXPECT_EQ(e.remote_type(), "NetworkError") << e.what();
    if (e.worker() == "w1") {
      EXPECT_TRUE(contains(e.what(), "did not reach worker 'w2'") ||
                  contains(e.what(), "discover to worker 'w2'"))
          << e.what();
    } else {
      EXPECT_EQ(e.worker(), "w2") << e.what();
      EXPECT_TRUE(contains(e.what(), "lost worker 'w1'")) << e.what();
    }
  }
  EXPECT_LT(Clock::now() - start, 3s) << "the pass waited for the deadline";
  EXPECT_TRUE(cut.completed());
}

// Gradients the receiver refuses (here: of the wrong shape, which a hook on the sender
// made) end the pass at once with the receiver's error, without waiting for the
// receiver's part until rpc_timeout.
TEST_F(DistAutogradFaults, GradientsTheReceiverRefusesEndThePassWithItsError) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  y.register_hook([](const Tensor&) { return tensor(std::vector<double>{1, 2, 3, 4, 5}); });
  const auto start = Clock::now();
  try {
    da::backward(w(0), ctx.id(), {sum(y)});
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1") << e.what();
    EXPECT_EQ(e.remote_type(), "InvalidArgument") << e.what();
    EXPECT_TRUE(contains(e.what(), "did not reach worker 'w1'")) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 3s) << "the pass waited for the refused gradients";
  for (int r : {0, 1})
    EXPECT_THROW(da::get_gradients(w(r), ctx.id()), Error) << "worker " << r;
}

// A pass is bounded by BackwardOptions::timeout, not by the agents' rpc_timeout.
TEST_F(DistAutogradFaults, APassEndsAtItsOwnDeadline) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  // The gradients reach w1 long after the pass's deadline.
  faults_->add({.action = FaultAction::kDelay,
                .from = "w0",
                .to = "w1",
                .handler = kHandler,
                .function = "propagate",
                .delay = 2s});
  const auto start = Clock::now();
  const std::string what = error_of(
      [&] { da::backward(w(0), ctx.id(), {sum(y)}, da::BackwardOptions{.timeout = 300ms}); });
  const auto took = Clock::now() - start;
  EXPECT_TRUE(contains(what, "did not finish within 300 ms")) << what;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s);
  // Both workers know the pass failed.
  for (int r : {0, 1}) {
    const std::string text = error_of([&] { da::get_gradients(w(r), ctx.id()); });
    EXPECT_TRUE(contains(text, "did not finish within 300 ms")) << "worker " << r << ": " << text;
  }
  EXPECT_THROW(da::backward(w(0), ctx.id(), {sum(y)}, da::BackwardOptions{.timeout = 0ms}),
               InvalidArgument);
}

class DistAutogradShortRpcTimeout : public DistAutogradFaults {
 protected:
  std::chrono::milliseconds rpc_timeout() const override { return 400ms; }
};

// A pass may outlast rpc_timeout (a Wait that times out is asked again while the pass goes
// on). Here a node on w1 computes for three times the agents' rpc_timeout.
TEST_F(DistAutogradShortRpcTimeout, APassMayOutlastTheAgentsRpcTimeout) {
  reg_.def("slow_in_backward", [](const Tensor& x) {
    Tensor y = mul(x, x);
    y.register_hook([](const Tensor& g) {
      std::this_thread::sleep_for(1200ms);  // a node that computes for a while
      return g;
    });
    return y;
  });
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, -3.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "slow_in_backward", x);
  const auto start = Clock::now();
  da::backward(w(0), ctx.id(), {sum(mul(y, 2.0))}, da::BackwardOptions{.timeout = 20s});
  EXPECT_GE(Clock::now() - start, 1200ms);
  // d/dx sum(2 x^2) = 4x.
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {4.0, -12.0});
}

// A Release that is lost on its way is sent again, so the receiver does not keep the
// context for good (nothing else expires it). Here the first Release from w0 to
// w1, and the first from w1 on to w2, are dropped; the context still ends everywhere
// before its Context's end returns (a second attempt goes after a share of rpc_timeout).
// The contexts `agent` holds once they drop to none, or after 5 s (a Release sent again
// may still be on its way to the last worker of a chain when the Context has ended).
size_t contexts_left(RpcAgent& agent) {
  testing::eventually([&] { return da::num_contexts(agent) == 0; }, 5s);
  return da::num_contexts(agent);
}

TEST_F(DistAutogradShortRpcTimeout, ADroppedReleaseIsSentAgain) {
  Future<void> to_w1 = faults_->add({.action = FaultAction::kDrop,
                                     .from = "w0",
                                     .to = "w1",
                                     .kind = MessageKind::kRequest,
                                     .handler = kHandler,
                                     .function = "release"});
  Future<void> to_w2 = faults_->add({.action = FaultAction::kDrop,
                                     .from = "w1",
                                     .to = "w2",
                                     .kind = MessageKind::kRequest,
                                     .handler = kHandler,
                                     .function = "release"});
  const auto start = Clock::now();
  {
    da::Context ctx(w(0));
    (void)w(0).rpc_sync<Tensor>("w1", "nested", leaf({1.0, 2.0}));  // w0 -> w1 -> w2
    for (int r = 0; r < 3; ++r)
      ASSERT_EQ(da::num_contexts(w(r)), 1u) << "worker " << r;
  }
  EXPECT_LT(Clock::now() - start, rpc_timeout() + 1s) << "the release outlived rpc_timeout";
  EXPECT_TRUE(to_w1.wait(10s));
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(contexts_left(w(r)), 0u) << "worker " << r;
  EXPECT_TRUE(to_w2.completed());
}

// A Release whose answer is lost: the attempt sent again is answered once the first one's
// release (here: on to w2) is over, so an answer still means "gone everywhere from there"
// (release() waits for it; a Context's end does not).
TEST_F(DistAutogradShortRpcTimeout, AReleaseWhoseAnswerIsLostEndsEverywhere) {
  Future<void> reply = faults_->add({.action = FaultAction::kDrop,
                                     .from = "w1",
                                     .to = "w0",
                                     .kind = MessageKind::kReply,
                                     .handler = kHandler,
                                     .function = "release"});
  da::Context ctx(w(0));
  (void)w(0).rpc_sync<Tensor>("w1", "nested", leaf({1.0, 2.0}));
  da::release(w(0), ctx.id());
  EXPECT_TRUE(reply.completed());
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(da::num_contexts(w(r)), 0u) << "worker " << r;
}

// A Context's end releases the context here and sends its releases without waiting for the
// answers, so a step does not end with that round trip. Here every answer to a Release is
// lost (the fixture's rpc_timeout is 10 s, which an end waiting for them would wait out);
// the end returns all the same, and the workers the context reached have released it.
TEST_F(DistAutogradFaults, AContextsEndDoesNotWaitForTheAnswersToItsReleases) {
  faults_->add({.action = FaultAction::kDrop,
                .to = "w0",
                .kind = MessageKind::kReply,
                .handler = kHandler,
                .function = "release",
                .count = -1});
  const auto start = Clock::now();
  {
    da::Context ctx(w(0));
    (void)w(0).rpc_sync<Tensor>("w1", "nested", leaf({1.0, 2.0}));  // w0 -> w1 -> w2
    for (int r = 0; r < 3; ++r)
      ASSERT_EQ(da::num_contexts(w(r)), 1u) << "worker " << r;
  }
  EXPECT_LT(Clock::now() - start, rpc_timeout() / 2) << "the end waited for an answer";
  EXPECT_EQ(da::num_contexts(w(0)), 0u);
  for (int r = 1; r < 3; ++r)
    EXPECT_EQ(contexts_left(w(r)), 0u) << "worker " << r;
  // The release still going on w0 (sent again every quarter of rpc_timeout) is answered
  // once the answers travel again; the shutdown waits for it.
  faults_->clear();
}

class DistAutogradTwoSecondRpcTimeout : public DistAutogradFaults {
 protected:
  std::chrono::milliseconds rpc_timeout() const override { return 2s; }
};

// A pass that fails (here: at its deadline) waits for its aborts only as long as its
// deadline allows, not up to rpc_timeout (2 s here) for an abort that was dropped:
// backward ends soon after BackwardOptions::timeout.
TEST_F(DistAutogradTwoSecondRpcTimeout, AFailedPassDoesNotWaitPastItsDeadlineForItsAborts) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  faults_->add({.action = FaultAction::kDelay,
                .from = "w0",
                .to = "w1",
                .handler = kHandler,
                .function = "propagate",
                .delay = 2s});
  Future<void> dropped = faults_->add({.action = FaultAction::kDrop,
                                       .from = "w0",
                                       .to = "w1",
                                       .kind = MessageKind::kRequest,
                                       .handler = kHandler,
                                       .function = "abort"});
  const auto start = Clock::now();
  const std::string what = error_of(
      [&] { da::backward(w(0), ctx.id(), {sum(y)}, da::BackwardOptions{.timeout = 300ms}); });
  const auto took = Clock::now() - start;
  EXPECT_TRUE(contains(what, "did not finish within 300 ms")) << what;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1s) << "backward waited past its deadline for the dropped abort";
  EXPECT_TRUE(dropped.completed());
  // The initiator knows the pass failed.
  EXPECT_TRUE(contains(error_of([&] { da::get_gradients(w(0), ctx.id()); }),
                       "did not finish within 300 ms"));
}

// A lost connection ends a pass with a NetworkError naming the worker lost, not with a plain
// Error saying the context was released. w1 took part in the context (it called w2) but not
// in the pass; while w2 runs its part, the connection between w0 and w1 is cut: w1 sees w0
// lost and releases w0's context, and tells w2, which tells w0, whose pass fails with that.
TEST_F(DistAutogradFaults, APassEndedByALostConnectionGivesANetworkErrorNamingTheLostWorker) {
  reg_.def("ping", [] { return 1; });
  // Shared with w2's hook, which may still be returning from its wait when the test ends.
  auto gate = std::make_shared<Future<void>>();
  auto entered = std::make_shared<std::atomic<bool>>(false);
  reg_.def("waits_in_backward", [this, gate, entered](const Tensor& x) {
    Tensor y = mul(x, x);
    y.register_hook([this, gate, entered](const Tensor& g) {
      if (!entered->exchange(true)) {
        // w2 runs its part: the connection between w0 and w1 goes now.
        (void)w(0).rpc_async<int>("w1", "ping");
      }
      (void)gate->wait(5s);  // bounded: the test opens the gate once backward returns
      return g;
    });
    return y;
  });
  Future<void> cut = faults_->add({.action = FaultAction::kCut,
                                   .from = "w0",
                                   .to = "w1",
                                   .kind = MessageKind::kRequest,
                                   .function = "ping"});
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  (void)w(0).rpc_sync<Tensor>("w1", "nested", x);  // w1 and w2 in the context, not in the pass
  Tensor y = w(0).rpc_sync<Tensor>("w2", "waits_in_backward", x);
  const auto start = Clock::now();
  try {
    da::backward(w(0), ctx.id(), {sum(y)});
    ADD_FAILURE() << "the pass succeeded";
  } catch (const RemoteError& e) {
    // w2's part failed first, and its Wait told w0 why.
    EXPECT_EQ(e.worker(), "w2") << e.what();
    EXPECT_EQ(e.remote_type(), "NetworkError") << e.what();
    EXPECT_TRUE(contains(e.what(), "lost worker 'w0'")) << e.what();
  } catch (const NetworkError& e) {
    EXPECT_TRUE(contains(e.what(), "worker 'w1' (rank 1) lost worker 'w0'")) << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "not a NetworkError: " << e.what();
  }
  gate->try_set_value();
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_TRUE(cut.completed());
}

// The initiator's Wait goes out as soon as discovery ends, from the thread that takes its
// last answer, while the initiator's own nodes may still run: here one of them blocks until
// the Wait to w1 has been sent. (When the Wait went out only after the initiator's thread
// came back to it, this pass waited for its hook, and the hook for it, until the hook
// gave up.)
TEST_F(DistAutogradFaults, TheWaitGoesOutWhenDiscoveryEndsWhileTheInitiatorsNodesStillRun) {
  Future<void> wait_sent = faults_->add({.action = FaultAction::kDelay,
                                         .from = "w0",
                                         .to = "w1",
                                         .kind = MessageKind::kRequest,
                                         .handler = kHandler,
                                         .function = "wait",
                                         .delay = 0ms});
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, -3.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  Tensor local = mul(x, 2.0);  // below the root only: runs on the initiator's thread at once
  local.register_hook([wait_sent](const Tensor& g) {
    if (!wait_sent.wait(5s)) throw std::runtime_error("no Wait went out while this node ran");
    return g;
  });
  da::backward(w(0), ctx.id(), {add(sum(y), sum(local))}, da::BackwardOptions{.timeout = 20s});
  EXPECT_TRUE(wait_sent.completed());
  // d/dx sum(x^2 + 2x) = 2x + 2.
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {4.0, -4.0});
}

// A failed pass leaves nothing for an optimizer: every worker it reached takes back what it
// had given, and says why it holds no gradients until a pass succeeds there. A pass that
// then succeeds in the same context gives exactly its own gradients.
TEST_F(DistAutogradFaults, AFailedPassLeavesNoGradientsUntilAPassSucceeds) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0, 3.0});
  Tensor p = w(0).rpc_sync<Tensor>("w1", "project", x);                 // W1 gets a gradient
  Tensor q = w(0).rpc_sync<Tensor>("w2", "fails_once_in_backward", x);  // fails the first pass
  Tensor loss = add(sum(p), sum(q));
  try {
    da::backward(w(0), ctx.id(), {loss}, da::BackwardOptions{.retain_graph = true});
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w2");
    EXPECT_TRUE(contains(e.remote_message(), "hook exploded once")) << e.what();
  }
  for (int r = 0; r < 3; ++r) {
    const std::string text = error_of([&] { da::get_gradients(w(r), ctx.id()); });
    EXPECT_TRUE(contains(text, "last backward pass")) << "worker " << r << ": " << text;
    EXPECT_TRUE(contains(text, "hook exploded once")) << "worker " << r << ": " << text;
  }
  // The same graph again: this pass succeeds, and W1's gradient is one pass's, x^T 1.
  da::backward(w(0), ctx.id(), {loss});
  expect_values(da::get_gradients(w(1), ctx.id()).at(weights_.at(1)), {1, 1, 2, 2, 3, 3});
  // d/dx (sum(x W) + sum(x^2)) = W 1 + 2x.
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {3 + 2.0, 7 + 4.0, 11 + 6.0});
  EXPECT_EQ(da::get_gradients(w(2), ctx.id()).size(), 0u);
}

// A Context holds its agent: the agent's last other owner letting it go (as rpc::shutdown()
// does with the default agent) cannot free it under the context, whose end still runs.
TEST(DistAutogradAgent, AContextKeepsItsAgentAlive) {
  Registry reg;
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  auto ctx = std::make_unique<da::Context>(*agents[1]);
  std::weak_ptr<RpcAgent> weak = agents[1];
  agents[1]->shutdown(false);
  agents[1].reset();
  EXPECT_FALSE(weak.expired()) << "the context's agent was freed under it";
  ctx.reset();
  EXPECT_EQ(da::current_context_id(), 0u);
  agents[0]->shutdown(false);
}

// dist_autograd's messages, encoded by hand as a confused or forging member would send them.
std::string message(uint32_t op, const std::vector<std::pair<uint32_t, uint64_t>>& fields) {
  return test::proto_bytes::oneof_message(op, fields);
}
constexpr uint32_t kDiscover = 1, kPropagate = 2, kWait = 3, kAbort = 5;

// Sends `payload` to dist_autograd's handler on `to`; the refusal's text, or "(accepted)".
std::string send_raw(RpcAgent& from, const std::string& to, const std::string& payload) {
  rpc::Request request;
  request.handler = kHandler;
  request.function = "raw";
  request.payload.assign(payload.begin(), payload.end());
  try {
    from.send(to, std::move(request)).get(10s);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// A worker that takes part in a context may still not feed gradients into, or discover,
// a send that went to another worker; nor may an outsider abort a pass in it.
TEST_F(DistAutogradFaults, OnlyTheWorkerASendWentToMayDiscoverOrFeedIt) {
  da::Context ctx(w(0));
  const uint64_t id = ctx.id();
  Tensor x = leaf({2.0});
  // The request's send is the next id w0 mints after the context's.
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  const uint64_t send_to_w1 = id + 1;
  (void)w(0).rpc_sync<Tensor>("w2", "square", tensor(std::vector<double>{1.0}));  // w2 joins
  for (const auto& [payload, what] : std::vector<std::pair<std::string, std::string>>{
           {message(kPropagate, {{1, id}, {2, id + 100}, {3, send_to_w1}}), "gradient"},
           {message(kDiscover, {{1, id}, {2, id + 100}, {3, send_to_w1}}), "discovery"}}) {
    const std::string text = send_raw(w(2), "w0", payload);
    EXPECT_TRUE(contains(text, "refused a " + what + " for send")) << text;
    EXPECT_TRUE(contains(text, "from worker 'w2' (rank 2), which the send did not go to")) << text;
  }
  // An abort from a worker that never heard of the context.
  da::Context other(w(1));
  const std::string text =
      send_raw(w(2), "w1", message(kAbort, {{1, other.id()}, {2, other.id() + 1}}));
  EXPECT_TRUE(contains(text, "which takes no part in it")) << text;
  // Nothing was disturbed: the real pass is exact (d/dx sum(x^2) = 2x).
  da::backward(w(0), id, {sum(y)});
  expect_values(da::get_gradients(w(0), id).at(x), {4.0});
}

// Gradients flow while discovery goes on. Here w1's answer to w0's Discover (which names
// x's send back to w0) is held up for 2.5 s: w0 has already sent y's gradient, w1 runs its
// part at once (its hook fires long before the answer arrives), and the gradient w1 sends on
// waits at w0 until the answer names its send. The pass is exact, and gradients move before
// every worker has been discovered.
TEST_F(DistAutogradFaults, GradientsFlowWhileDiscoveryGoesOnAndWaitForTheirDiscover) {
  auto ran = std::make_shared<Future<void>>();
  reg_.def("square_noted", [ran](const Tensor& x) {
    Tensor y = mul(x, x);
    y.register_hook([ran](const Tensor& g) {
      ran->try_set_value();
      return g;
    });
    return y;
  });
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, -2.0, 3.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square_noted", x);
  faults_->add({.action = FaultAction::kDelay,
                .from = "w1",
                .to = "w0",
                .handler = kHandler,
                .function = "discover",
                .delay = 2500ms});
  const auto start = Clock::now();
  std::thread pass([&] { da::backward(w(0), ctx.id(), {sum(y)}); });
  const bool early = ran->wait(2000ms);
  pass.join();
  EXPECT_TRUE(early) << "w1's part waited for discovery to end";
  EXPECT_GE(Clock::now() - start, 2500ms) << "the pass ended before w0 was discovered";
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {2.0, -4.0, 6.0});  // 2x
}

// A worker's sends that a Discover's receiver reaches come back in its answer, not in a
// Discover of their own: w0 -> w1 -> w2 ("nested"), where w2's part leads back to w1's send
// and w1's part back to w0's. No Discover request goes from w2 to w1 or from w1 to w0 (rules
// that would drop one never fire), and the pass is exact.
TEST_F(DistAutogradFaults, SendsOfTheCallerComeBackInTheAnswerToItsDiscover) {
  std::vector<Future<void>> never;
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"w2", "w1"}, {"w1", "w0"}}) {
    never.push_back(faults_->add({.action = FaultAction::kDrop,
                                  .from = from,
                                  .to = to,
                                  .kind = rpc::MessageKind::kRequest,
                                  .handler = kHandler,
                                  .function = "discover",
                                  .count = -1}));
  }
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, -2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "nested", x);  // 9 x^2 + x
  da::backward(w(0), ctx.id(), {sum(y)});
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {19.0, -35.0});  // 18 x + 1
  EXPECT_EQ(faults_->fired(), 0u) << "a Discover was sent back to the worker that asked";
  // A second pass over a kept graph takes the same way.
  da::Context again(w(0));
  Tensor x2 = leaf({0.5});
  Tensor y2 = w(0).rpc_sync<Tensor>("w1", "nested", x2);
  da::backward(w(0), again.id(), {sum(y2)});
  expect_values(da::get_gradients(w(0), again.id()).at(x2), {10.0});
  EXPECT_EQ(faults_->fired(), 0u);
}

// A send named twice in one pass (in one Discover, or again after a Discover named it) is
// refused before the worker takes part: counted twice, it would wait for a gradient that
// never comes.
TEST_F(DistAutogradFaults, ASendNamedTwiceInAPassIsRefused) {
  da::Context ctx(w(0));
  const uint64_t id = ctx.id();
  Tensor x = leaf({2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  const uint64_t send_to_w1 = id + 1;
  const std::string text = send_raw(
      w(1), "w0", message(kDiscover, {{1, id}, {2, id + 100}, {3, send_to_w1}, {3, send_to_w1}}));
  EXPECT_TRUE(contains(text, "refused send")) << text;
  EXPECT_TRUE(contains(text, "named again by worker 'w1' (rank 1)")) << text;
  da::backward(w(0), id, {sum(y)});
  expect_values(da::get_gradients(w(0), id).at(x), {4.0});
}

// Rewrites w1's answers to Discovers with a value the test chooses (none: untouched), as a
// confused or forging member would answer.
class ForgeDiscoverAnswers : public rpc::Interceptor {
 public:
  void forge(std::optional<rpc::Value> answer) {
    std::lock_guard<std::mutex> lock(mutex_);
    answer_ = std::move(answer);
  }
  void on_outgoing_response(const rpc::WorkerInfo&, const rpc::Request& request,
                            rpc::Response& response) override {
    if (request.handler != kHandler || request.function != "discover") return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (answer_) response.result = *answer_;
  }

 private:
  std::mutex mutex_;
  std::optional<rpc::Value> answer_;
};

// A Discover's answer that is not two lists of ints, or that names back a send that did not
// go to the answering worker, fails the pass with an error naming that worker and what was
// wrong; a pass afterwards is exact.
TEST_F(DistAutogradFaults, AMalformedOrForgedDiscoverAnswerFailsThePassNamingTheWorker) {
  auto forger = std::make_shared<ForgeDiscoverAnswers>();
  w(1).add_interceptor(forger);
  using rpc::Value;
  auto ints = [](std::vector<int64_t> v) {
    Value::List items(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      items[i] = Value(v[i]);
    return Value::list(std::move(items));
  };
  auto pair = [](Value a, Value b) {
    Value::List items(2);
    items[0] = std::move(a);
    items[1] = std::move(b);
    return Value::list(std::move(items));
  };
  Value::List text_id(1);
  text_id[0] = Value("7");
  struct Case {
    std::function<Value(uint64_t send_to_w2)> answer;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[&](uint64_t) {
         return ints({0, 1});
       },
       "expected a list of two lists"},
      {[&](uint64_t) { return pair(ints({-1}), ints({})); }, "a worker id that is not an int"},
      {[&](uint64_t) { return pair(ints({1}), Value::list(text_id)); },
       "a send id that is not an int"},
      {[&](uint64_t send_to_w2) {
         return pair(ints({1}), ints({static_cast<int64_t>(send_to_w2)}));
       },
       "from worker 'w1' (rank 1), which the send did not go to"}};
  for (const Case& c : cases) {
    da::Context ctx(w(0));
    Tensor x = leaf({2.0});
    Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
    // The next id w0 mints after the request to w1 is its request to w2's send.
    Tensor z = w(0).rpc_sync<Tensor>("w2", "square", x);
    const uint64_t send_to_w2 = ctx.id() + 2;
    forger->forge(c.answer(send_to_w2));
    const std::string text = error_of([&] { da::backward(w(0), ctx.id(), {sum(add(y, z))}); });
    EXPECT_TRUE(contains(text, c.says)) << text;
    if (c.says.find("did not go to") == std::string::npos) {
      EXPECT_TRUE(contains(text, "malformed answer to its Discover from worker 'w1' (rank 1)"))
          << text;
    }
    forger->forge(std::nullopt);
  }
  da::Context ctx(w(0));
  Tensor x = leaf({2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  da::backward(w(0), ctx.id(), {sum(y)});
  expect_values(da::get_gradients(w(0), ctx.id()).at(x), {4.0});
}

// Gradients that come ahead of their Discover are kept, within a bound, until it comes; a
// member that sends gradients for a pass that never reaches the worker gets them refused when
// the context ends, at the latest, and gradients for a pass the worker is past are refused at
// once. None of it disturbs a real pass.
TEST_F(DistAutogradFaults, EarlyGradientsAreBoundedAndRefusedWhenTheirPassCannotCome) {
  da::Context ctx(w(0));
  const uint64_t id = ctx.id();
  Tensor x = leaf({2.0});
  Tensor y = w(0).rpc_sync<Tensor>("w1", "square", x);
  const uint64_t send_to_w1 = id + 1;  // the request's send: w0's next id after the context's
  auto propagate = [&](uint64_t pass) {
    rpc::Request request;
    request.handler = kHandler;
    request.function = "raw";
    const std::string payload = message(kPropagate, {{1, id}, {2, pass}, {3, send_to_w1}});
    request.payload.assign(payload.begin(), payload.end());
    request.args = {rpc::Value(tensor(std::vector<double>{1.0}))};
    return w(1).send("w0", std::move(request));
  };
  // A pass w0 has not started (ids w0 would mint later): kept, up to the bound. Of 257 sent
  // at once (served in any order), one is refused and the rest wait.
  std::vector<Future<rpc::Value>> sent;
  Future<void> first_answer;
  for (uint64_t i = 0; i < 257; ++i) {
    sent.push_back(propagate(id + 1000 + i));
    gradwire::detail::on_complete_inline(
        sent.back(),
        [first_answer](const Future<rpc::Value>&) mutable { first_answer.try_set_value(); });
  }
  ASSERT_TRUE(first_answer.wait(10s));
  std::vector<Future<rpc::Value>> kept;
  for (auto& f : sent) {
    if (!f.completed()) {
      kept.push_back(f);
      continue;
    }
    const std::string over_bound = error_of([&] { f.get(0ms); });
    EXPECT_TRUE(contains(over_bound,
                         "already holds 256 gradients that came ahead of their "
                         "discovery"))
        << over_bound;
  }
  EXPECT_EQ(kept.size(), 256u);
  // A real pass goes through meanwhile, exact (d/dx x^2 = 2x).
  da::backward(w(0), id, {sum(y)});
  expect_values(da::get_gradients(w(0), id).at(x), {4.0});
  // A pass older than one w0 has run: past, refused at once.
  const std::string past = error_of([&] { propagate(id + 2).get(10s); });
  EXPECT_TRUE(contains(past, "expects no gradients for send")) << past;
  EXPECT_TRUE(contains(past, "(over)")) << past;
  // The context ends: what was kept is refused, naming the release.
  da::release(w(0), id);
  for (auto& f : kept) {
    const std::string text = error_of([&] { f.get(10s); });
    EXPECT_TRUE(contains(text, "was released on worker 'w0'")) << text;
  }
}

// A request whose context its creator released while the request was on its way (here:
// dropped, then replayed by hand as it would arrive late) is refused on a worker that never
// held the context: made there, nothing would ever release it.
TEST_F(DistAutogradFaults, AContextReleasedBeforeItsFirstRequestArrivesIsNeverMade) {
  uint64_t id = 0;
  {
    da::Context ctx(w(0));
    id = ctx.id();
    faults_->add({.action = FaultAction::kDrop, .from = "w0", .to = "w1", .function = "square"});
    Future<Tensor> lost =
        w(0).rpc_async<Tensor>("w1", "square", rpc::CallOptions{.timeout = 100ms}, leaf({3.0}));
    EXPECT_THROW(lost.get(10s), TimeoutError);
    EXPECT_EQ(da::num_contexts(w(1)), 0u);
    // The Context's end would not wait for its Release to reach w1; this does, so that the
    // request below arrives late, as the case is about.
    da::release(w(0), id);
  }
  rpc::Request late;
  late.function = "square";
  late.args = {rpc::Value(tensor(std::vector<double>{3.0}))};
  late.autograd_context_id = id;
  const std::string text = error_of([&] { w(0).send("w1", std::move(late)).get(10s); });
  EXPECT_TRUE(contains(text, "already released context")) << text;
  EXPECT_EQ(da::num_contexts(w(1)), 0u);
  // dist_autograd's own late messages in it make nothing either.
  for (const std::string& payload :
       {message(kDiscover, {{1, id}, {2, id + 9}, {3, id + 1}}),
        message(kPropagate, {{1, id}, {2, id + 9}, {3, id + 1}}),
        message(kWait, {{1, id}, {2, id + 9}}), message(kAbort, {{1, id}, {2, id + 9}})}) {
    (void)send_raw(w(0), "w1", payload);
    EXPECT_EQ(da::num_contexts(w(1)), 0u);
  }
}

// A context that a worker released because it lost the worker that brought it there is
// not "unknown" to its creator afterwards: a request in it from the creator (a Wait, as from
// a pass already running when the link went) hears why, as a NetworkError naming the lost
// worker, rather than "has no context (unknown, or already released)" as the pass's
// error.
TEST_F(DistAutogradFaults, ARequestInAContextReleasedForALostWorkerHearsWhy) {
  reg_.def("ping", [] { return 1; });
  Future<void> cut = faults_->add({.action = FaultAction::kCut,
                                   .from = "w1",
                                   .to = "w2",
                                   .kind = MessageKind::kRequest,
                                   .function = "ping"});
  da::Context ctx(w(0));
  (void)w(0).rpc_sync<Tensor>("w1", "nested", leaf({1.0, 2.0}));  // w0 -> w1 -> w2
  ASSERT_EQ(da::num_contexts(w(2)), 1u);
  (void)w(1).rpc_async<int>("w2", "ping");  // the connection between w1 and w2 goes
  ASSERT_EQ(contexts_left(w(2)), 0u) << "w2 kept the context it had through w1";
  EXPECT_TRUE(cut.completed());
  const std::string told = send_raw(w(0), "w2", message(kWait, {{1, ctx.id()}, {2, ctx.id() + 9}}));
  EXPECT_TRUE(contains(told, "NetworkError")) << told;
  EXPECT_TRUE(contains(told,
                       "was released on worker 'w2' (rank 2): worker 'w2' (rank 2) lost "
                       "worker 'w1' (rank 1)"))
      << told;
}

}  // namespace
}  // namespace gradwire

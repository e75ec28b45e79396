// dist_autograd/: backward passes across remote calls among three workers (threads of one
// process, and processes for a worker killed mid-pass). Every gradient is checked against
// its closed form, worked out by hand in the comment beside it (float64, 1e-10): never
// against gradients from gradwire's own engine.
#include "gradwire/dist_autograd/dist_autograd.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/autograd/variable.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/harness.h"
#include "support/sync.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using rpc::CallContext;
using rpc::Registry;
using rpc::RpcAgent;
namespace da = dist_autograd;

Tensor leaf(std::vector<double> values) {
  Tensor t = tensor(values);
  t.set_requires_grad(true);
  return t;
}

void expect_near(const Tensor& got, const Tensor& want, double tol = 1e-10) {
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.sizes(), want.sizes());
  Tensor a = got.contiguous(), b = want.contiguous();
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_NEAR(a.data<double>()[i], b.data<double>()[i], tol) << "element " << i;
}

// f(x) elementwise, as a tensor: the closed form of a gradient.
Tensor closed_form(const std::vector<double>& x0, const std::function<double(double)>& f) {
  std::vector<double> out;
  for (double v : x0)
    out.push_back(f(v));
  return tensor(out);
}

Tensor sq(const Tensor& x) {
  return mul(x, x);
}

// A parameter that lives on one worker: [[1, 2], [3, 4], [5, 6]] (3x2).
Tensor make_weight() {
  Tensor w = tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, Shape{3, 2});
  w.set_requires_grad(true);
  return w;
}

class DistAutograd : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 3; ++r)
      weights_[r] = make_weight();
    reg_.def("square", [](const Tensor& x) { return sq(x); });
    reg_.def("project", [this](const CallContext& ctx, const Tensor& x) {
      return matmul(x.reshape({1, 3}), weights_.at(ctx.agent()->worker_info().id));
    });
    // w1 -> w2: a nested call inside the context.
    reg_.def("nested", [](const CallContext& ctx, const Tensor& x) {
      Tensor y = ctx.agent()->rpc_sync<Tensor>("w2", "square", mul(x, 3.0));
      return add(y, x);
    });
    // A -> B -> C -> A.
    reg_.def("ring", [](const CallContext& ctx, const Tensor& x) {
      return mul(ctx.agent()->rpc_sync<Tensor>("w2", "ring2", x), 2.0);
    });
    reg_.def("ring2", [](const CallContext& ctx, const Tensor& x) {
      return add(ctx.agent()->rpc_sync<Tensor>("w0", "square", x), x);
    });
    reg_.def("fails_in_backward", [](const Tensor& x) {
      Tensor y = sq(x);
      y.register_hook([](const Tensor&) -> Tensor { throw std::runtime_error("hook exploded"); });
      return y;
    });
    agents_ = test::start_agents(3, test::agent_options(reg_));
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  Registry reg_;
  std::map<int, Tensor> weights_;
  test::Agents agents_;
};

TEST_F(DistAutograd, ChainThroughARemoteCall) {
  const std::vector<double> x0{1.0, -2.0, 0.5};
  // d/dx sum(2 x^2) = 4x.
  Tensor want = closed_form(x0, [](double v) { return 4 * v; });
  da::Context ctx(w(0));
  EXPECT_EQ(da::current_context_id(), ctx.id());
  Tensor x = leaf(x0);
  da::backward(w(0), ctx.id(), {sum(mul(w(0).rpc_sync<Tensor>("w1", "square", x), 2.0))});
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), want);
  EXPECT_FALSE(x.grad().defined()) << "dist_autograd never writes .grad";
}

TEST_F(DistAutograd, ParametersOnTheRemoteWorkerGetTheirGradientsThere) {
  const std::vector<double> x0{1.0, 2.0, 3.0};
  da::Context ctx(w(0));
  Tensor x = leaf(x0);
  Tensor y = w(0).rpc_sync<Tensor>("w1", "project", x);  // 1x2 = x · W
  da::backward(w(0), ctx.id(), {sum(y)});
  // d/dx sum(x W) = W 1 (row sums), d/dW = x^T 1.
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), tensor(std::vector<double>{3, 7, 11}));
  Tensor gw = da::get_gradients(w(1), ctx.id()).at(weights_.at(1));
  expect_near(gw, tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, Shape{3, 2}));
  EXPECT_FALSE(da::get_gradients(w(1), ctx.id()).contains(weights_.at(2)));
}

// BackwardOptions::on_last_part names, once, the worker whose part is the only one left
// (here w1's: w0's part ends when it has sent w1 the gradient of y, x needing none), and a
// request sent from there may wait on w1 for that part's end (part_done). Only the pass's
// initiator may ask, and only for a pass the worker takes part in. A pass whose other part
// fails, or that has no other part, calls nothing.
TEST_F(DistAutograd, TheLastPartIsNamedOnceAndItsEndMayBeAwaitedThere) {
  reg_.def("wait_part", [](const CallContext& ctx, uint64_t context_id, uint64_t pass_id) {
    return da::part_done(ctx, context_id, pass_id);
  });
  struct Seen {
    std::mutex mutex;
    int calls = 0;
    uint64_t pass_id = 0;
    std::string worker;
    std::optional<Future<void>> waited;
    Future<void> called;
  };
  auto seen = std::make_shared<Seen>();
  da::BackwardOptions options;
  RpcAgent* w0 = &w(0);
  da::Context ctx(w(0));
  options.on_last_part = [seen, w0, id = ctx.id()](uint64_t pass_id, const rpc::WorkerInfo& last) {
    std::lock_guard<std::mutex> lock(seen->mutex);
    ++seen->calls;
    seen->pass_id = pass_id;
    seen->worker = last.name;
    seen->waited = w0->rpc_async<void>(last.name, "wait_part", id, pass_id);
    seen->called.try_set_value();
  };
  // w1's part (its weight's gradient) goes on only once w1 has been named: so w0's part,
  // which ends once its gradient has gone to w1 and discovery is over, ends first whatever
  // the threads' timing (w1's answer to the Wait could otherwise reach w0 before w0's own
  // thread ends its part, and with w0's part the last one nothing is named). Bounded: a pass
  // that never names w1 fails below.
  weights_.at(1).register_hook([seen](const Tensor&) -> Tensor {
    seen->called.wait(10s);
    return Tensor();
  });
  Tensor x = tensor(std::vector<double>{1.0, 2.0, 3.0});  // needs no gradient
  Tensor y = w(0).rpc_sync<Tensor>("w1", "project", x);
  da::backward(w(0), ctx.id(), {sum(y)}, options);
  // Called on w0's pool, possibly after backward() returned.
  ASSERT_TRUE(seen->called.wait(10s));
  std::optional<Future<void>> waited;
  uint64_t pass_id = 0;
  {
    std::lock_guard<std::mutex> lock(seen->mutex);
    EXPECT_EQ(seen->calls, 1);
    EXPECT_EQ(seen->worker, "w1");
    waited = seen->waited;
    pass_id = seen->pass_id;
  }
  ASSERT_TRUE(waited.has_value());
  EXPECT_NO_THROW(waited->get(10s));
  // d/dW sum(x W) = x^T 1.
  expect_near(da::get_gradients(w(1), ctx.id()).at(weights_.at(1)),
              tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, Shape{3, 2}));
  // Asked again after the pass: its end is remembered.
  EXPECT_NO_THROW(w(0).rpc_sync<void>("w1", "wait_part", ctx.id(), pass_id));
  try {
    w(2).rpc_sync<void>("w1", "wait_part", ctx.id(), pass_id);
    ADD_FAILURE() << "a worker that did not start the pass waited for a part of it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("from worker 'w2' (rank 2), which did not start it"),
              std::string::npos)
        << e.what();
  }
  try {
    w(0).rpc_sync<void>("w1", "wait_part", ctx.id(), pass_id + 1000);
    ADD_FAILURE() << "waited for a pass w1 takes no part in";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes no part in pass"), std::string::npos) << e.what();
  }
  // The other part fails: nothing is called.
  {
    da::Context failing(w(0));
    Tensor z = w(0).rpc_sync<Tensor>("w1", "fails_in_backward", leaf({1.0, 2.0}));
    EXPECT_THROW(da::backward(w(0), failing.id(), {sum(z)}, options), RemoteError);
  }
  // No other part: nothing is called.
  {
    da::Context alone(w(0));
    Tensor a = leaf({2.0});
    da::backward(w(0), alone.id(), {sum(sq(a))}, options);
    expect_near(da::get_gradients(w(0), alone.id()).at(a), tensor(std::vector<double>{4.0}));
  }
  std::lock_guard<std::mutex> lock(seen->mutex);
  EXPECT_EQ(seen->calls, 1);
}

// Occupies every thread of `agent`'s pool with a task that waits until the returned guard is
// opened (open(), or its destruction on any way out of the test, so that no task is left
// waiting when the agents stop).
class BlockedPool {
 public:
  explicit BlockedPool(RpcAgent& agent) : release_(std::make_shared<test::CountdownLatch>(1)) {
    const int threads = std::static_pointer_cast<ThreadPool>(agent.executor())->num_threads();
    auto started = std::make_shared<test::CountdownLatch>(threads);
    for (int i = 0; i < threads; ++i) {
      agent.executor()->execute([started, release = release_] {
        started->count_down();
        release->wait(30s);
      });
    }
    all_busy_ = started->wait(10s);
  }
  ~BlockedPool() { open(); }
  BlockedPool(const BlockedPool&) = delete;
  BlockedPool& operator=(const BlockedPool&) = delete;
  bool all_busy() const { return all_busy_; }
  void open() { release_->count_down(); }

 private:
  std::shared_ptr<test::CountdownLatch> release_;
  bool all_busy_ = false;
};

// The end of a worker's part and the initiator's record of every part's end happen on the
// threads that end them, not on the agent's pool: a pass whose initiator has no incoming
// gradients finishes while every one of the initiator's pool threads is busy.
TEST_F(DistAutograd, APassEndsWhileTheInitiatorsPoolIsBusy) {
  da::Context ctx(w(0));
  Tensor x = tensor(std::vector<double>{1.0, 2.0, 3.0});  // no grad: nothing comes back to w0
  Tensor y = w(0).rpc_sync<Tensor>("w1", "project", x);   // 1x2 = x · W on w1
  BlockedPool blocked(w(0));
  ASSERT_TRUE(blocked.all_busy()) << "the pool's threads did not all take a task";
  da::BackwardOptions options;
  options.timeout = 10s;
  std::string failure;
  try {
    da::backward(w(0), ctx.id(), {sum(y)}, options);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  blocked.open();
  EXPECT_EQ(failure, "") << "the pass needed the initiator's pool";
  // d/dW sum(x W) = x^T 1.
  expect_near(da::get_gradients(w(1), ctx.id()).at(weights_.at(1)),
              tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, Shape{3, 2}));
}

// BackwardOptions::on_last_part_inline: the hook runs on the thread that ends the last part
// but one, not on the pool. Every thread of w0's pool is busy; w1's part goes on only once
// the hook has run. On the pool the hook would wait for a free thread and w1's hook would
// give up after 10 s; inline, the hook runs when discovery ends w0's part (nothing is left to
// run there: x needs no gradient), w1 is named, and the pass ends exact, the hook done
// before backward() returns. The request it sends may wait on w1 for the part's end.
TEST_F(DistAutograd, AnInlineLastPartHookRunsWithoutThePool) {
  reg_.def("wait_part", [](const CallContext& ctx, uint64_t context_id, uint64_t pass_id) {
    return da::part_done(ctx, context_id, pass_id);
  });
  struct Seen {
    std::mutex mutex;
    int calls = 0;
    std::string worker;
    std::optional<Future<void>> waited;
    Future<void> called;
  };
  auto seen = std::make_shared<Seen>();
  RpcAgent* w0 = &w(0);
  da::Context ctx(w(0));
  da::BackwardOptions options;
  options.timeout = 30s;
  options.on_last_part_inline = true;
  options.on_last_part = [seen, w0, id = ctx.id()](uint64_t pass_id, const rpc::WorkerInfo& last) {
    std::lock_guard<std::mutex> lock(seen->mutex);
    ++seen->calls;
    seen->worker = last.name;
    seen->waited = w0->rpc_async<void>(last.name, "wait_part", id, pass_id);
    seen->called.try_set_value();
  };
  weights_.at(1).register_hook([seen](const Tensor&) -> Tensor {
    if (!seen->called.wait(10s)) throw std::runtime_error("the last-part hook never ran");
    return Tensor();
  });
  Tensor x = tensor(std::vector<double>{1.0, 2.0, 3.0});  // needs no gradient
  Tensor y = w(0).rpc_sync<Tensor>("w1", "project", x);
  BlockedPool blocked(w(0));
  ASSERT_TRUE(blocked.all_busy()) << "the pool's threads did not all take a task";
  std::string failure;
  try {
    da::backward(w(0), ctx.id(), {sum(y)}, options);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const bool called_before_return = seen->called.completed();
  blocked.open();
  EXPECT_EQ(failure, "") << "the hook waited for the pool";
  EXPECT_TRUE(called_before_return);
  std::optional<Future<void>> waited;
  {
    std::lock_guard<std::mutex> lock(seen->mutex);
    EXPECT_EQ(seen->calls, 1);
    EXPECT_EQ(seen->worker, "w1");
    waited = seen->waited;
  }
  ASSERT_TRUE(waited.has_value());
  EXPECT_NO_THROW(waited->get(10s));
  // d/dW sum(x W) = x^T 1.
  expect_near(da::get_gradients(w(1), ctx.id()).at(weights_.at(1)),
              tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, Shape{3, 2}));
}

// A Wait is served as it arrives, on the I/O thread, not on the callee's pool: w1 has one
// pool thread, and it runs w1's part of the pass, where a hook waits until a third
// dist_autograd request (after the Discover and the Propagate: the Wait) has begun to be
// served on w1. Served on the pool, the Wait would queue behind that very thread and the
// hook would give up after 10 s; served inline it is seen at once, the part ends, and the
// thread that ends it answers the Wait. W's gradient is exact.
class DistAutogradOnePoolThread : public ::testing::Test {
 protected:
  class Counting : public rpc::Interceptor {
   public:
    std::shared_ptr<rpc::ServeScope> on_incoming_request(const rpc::WorkerInfo&,
                                                         rpc::Request& request) override {
      if (request.handler == da::kDistAutogradHandler) {
        seen.fetch_add(1);
        if (seen.load() >= 3) third.try_set_value();
      }
      return nullptr;
    }
    std::atomic<int> seen{0};
    Future<void> third;
  };
  void SetUp() override {
    weight_ = make_weight();
    counting_ = std::make_shared<Counting>();
    reg_.def("project_waiting", [this](const Tensor& x) {
      Tensor y = matmul(x.reshape({1, 3}), weight_);
      auto counting = counting_;
      y.register_hook([counting](const Tensor& g) -> Tensor {
        if (!counting->third.wait(10s)) throw std::runtime_error("the Wait was not served");
        return g;
      });
      return y;
    });
    rpc::AgentOptions options = test::agent_options(reg_);
    options.num_worker_threads = 1;
    agents_ = test::start_agents(2, options);
    agents_[1]->add_interceptor(counting_);
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  Registry reg_;
  Tensor weight_;
  std::shared_ptr<Counting> counting_;
  test::Agents agents_;
};

TEST_F(DistAutogradOnePoolThread, TheWaitIsServedWhileTheCalleesOnlyPoolThreadComputes) {
  RpcAgent& w0 = *agents_[0];
  da::Context ctx(w0);
  Tensor x = tensor(std::vector<double>{1.0, 2.0, 3.0});
  Tensor y = w0.rpc_sync<Tensor>("w1", "project_waiting", x);
  da::BackwardOptions options;
  options.timeout = 30s;
  ASSERT_NO_THROW(da::backward(w0, ctx.id(), {sum(y)}, options));
  EXPECT_GE(counting_->seen.load(), 3);
  // d/dW sum(x W) = x^T 1.
  expect_near(da::get_gradients(*agents_[1], ctx.id()).at(weight_),
              tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, Shape{3, 2}));
}

TEST_F(DistAutograd, FanOutNestedCallsAndARing) {
  const std::vector<double> x0{0.5, -1.5, 2.0};
  // a = x^2 (w1), b = (-x)^2 (w2), c = (3x)^2 + x (w1 -> w2), d = 2 (x^2 + x) (w1 -> w2 ->
  // w0): a + b + c + d = 13 x^2 + 3x, so the loss is sum(13 x^3 + 3 x^2) and its gradient
  // 39 x^2 + 6x.
  Tensor want = closed_form(x0, [](double v) { return 39 * v * v + 6 * v; });
  da::Context ctx(w(0));
  Tensor x = leaf(x0);
  Tensor a = w(0).rpc_sync<Tensor>("w1", "square", x);
  Tensor b = w(0).rpc_sync<Tensor>("w2", "square", mul(x, -1.0));
  Tensor c = w(0).rpc_sync<Tensor>("w1", "nested", x);
  Tensor d = w(0).rpc_sync<Tensor>("w1", "ring", x);
  da::backward(w(0), ctx.id(), {sum(mul(add(add(a, b), add(c, d)), x))});
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), want);
}

// The four cases PyTorch's FAST mode gets wrong, each with retain_graph=false.
TEST_F(DistAutograd, SharedNodesUnusedCallsAndReusedResultsAreRight) {
  const std::vector<double> x0{1.5, -0.5, 2.5};
  // With u = 2x: r1 = r2 = local = u^2, and the loss is sum(u^4 + u^2 + 2 u^2) =
  // sum(16 x^4 + 12 x^2), whose gradient is 64 x^3 + 24 x.
  Tensor want = closed_form(x0, [](double v) { return 64 * v * v * v + 24 * v; });
  da::Context ctx(w(0));
  Tensor x = leaf(x0);
  Tensor u = mul(x, 2.0);  // feeds a local op and two remote calls: one shared node here
  Tensor local = sq(u);
  Tensor r1 = w(0).rpc_sync<Tensor>("w1", "square", u);
  Tensor r2 = w(0).rpc_sync<Tensor>("w2", "square", u);
  Tensor unused = w(0).rpc_sync<Tensor>("w1", "square", x);  // never reaches the loss
  (void)unused;
  // A remote result used twice.
  Tensor loss = add(sum(mul(r1, r1)), add(sum(r1), sum(add(local, r2))));
  da::backward(w(0), ctx.id(), {loss}, /*retain_graph=*/false);
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), want);
}

TEST_F(DistAutograd, RetainGraphLetsTwoPassesAccumulate) {
  const std::vector<double> x0{1.0, 2.0, -1.0};
  Tensor once = closed_form(x0, [](double v) { return 4 * v * v * v; });  // d/dx sum(x^4)
  da::Context ctx(w(0));
  Tensor x = leaf(x0);
  Tensor loss = sum(sq(w(0).rpc_sync<Tensor>("w1", "square", x)));
  da::backward(w(0), ctx.id(), {loss}, /*retain_graph=*/true);
  da::backward(w(0), ctx.id(), {loss}, /*retain_graph=*/false);
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), mul(once, 2.0));
  // The graph is freed now.
  EXPECT_THROW(da::backward(w(0), ctx.id(), {loss}), Error);
}

TEST_F(DistAutograd, ThroughAnRRefProxyAsAParameterServer) {
  struct Server {
    Tensor weight = make_weight();
    Tensor forward(const Tensor& x) { return matmul(x.reshape({1, 3}), weight); }
  };
  reg_.def_class<Server>("Server").ctor<>().method("forward", &Server::forward);
  rref::RRef<Server> ps = rref::remote<Server>(w(0), "w1", "Server");
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 0.0, -1.0});
  Tensor y = ps.rpc_sync<Tensor>("forward", x);
  EXPECT_EQ(autograd::gradient_edge(y).function->name(), "RecvRpcBackward");
  da::backward(w(0), ctx.id(), {sum(y)});
  expect_near(da::get_gradients(w(0), ctx.id()).at(x), tensor(std::vector<double>{3, 7, 11}));
  // The server's weight got its gradient on w1.
  da::Gradients on_server = da::get_gradients(w(1), ctx.id());
  ASSERT_EQ(on_server.size(), 1u);
  expect_near(on_server.items()[0].second,
              tensor(std::vector<double>{1, 1, 0, 0, -1, -1}, Shape{3, 2}));
  ps = {};
}

TEST_F(DistAutograd, ConcurrentContextsKeepTheirGradientsApart) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 5; ++round) {
        const double v = k + 1 + 0.1 * round;
        da::Context ctx(w(0));
        Tensor x = leaf({v, -v});
        Tensor y = w(0).rpc_sync<Tensor>(k % 2 ? "w1" : "w2", "square", x);
        da::backward(w(0), ctx.id(), {sum(y)});
        Tensor g = da::get_gradients(w(0), ctx.id()).at(x);
        if (std::abs(g.data<double>()[0] - 2 * v) > 1e-12 ||
            std::abs(g.data<double>()[1] + 2 * v) > 1e-12)
          ++bad;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(DistAutograd, ContextsEndOnEveryWorkerTheyTouched) {
  {
    da::Context ctx(w(0));
    Tensor x = leaf({1.0});
    Tensor y = w(0).rpc_sync<Tensor>("w1", "nested", x);  // w0 -> w1 -> w2
    EXPECT_EQ(da::num_contexts(w(1)), 1u);
    EXPECT_EQ(da::num_contexts(w(2)), 1u);
    da::backward(w(0), ctx.id(), {sum(y)});
  }
  EXPECT_EQ(da::current_context_id(), 0u);
  // Released here at once; the others drop it as their Releases arrive (the end does not
  // wait for their answers).
  EXPECT_EQ(da::num_contexts(w(0)), 0u);
  for (int r = 1; r < 3; ++r) {
    testing::eventually([&] { return da::num_contexts(w(r)) == 0; }, 10s);
    EXPECT_EQ(da::num_contexts(w(r)), 0u) << "worker " << r;
  }
}

TEST_F(DistAutograd, ErrorsAreTypedAndNamed) {
  da::Context ctx(w(0));
  Tensor x = leaf({1.0, 2.0});
  EXPECT_THROW(da::backward(w(0), ctx.id() + 12345, {sum(x)}), InvalidArgument);
  EXPECT_THROW(da::backward(w(0), ctx.id(), {}), InvalidArgument);
  EXPECT_THROW(da::backward(w(0), ctx.id(), {tensor(std::vector<double>{1.0})}), InvalidArgument);
  EXPECT_THROW(da::get_gradients(w(0), 999), InvalidArgument);
  Tensor y = w(0).rpc_sync<Tensor>("w1", "fails_in_backward", x);
  try {
    da::backward(w(0), ctx.id(), {sum(y)});
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("hook exploded"), std::string::npos) << e.what();
    EXPECT_EQ(e.worker(), "w1");
  }
}

// Told when a worker is lost; added after dist_autograd/'s own listener, so it runs after it.
class LossLatch : public rpc::AgentListener {
 public:
  void on_worker_lost(const rpc::WorkerInfo&, const std::string&) override { lost.count_down(); }
  test::CountdownLatch lost{1};
};

// A worker that goes without releasing its contexts: the workers its passes reached release
// them for it, so nothing it started is kept for ever.
TEST(DistAutogradLoss, TheContextsOfALostWorkerAreReleasedWhereverTheyReached) {
  Registry reg;
  reg.def("square", [](const Tensor& x) { return mul(x, x); });
  rpc::AgentOptions options = test::agent_options(reg);
  test::Agents agents = test::start_agents(3, options);
  auto w0_saw = std::make_shared<LossLatch>();
  auto w2_saw = std::make_shared<LossLatch>();
  agents[0]->add_listener(w0_saw);
  agents[2]->add_listener(w2_saw);
  // w1 starts a context that reaches w0 and w2; w2 starts one of its own on w0.
  auto c1 = std::make_unique<da::Context>(*agents[1]);
  (void)agents[1]->rpc_sync<Tensor>("w0", "square", leaf({1.0, 2.0}));
  (void)agents[1]->rpc_sync<Tensor>("w2", "square", leaf({3.0}));
  auto theirs = std::make_unique<da::Context>(*agents[2]);
  (void)agents[2]->rpc_sync<Tensor>("w0", "square", leaf({5.0}));
  EXPECT_EQ(da::num_contexts(*agents[0]), 2u);  // c1's and w2's
  EXPECT_EQ(da::num_contexts(*agents[2]), 2u);  // c1's and its own
  // w1 goes without releasing c1.
  agents[1]->shutdown(false);
  ASSERT_TRUE(w0_saw->lost.wait(10s));
  ASSERT_TRUE(w2_saw->lost.wait(10s));
  EXPECT_EQ(da::num_contexts(*agents[0]), 1u);  // w2's stays
  EXPECT_EQ(da::num_contexts(*agents[2]), 1u);
  EXPECT_NO_THROW(da::get_gradients(*agents[0], theirs->id()));
  // Contexts end in the reverse order of their start: each restores the current context
  // id it found (ending c1 first left c1's id current on this thread after both ended).
  theirs.reset();
  c1.reset();
  for (size_t r : {0u, 2u})
    agents[r]->shutdown(false);
}

TEST(DistAutogradProcesses, AWorkerKilledMidBackwardFailsThePassNamingIt) {
  Registry reg;
  reg.def("dies_in_backward", [](const Tensor& x) {
    Tensor y = mul(x, x);
    y.register_hook([](const Tensor&) -> Tensor {
      ::kill(::getpid(), SIGKILL);
      return Tensor();
    });
    return y;
  });
  test::RankResults results = test::run_agent_processes(
      "dist-autograd-kill", 2, test::agent_options(reg),
      [&](int rank, c10d::Store& store, RpcAgent& agent) {
        if (rank == 1) {
          store.wait({"never"}, 40s);
          return;
        }
        da::Context ctx(agent);
        Tensor x = leaf({1.0, 2.0});
        Tensor y = agent.rpc_sync<Tensor>("w1", "dies_in_backward", x);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          da::backward(agent, ctx.id(), {sum(y)});
          ADD_FAILURE() << "no error";
        } catch (const NetworkError& e) {
          EXPECT_NE(std::string(e.what()).find("'w1'"), std::string::npos) << e.what();
        }
        // The connection drops as the process dies: the pass fails well within 2 s of it.
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
        agent.shutdown(false);
      });
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_EQ(results.ranks[1].term_signal, SIGKILL) << results.summary();
}

}  // namespace
}  // namespace gradwire

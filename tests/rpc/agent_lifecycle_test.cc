// The TensorPipe agent's life cycle (RpcAgentLifecycle): handlers and attachments installed
// before start, a second group on the same store, device maps checked at start-up,
// interceptors told how every call ended, serve scopes, and which thread writes the reply
// to a handler's future.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent_fixture.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_pool.h"
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

// ---------------------------------------------------------------- start-up order, context

struct Tally {
  std::atomic<int> calls{0};
};

TEST(RpcAgentLifecycle, HandlersInstalledBeforeStartMeetTheFirstCall) {
  Registry reg;
  reg.def("whoami", [](const CallContext& ctx, int64_t x) {
    // The context finds the serving agent, its attachments and the caller, with no singleton.
    ctx.agent()->attachment<Tally>()->calls++;
    return ctx.caller().name + "->" + ctx.agent()->worker_info().name + ":" + std::to_string(x) +
           (ctx.request_id() > 0 ? "" : " (no id)");
  });
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents;
  for (int r = 0; r < 2; ++r)
    agents.push_back(create_tensorpipe_agent(worker_name(r), r, 2, store, test_options(reg)));
  // Not started: nothing can be sent yet, but everything can be installed.
  EXPECT_NE(error_text<Error>([&] {
              agents[0]->rpc_sync<std::string>("w1", "whoami", 1);
            }).find("has not been started"),
            std::string::npos);
  auto tally = std::make_shared<Tally>();
  agents[1]->set_attachment(tally);
  EXPECT_EQ(agents[1]->attachment<Tally>(), tally);
  EXPECT_EQ(agents[0]->attachment<Tally>(), nullptr);
  std::atomic<int64_t> deadline_ms{-1};
  agents[1]->register_handler(
      200, "deadline",
      [&](const CallContext& ctx, const Request&) {
        deadline_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          ctx.deadline() - std::chrono::steady_clock::now())
                          .count();
        return make_ready_future(Value(int64_t{1}));
      },
      Execution::kInline);
  // Rank 1 starts first and calls rank 0 the moment both are up.
  std::thread second([&] { agents[1]->start(); });
  agents[0]->start();
  second.join();
  EXPECT_THROW(agents[0]->start(), InvalidArgument);
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "whoami", 7), "w0->w1:7");
  EXPECT_EQ(tally->calls.load(), 1);
  Request r;
  r.handler = 200;
  EXPECT_EQ(agents[0]->send("w1", r, CallOptions{.timeout = 5s}).get().as_int(), 1);
  EXPECT_GT(deadline_ms.load(), 3000);
  EXPECT_LE(deadline_ms.load(), 5000);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentLifecycle, ASecondGroupOnTheSameStoreReadsNoRecordOfTheFirst) {
  Registry reg;
  register_basics(reg);
  auto store = std::make_shared<c10d::HashStore>(20s);
  expect_clean_shutdown(start_agents(2, test_options(reg), store));
  // The same ranks again, on the same store: without per-group keys they would read the
  // first group's records (and addresses of agents that are gone) and pass its barriers.
  Agents again = start_agents(2, test_options(reg), store);
  EXPECT_EQ(again[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{4, 5}), 9);
  expect_clean_shutdown(again);
}

TEST(RpcAgentLifecycle, DeviceMapsNamingMissingDevicesFailAtStartUp) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "checks the CPU-only refusal";
  Registry reg;
  AgentOptions options = test_options(reg);
  options.device_maps["w1"] = {{Device::cuda(0), Device::cuda(0)}};
  const std::string text = error_text<std::runtime_error>([&] { start_agents(2, options); });
  EXPECT_NE(text.find("device_maps['w1'] maps cuda:0, but this worker has 0 CUDA devices"),
            std::string::npos)
      << text;
}

// ---------------------------------------------------------------- interceptors

// Records every callback, with the state it handed out and got back.
class LifecycleInterceptor : public Interceptor {
 public:
  explicit LifecycleInterceptor(std::string tag, std::vector<std::string>* log, Mutex* mutex)
      : tag_(std::move(tag)), log_(log), mutex_(mutex) {}
  std::shared_ptr<void> on_outgoing_request(const WorkerInfo&, Request& request) override {
    note("out " + request.function);
    if (request.function == "refused_by_" + tag_) throw InvalidArgument("refused by " + tag_);
    return std::make_shared<std::string>(tag_ + ":" + request.function);
  }
  void on_call_finished(const FinishedCall& call, const std::shared_ptr<void>& state) override {
    const auto* kept = static_cast<const std::string*>(state.get());
    note(std::string("finished ") + call.function + " " + call_outcome_name(call.outcome) +
         (kept != nullptr && *kept == tag_ + ":" + call.function ? " (own state)" : " (no state)") +
         (call.error ? " with error" : ""));
  }
  std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo&, Request& request) override {
    note("in " + request.function);
    return nullptr;
  }
  std::vector<std::string> take() {
    MutexLock lock(*mutex_);
    return std::exchange(*log_, {});
  }

 private:
  void note(const std::string& line) {
    MutexLock lock(*mutex_);
    log_->push_back(tag_ + " " + line);
  }
  std::string tag_;
  std::vector<std::string>* log_;
  Mutex* mutex_;
};

TEST(RpcAgentLifecycle, InterceptorsRunInOrderAndLearnHowEveryCallEnded) {
  Registry reg;
  register_basics(reg);
  HeldFunction hold;
  hold.define(reg, "hold", 1);
  Agents agents = start_agents(2, test_options(reg));
  Mutex mutex;
  std::vector<std::string> log;
  auto first = std::make_shared<LifecycleInterceptor>("A", &log, &mutex);
  auto second = std::make_shared<LifecycleInterceptor>("B", &log, &mutex);
  agents[0]->add_interceptor(first);
  agents[0]->add_interceptor(second);
  auto sent = [&](auto&& f) {
    f();
    return first->take();
  };

  // A value: both see the request in order, then both are told, each with its own state.
  std::vector<std::string> seen =
      sent([&] { agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}); });
  EXPECT_EQ(seen, (std::vector<std::string>{"A out sum_list", "B out sum_list",
                                            "A finished sum_list replied (own state)",
                                            "B finished sum_list replied (own state)"}));
  // An error raised remotely still counts as a reply.
  seen = sent([&] {
    EXPECT_THROW(agents[0]->rpc_sync<int64_t>("w1", "fail", std::string("x")), RemoteError);
  });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[2], "A finished fail replied (own state) with error");
  // Refused by the second interceptor: the first hears that it was never sent.
  reg.def("refused_by_B", [] {});
  seen =
      sent([&] { EXPECT_THROW(agents[0]->rpc_sync<void>("w1", "refused_by_B"), InvalidArgument); });
  EXPECT_EQ(seen,
            (std::vector<std::string>{"A out refused_by_B", "B out refused_by_B",
                                      "A finished refused_by_B not sent (own state) with error"}));
  // Encoding fails (an undefined tensor cannot travel): both hear "not sent".
  seen = sent(
      [&] { EXPECT_THROW(agents[0]->call("w1", "echo", {Value(Tensor())}), InvalidArgument); });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[2], "A finished echo not sent (own state) with error");
  EXPECT_EQ(seen[3], "B finished echo not sent (own state) with error");
  // Timed out.
  seen = sent([&] {
    EXPECT_THROW(agents[0]->rpc_sync<int64_t>("w1", "hold", CallOptions{.timeout = 100ms}),
                 TimeoutError);
  });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[2], "A finished hold timed out (own state) with error");
  ASSERT_TRUE(hold.entered.wait(10s));
  // Closed before a reply: pending calls end as "shut down".
  Future<int64_t> pending = agents[0]->rpc_async<int64_t>("w1", "hold");
  agents[0]->shutdown(false);
  ASSERT_TRUE(pending.wait(10s));
  seen = first->take();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[2], "A finished hold shut down (own state) with error");
  hold.release.count_down();
  agents[1]->shutdown(false);
}

TEST(RpcAgentLifecycle, ALostConnectionEndsCallsAsConnectionLost) {
  Registry reg;
  HeldFunction hold;
  hold.define(reg, "hold", 1);
  AgentOptions options = test_options(reg);
  options.close_timeout = 200ms;
  Agents agents = start_agents(2, options);
  Mutex mutex;
  std::vector<std::string> log;
  auto seen = std::make_shared<LifecycleInterceptor>("A", &log, &mutex);
  agents[0]->add_interceptor(seen);
  Future<int64_t> pending = agents[0]->rpc_async<int64_t>("w1", "hold");
  ASSERT_TRUE(hold.entered.wait(10s));
  // The peer closes with its handler still held: close_timeout bounds its wait.
  const auto t0 = std::chrono::steady_clock::now();
  agents[1]->shutdown(false);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ASSERT_TRUE(pending.wait(10s));
  EXPECT_THROW(pending.value(), NetworkError);
  EXPECT_EQ(seen->take().back(), "A finished hold connection lost (own state) with error");
  hold.release.count_down();
  agents[0]->shutdown(false);
  // The handler w1 left running still uses `hold` and `reg`: it must be done before they go.
  eventually([&] { return agents[1]->metrics().running_handlers == 0; });
  EXPECT_EQ(agents[1]->metrics().running_handlers, 0);
}

// Sets a thread-local while the agent works for one request.
thread_local int t_scope_depth = 0;
class DepthScope : public ServeScope {
 public:
  void enter() override { ++t_scope_depth; }
  void exit() override { --t_scope_depth; }
};
class ScopingInterceptor : public Interceptor {
 public:
  std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo&, Request&) override {
    return std::make_shared<DepthScope>();
  }
  void on_outgoing_response(const WorkerInfo&, const Request& request, Response&) override {
    if (request.function == "later") depth_at_reply = t_scope_depth;
  }
  std::atomic<int> depth_at_reply{-1};
};

TEST(RpcAgentLifecycle, AServeScopeWrapsTheHandlerAndItsAsynchronousReplyOnly) {
  Registry reg;
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "later"});
  Future<int64_t> gate;
  reg.def("depth", [] { return int64_t{t_scope_depth}; });
  reg.def("later", [&]() { return gate.then(pool, [](Future<int64_t> f) { return f.value(); }); });
  AgentOptions options = test_options(reg);
  options.num_worker_threads = 1;  // every request on the same pool thread
  Agents agents = start_agents(2, options);
  auto scoping = std::make_shared<ScopingInterceptor>();
  agents[1]->add_interceptor(scoping);
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "depth"), 1);  // inside the scope
  Future<int64_t> later = agents[0]->rpc_async<int64_t>("w1", "later");
  gate.set_value(5);
  EXPECT_EQ(later.get(10s), 5);
  EXPECT_EQ(scoping->depth_at_reply.load(), 1);  // the asynchronous reply is scoped too
  // Nothing leaks into the next task on that thread.
  EXPECT_EQ(agents[1]->executor() != nullptr, true);
  Future<int64_t> after = std::static_pointer_cast<ThreadPool>(agents[1]->executor())->submit([] {
    return int64_t{t_scope_depth};
  });
  EXPECT_EQ(after.get(10s), 0);
  expect_clean_shutdown(agents);
  pool->shutdown();
}

thread_local bool t_completing = false;  // set around the test's own set_value calls

// Records, for each "later_*" call, the thread that wrote its reply and whether it did so
// inside the test's completing call.
class ReplyThreadInterceptor : public Interceptor {
 public:
  void on_outgoing_response(const WorkerInfo&, const Request& request, Response&) override {
    if (request.function.rfind("later_", 0) != 0) return;
    MutexLock lock(mutex);
    writer[request.function] = {this_thread_name(), t_completing};
  }
  std::pair<std::string, bool> of(const std::string& function) {
    MutexLock lock(mutex);
    return writer[function];
  }
  Mutex mutex;
  std::map<std::string, std::pair<std::string, bool>> writer GRADWIRE_GUARDED_BY(mutex);
};

// A handler's unfinished future: the pool worker that completes it (outside any handler)
// writes the reply right there, inside its set_value, with no hand-off; one completed on a
// thread of the application has its reply posted to the pool, whose workers are "rpc-N".
// One pool worker: its tasks run in order, so a task queued while a handler runs starts
// after that handler has returned its future.
TEST(RpcAgentLifecycle, TheReplyToAFutureIsWrittenByThePoolWorkerThatCompletesIt) {
  Registry reg;
  Future<int64_t> by_pool;
  Future<int64_t> by_app;
  test::CountdownLatch pool_served(1);
  test::CountdownLatch app_served(1);
  reg.def("later_pool", [&] {
    pool_served.count_down();
    return by_pool;
  });
  reg.def("later_app", [&] {
    app_served.count_down();
    return by_app;
  });
  AgentOptions options = test_options(reg);
  options.num_worker_threads = 1;
  Agents agents = start_agents(2, options);
  auto seen = std::make_shared<ReplyThreadInterceptor>();
  agents[1]->add_interceptor(seen);
  auto pool = std::static_pointer_cast<ThreadPool>(agents[1]->executor());

  Future<int64_t> first = agents[0]->rpc_async<int64_t>("w1", "later_pool");
  ASSERT_TRUE(pool_served.wait(10s));
  Future<std::string> completer = pool->submit([&] {
    t_completing = true;
    by_pool.set_value(3);
    t_completing = false;
    return this_thread_name();
  });
  EXPECT_EQ(first.get(10s), 3);
  const auto [pool_writer, inside_pool_completion] = seen->of("later_pool");
  EXPECT_EQ(pool_writer, completer.get(10s));
  EXPECT_TRUE(inside_pool_completion) << "the reply was posted instead of written by the completer";

  Future<int64_t> second = agents[0]->rpc_async<int64_t>("w1", "later_app");
  ASSERT_TRUE(app_served.wait(10s));
  pool->submit([] {}).get(10s);  // the handler has returned
  std::thread app([&] {
    t_completing = true;
    by_app.set_value(4);
    t_completing = false;
  });
  app.join();
  EXPECT_EQ(second.get(10s), 4);
  const auto [app_writer, inside_app_completion] = seen->of("later_app");
  EXPECT_EQ(app_writer.rfind("rpc-", 0), 0u) << app_writer;
  EXPECT_FALSE(inside_app_completion);
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc

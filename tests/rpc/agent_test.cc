// The TensorPipe agent (RpcAgent): calls between workers (ranks as threads, several agents
// in one process, and ranks as processes where a peer dies), typed results checked against
// values worked out here, every error of the call path, handlers and interceptors,
// timeouts, start-up checks, and graceful and forced shutdown. Tensors on the wire are in
// agent_tensors_test.cc, malformed messages from a raw peer in
// agent_malformed_messages_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "agent_fixture.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/eventually.h"
#include "support/harness.h"
#include "support/log_capture.h"
#include "support/sync.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;
using gradwire::testing::eventually;

TEST(RpcAgent, CallsByNameIdAndWorkerInfoAcrossThreeWorkers) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(3, test_options(reg));
  const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
  const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      Tensor c = agents[static_cast<size_t>(from)]->rpc_sync<Tensor>(worker_name(to), "add", a, b);
      EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1.75f, 2.0f}));
    }
  }
  RpcAgent& w0 = *agents[0];
  EXPECT_EQ(w0.rpc_sync<std::string>(1, "concat", std::string("ab"), std::string("cd")), "abcd");
  const WorkerInfo w2 = w0.get_worker_info("w2");
  EXPECT_EQ(w2, (WorkerInfo{"w2", 2}));
  EXPECT_EQ(w0.rpc_sync<int64_t>(w2, "sum_list", std::vector<int64_t>{1, 2, 3, 40}), 46);
  Tensor scaled = w0.rpc_sync<Tensor>("w1", "scale", a, 2.0);
  EXPECT_EQ(scaled.to_vector<float>(), (std::vector<float>{3.0f, -4.0f}));
  w0.rpc_sync<void>("w1", "nothing");
  EXPECT_EQ(w0.worker_info(), (WorkerInfo{"w0", 0}));
  EXPECT_EQ(w0.get_worker_infos().size(), 3u);
  EXPECT_EQ(w0.get_worker_info(1).name, "w1");
  expect_clean_shutdown(agents);
}

// Every worker's first calls to every other at once: connections are made while the
// peers' first messages arrive on the same threads (connecting must not hold the agent's
// lock across TensorPipe's connect(), which can run another connection's callback in place:
// the worker would deadlock on itself).
TEST(RpcAgent, FirstContactFromEveryWorkerAtOnceCompletes) {
  Registry reg;
  register_basics(reg);
  for (int round = 0; round < 3; ++round) {
    Agents agents = start_agents(5, test_options(reg));
    std::vector<std::thread> senders;
    std::atomic<int> done{0};
    for (int r = 0; r < 5; ++r) {
      senders.emplace_back([&, r] {
        std::vector<Future<std::string>> calls;
        for (int to = 0; to < 5; ++to) {
          if (to != r)
            calls.push_back(agents[static_cast<size_t>(r)]->rpc_async<std::string>(
                worker_name(to), "concat", std::string("a"), std::string("b")));
        }
        for (auto& f : calls) {
          if (f.wait(20s) && !f.has_error() && f.value() == "ab") ++done;
        }
      });
    }
    for (auto& t : senders)
      t.join();
    EXPECT_EQ(done.load(), 20) << "round " << round;
    expect_clean_shutdown(agents);
  }
}

// Several threads of one worker make their first call to the same peer at once: one pipe
// wins, the others are spare. The peer must go on accepting connections afterwards (closing
// a spare pipe must not stop its listener), which w2 checks by calling it.
TEST(RpcAgent, ThreadsRacingToConnectToOnePeerLeaveItAccepting) {
  Registry reg;
  register_basics(reg);
  for (int round = 0; round < 10; ++round) {
    Agents agents = start_agents(3, test_options(reg));
    constexpr int kThreads = 8;
    std::atomic<int> ready{0};
    std::atomic<int> done{0};
    std::vector<std::thread> senders;
    for (int t = 0; t < kThreads; ++t) {
      senders.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads)
          std::this_thread::yield();
        auto f = agents[0]->rpc_async<int64_t>("w1", "sum_list", std::vector<int64_t>{t, 1});
        if (f.wait(20s) && !f.has_error() && f.value() == t + 1) ++done;
      });
    }
    for (auto& t : senders)
      t.join();
    EXPECT_EQ(done.load(), kThreads) << "round " << round;
    EXPECT_EQ(agents[2]->rpc_sync<std::string>("w1", "concat", CallOptions{.timeout = 10s},
                                               std::string("x"), std::string("y")),
              "xy")
        << "round " << round;
    expect_clean_shutdown(agents);
  }
}

TEST(RpcAgent, ManyAsyncCallsInFlightAllComplete) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  std::vector<Future<int64_t>> futures;
  for (int64_t i = 0; i < 200; ++i)
    futures.push_back(agents[0]->rpc_async<int64_t>("w1", "sum_list", std::vector<int64_t>{i, i}));
  for (int64_t i = 0; i < 200; ++i)
    EXPECT_EQ(futures[static_cast<size_t>(i)].get(10s), 2 * i);
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, UnknownWorkerIsAnInvalidArgumentNamingTheKnownOnes) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  const std::string by_name = error_text<InvalidArgument>(
      [&] { agents[0]->rpc_sync<int64_t>("ps9", "sum_list", std::vector<int64_t>{}); });
  EXPECT_NE(by_name.find("unknown worker 'ps9'"), std::string::npos) << by_name;
  EXPECT_NE(by_name.find("[w0, w1]"), std::string::npos) << by_name;
  const std::string by_id = error_text<InvalidArgument>([&] { agents[0]->get_worker_info(5); });
  EXPECT_NE(by_id.find("unknown worker id 5"), std::string::npos) << by_id;
  const std::string by_info = error_text<InvalidArgument>([&] {
    agents[0]->get_worker_info(WorkerInfo{"w1", 0});
  });
  EXPECT_NE(by_info.find("unknown worker 'w1' (rank 0)"), std::string::npos) << by_info;
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, RefusedCallsAreInvalidArgumentsNamingFunctionAndTypes) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  RpcAgent& w0 = *agents[0];
  const Tensor a = ones({2});
  const std::string unknown =
      error_text<InvalidArgument>([&] { w0.rpc_sync<Tensor>("w1", "sub", a, a); });
  EXPECT_NE(unknown.find("worker 'w1' (rank 1) refused call 'sub'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("no function 'sub'"), std::string::npos) << unknown;
  const std::string arity =
      error_text<InvalidArgument>([&] { w0.rpc_sync<Tensor>("w1", "add", a); });
  EXPECT_NE(arity.find("add(Tensor, Tensor) -> Tensor"), std::string::npos) << arity;
  const std::string type =
      error_text<InvalidArgument>([&] { w0.rpc_sync<Tensor>("w1", "add", a, int64_t{3}); });
  EXPECT_NE(type.find("argument 2 of add(Tensor, Tensor) -> Tensor"), std::string::npos) << type;
  EXPECT_NE(type.find("int"), std::string::npos) << type;
  // The result converts to the caller's R or the call fails naming both types.
  const std::string result =
      error_text<InvalidArgument>([&] { w0.rpc_sync<std::string>("w1", "add", a, a); });
  EXPECT_NE(result.find("result of 'add' on worker 'w1' (rank 1)"), std::string::npos) << result;
  EXPECT_NE(result.find("Tensor"), std::string::npos) << result;
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, RemoteExceptionIsARemoteErrorWithMessageAndWorker) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  try {
    agents[0]->rpc_sync<int64_t>("w1", "fail", std::string("disk on fire"));
    FAIL() << "no exception";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
    EXPECT_EQ(e.remote_message(), "disk on fire");
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  // The worker keeps serving.
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "concat", std::string("x"), std::string("y")),
            "xy");
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, TimeoutFailsTheCallAndTheLateReplyIsDropped) {
  Registry reg;
  HeldFunction slow_fn;
  slow_fn.define(reg, "slow", 7);
  reg.def("fast", [] { return int64_t{8}; });
  Agents agents = start_agents(2, test_options(reg));
  const auto t0 = std::chrono::steady_clock::now();
  Future<int64_t> slow = agents[0]->rpc_async<int64_t>("w1", "slow", CallOptions{.timeout = 200ms});
  EXPECT_TRUE(slow.wait(10s));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 200ms);
  const std::string text = error_text<TimeoutError>([&] { slow.value(); });
  EXPECT_NE(text.find("call 'slow' to worker 'w1' (rank 1) timed out after 200 ms"),
            std::string::npos)
      << text;
  ASSERT_TRUE(slow_fn.entered.wait(10s));
  {
    // The late reply arrives and is dropped quietly: a debug line, nothing else.
    const LogLevel level = log_level();
    set_log_level(LogLevel::kDebug);
    test::LogCapture log;
    slow_fn.release.count_down();
    auto dropped = [&] {
      int n = 0;
      for (const std::string& line : log.lines()) {
        if (line.find("'w0' (rank 0): dropped the reply") != std::string::npos) ++n;
      }
      return n;
    };
    eventually([&] { return dropped() > 0; });  // how many is checked below
    EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "fast"), 8);
    set_log_level(level);
    EXPECT_EQ(dropped(), 1);
    for (const std::string& line : log.lines()) {
      EXPECT_EQ(line.find("WARNING"), std::string::npos) << line;
      EXPECT_EQ(line.find("ERROR"), std::string::npos) << line;
    }
    EXPECT_EQ(agents[0]->metrics().pending_calls, 0);
  }
  const std::string negative = error_text<InvalidArgument>(
      [&] { agents[0]->rpc_sync<int64_t>("w1", "fast", CallOptions{.timeout = -5ms}); });
  EXPECT_NE(negative.find("negative timeout"), std::string::npos) << negative;
  expect_clean_shutdown(agents);
}

// The timer thread is woken only for a deadline earlier than the one it already waits for.
// A call whose deadline comes after that of a call already answered is found when the timer
// wakes for the earlier (gone) one; a short call after a long one wakes it. Each times out
// at its own deadline either way.
TEST(RpcAgent, CallsOneAfterAnotherEachTimeOutAtTheirOwnDeadline) {
  Registry reg;
  HeldFunction slow_fn;
  slow_fn.define(reg, "slow", 7);
  reg.def("fast", [] { return int64_t{8}; });
  Agents agents = start_agents(2, test_options(reg));
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "fast", CallOptions{.timeout = 300ms}), 8);
  const auto t0 = std::chrono::steady_clock::now();
  Future<int64_t> later =
      agents[0]->rpc_async<int64_t>("w1", "slow", CallOptions{.timeout = 600ms});
  ASSERT_TRUE(later.wait(10s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 600ms);
  std::string text = error_text<TimeoutError>([&] { later.value(); });
  EXPECT_NE(text.find("call 'slow' to worker 'w1' (rank 1) timed out after 600 ms"),
            std::string::npos)
      << text;
  Future<int64_t> long_call =
      agents[0]->rpc_async<int64_t>("w1", "slow", CallOptions{.timeout = 60s});
  Future<int64_t> short_call =
      agents[0]->rpc_async<int64_t>("w1", "slow", CallOptions{.timeout = 200ms});
  ASSERT_TRUE(short_call.wait(10s));
  text = error_text<TimeoutError>([&] { short_call.value(); });
  EXPECT_NE(text.find("timed out after 200 ms"), std::string::npos) << text;
  EXPECT_FALSE(long_call.completed());
  slow_fn.release.count_down();
  EXPECT_EQ(long_call.get(10s), 7);
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, AsyncFunctionRepliesWhenItsFutureCompletes) {
  Registry reg;
  Future<int64_t> gate;
  reg.def("wait_gate", [&]() { return gate; });
  reg.def("open_gate", [&](int64_t v) { gate.set_value(v); });
  AgentOptions options = test_options(reg);
  options.num_worker_threads = 1;  // the waiting call must not hold the only thread
  Agents agents = start_agents(2, options);
  Future<int64_t> waiting = agents[0]->rpc_async<int64_t>("w1", "wait_gate");
  agents[0]->rpc_sync<void>("w1", "open_gate", int64_t{41});
  EXPECT_EQ(waiting.get(10s), 41);
  expect_clean_shutdown(agents);
}

// Execution::kInline runs a function on the I/O thread that received the request, with no
// hand-off to the pool: it is served while the pool's only thread is busy (held here so that
// no pool thread is writing a reply, and so inside TensorPipe's loop, when a request comes:
// such a thread hands inline requests to the inline thread, Dispatcher.AnInlineRequest...).
// The default runs on the pool ("rpc-N"). An inline function's returned future still
// replies when it completes, its errors travel like any other, and run_after_reply refuses
// inside it.
TEST(RpcAgent, InlineFunctionsRunOnTheReceivingThreadAndPoolOnesOnThePool) {
  Registry reg;
  Future<void> pool_busy;
  Future<void> release_pool;
  reg.def("hold_pool", [&] {
    pool_busy.set_value();
    release_pool.get(10s);  // the pool's only thread is held here until the test lets it go
    return this_thread_name();
  });
  reg.def(
      "where_inline", [] { return this_thread_name(); }, Execution::kInline);
  reg.def(
      "after_reply_inline", [] { return run_after_reply([] {}); }, Execution::kInline);
  Future<int64_t> gate;
  reg.def(
      "gate_inline", [&] { return gate; }, Execution::kInline);
  reg.def(
      "fail_inline", []() -> int64_t { throw std::runtime_error("inline failure"); },
      Execution::kInline);
  AgentOptions options = test_options(reg);
  options.num_worker_threads = 1;
  Agents agents = start_agents(2, options);
  Future<std::string> held = agents[0]->rpc_async<std::string>("w1", "hold_pool");
  pool_busy.get(10s);
  // Every inline call below is answered while w1's pool has no thread to run it on.
  const std::string io = agents[0]->rpc_sync<std::string>("w1", "where_inline");
  EXPECT_FALSE(io.empty());
  EXPECT_NE(io.rfind("rpc-", 0), 0u) << io;
  EXPECT_FALSE(agents[0]->rpc_sync<bool>("w1", "after_reply_inline"));
  Future<int64_t> waiting = agents[0]->rpc_async<int64_t>("w1", "gate_inline");
  // The receiving thread is free while the future is pending: other calls still get through.
  EXPECT_NE(agents[0]->rpc_sync<std::string>("w1", "where_inline").rfind("rpc-", 0), 0u);
  const std::string text =
      error_text<RemoteError>([&] { agents[0]->rpc_sync<int64_t>("w1", "fail_inline"); });
  EXPECT_NE(text.find("inline failure"), std::string::npos) << text;
  EXPECT_FALSE(held.completed());
  release_pool.set_value();
  const std::string pool = held.get(10s);
  EXPECT_EQ(pool.rfind("rpc-", 0), 0u) << pool;
  gate.set_value(7);  // completed on this thread: the reply is sent from the pool
  EXPECT_EQ(waiting.get(10s), 7);
  expect_clean_shutdown(agents);
}

// run_after_reply: the work a function queues runs on its thread after the reply has gone
// (the caller has its answer while the work still waits on a gate); work that throws is
// logged and the agent goes on; outside a request nothing is queued.
TEST(RpcAgent, WorkQueuedToRunAfterTheReplyRunsOnceTheCallerHasItsAnswer) {
  Registry reg;
  auto gate = std::make_shared<Future<void>>();
  auto ran = std::make_shared<Future<std::string>>();
  reg.def("reply_first", [gate, ran] {
    const std::string serving_thread = this_thread_name();
    EXPECT_TRUE(run_after_reply([gate, ran, serving_thread] {
      gate->wait(10s);
      ran->try_set_value(this_thread_name() == serving_thread ? "same thread" : "other thread");
    }));
    EXPECT_TRUE(run_after_reply([] { throw std::runtime_error("after-reply work failed"); }));
    return int64_t{7};
  });
  reg.def("ping", [] { return int64_t{1}; });
  Agents agents = start_agents(2, test_options(reg));
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "reply_first"), 7);
  EXPECT_FALSE(ran->completed()) << "the work ran before the reply";
  gate->try_set_value();
  EXPECT_EQ(ran->get(10s), "same thread");
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "ping"), 1);
  EXPECT_FALSE(run_after_reply([] { ADD_FAILURE() << "ran outside a request"; }));
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, NestedCallsFromAHandlerReachAThirdWorker) {
  Registry reg;
  register_basics(reg);
  std::vector<std::shared_ptr<RpcAgent>> group;
  reg.def("relay", [&](const std::string& to, const Tensor& a) {
    // Runs on w1, which calls w2: an asynchronous function, so no thread blocks.
    return group[1]->rpc_async<Tensor>(to, "add", a, a);
  });
  group = start_agents(3, test_options(reg));
  Tensor r = group[0]->rpc_sync<Tensor>("w1", "relay", std::string("w2"), full({3}, 2.5));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{5.0f, 5.0f, 5.0f}));
  expect_clean_shutdown(group);
}

class RecordingInterceptor : public Interceptor {
 public:
  std::shared_ptr<void> on_outgoing_request(const WorkerInfo& to, Request& request) override {
    if (request.handler == 100) request.autograd_context_id = 1000 + static_cast<uint64_t>(to.id);
    outgoing_requests++;
    return nullptr;
  }
  std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo& from,
                                                  Request& request) override {
    if (request.handler == 100) seen_context = request.autograd_context_id;
    if (request.function == "forbidden") throw InvalidArgument("interceptor refuses 'forbidden'");
    last_caller = from.name;
    incoming_requests++;
    return nullptr;
  }
  void on_outgoing_response(const WorkerInfo&, const Request&, Response& response) override {
    response.autograd_message_id = 77;
    outgoing_responses++;
  }
  void on_incoming_response(const WorkerInfo&, Response& response,
                            const std::shared_ptr<void>&) override {
    last_response_message_id = response.autograd_message_id;
    incoming_responses++;
  }
  std::atomic<int> outgoing_requests{0}, incoming_requests{0}, outgoing_responses{0},
      incoming_responses{0};
  std::atomic<uint64_t> seen_context{0}, last_response_message_id{0};
  std::string last_caller;
};

TEST(RpcAgent, OwnHandlerAndInterceptorSeeEveryMessage) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  auto sender = std::make_shared<RecordingInterceptor>();
  auto receiver = std::make_shared<RecordingInterceptor>();
  agents[0]->add_interceptor(sender);
  agents[1]->add_interceptor(receiver);
  // A handler of our own: it answers with the payload length and the context id it got.
  agents[1]->register_handler(100, "probe", [](const CallContext& ctx, const Request& request) {
    return make_ready_future(
        Value::list({Value(ctx.caller().name), Value(static_cast<int64_t>(request.payload.size())),
                     Value(static_cast<int64_t>(request.autograd_context_id))}));
  });
  Request probe;
  probe.handler = 100;
  probe.payload = Bytes{1, 2, 3};
  Value reply = agents[0]->send("w1", probe).get(10s);
  ASSERT_EQ(reply.as_list().size(), 3u);
  EXPECT_EQ(reply.as_list()[0].as_string(), "w0");
  EXPECT_EQ(reply.as_list()[1].as_int(), 3);
  EXPECT_EQ(reply.as_list()[2].as_int(), 1001);  // set by the sender's interceptor
  EXPECT_EQ(receiver->seen_context.load(), 1001u);
  EXPECT_EQ(sender->last_response_message_id.load(), 77u);  // set by the receiver's
  EXPECT_EQ(sender->outgoing_requests.load(), 1);
  EXPECT_EQ(sender->incoming_responses.load(), 1);
  EXPECT_EQ(receiver->incoming_requests.load(), 1);
  EXPECT_EQ(receiver->outgoing_responses.load(), 1);
  EXPECT_EQ(receiver->last_caller, "w0");
  // An interceptor can refuse an incoming call: the caller gets the error.
  reg.def("forbidden", [] { return int64_t{1}; });
  const std::string refused =
      error_text<RemoteError>([&] { agents[0]->rpc_sync<int64_t>("w1", "forbidden"); });
  EXPECT_NE(refused.find("interceptor refuses 'forbidden'"), std::string::npos) << refused;
  // Handler ids are unique; an id nobody registered is refused by the receiver.
  const std::string taken = error_text<InvalidArgument>([&] {
    agents[1]->register_handler(100, "again", [](const CallContext&, const Request&) {
      return make_ready_future(Value());
    });
  });
  EXPECT_NE(taken.find("already taken by 'probe'"), std::string::npos) << taken;
  EXPECT_THROW(agents[1]->register_handler(
                   kCallHandler, "x",
                   [](const CallContext&, const Request&) { return make_ready_future(Value()); }),
               InvalidArgument);
  Request stray;
  stray.handler = 77;
  const std::string unknown =
      error_text<InvalidArgument>([&] { agents[0]->send("w1", stray).get(10s); });
  EXPECT_NE(unknown.find("no handler with id 77"), std::string::npos) << unknown;
  // What is registered is not told to the caller.
  EXPECT_EQ(unknown.find("probe"), std::string::npos) << unknown;
  expect_clean_shutdown(agents);
}

// What a module above rpc/ does: its interceptors attach ids to every call and reply as
// extensions, and read the peer's on the other side.
class ExtensionInterceptor : public Interceptor {
 public:
  std::shared_ptr<void> on_outgoing_request(const WorkerInfo&, Request& request) override {
    request.extensions["test.ctx"] = Bytes{4, 2};
    return nullptr;
  }
  std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo&, Request& request) override {
    MutexLock lock(mutex);
    request_extensions = request.extensions;
    return nullptr;
  }
  void on_outgoing_response(const WorkerInfo&, const Request&, Response& response) override {
    response.extensions["test.ack"] = Bytes{7};
  }
  void on_incoming_response(const WorkerInfo&, Response& response,
                            const std::shared_ptr<void>&) override {
    MutexLock lock(mutex);
    response_extensions = response.extensions;
  }
  Mutex mutex;
  Extensions request_extensions GRADWIRE_GUARDED_BY(mutex);
  Extensions response_extensions GRADWIRE_GUARDED_BY(mutex);
};

TEST(RpcAgent, InterceptorsExtensionsAndRequiresGradCrossTheWire) {
  Registry reg;
  register_basics(reg);
  // What the callee received: whether each tensor requires grad and is a leaf.
  reg.def("grad_flags", [](const Tensor& small, const Tensor& large) {
    return std::vector<bool>{small.requires_grad(), small.is_leaf(), large.requires_grad(),
                             large.is_leaf()};
  });
  Agents agents = start_agents(2, test_options(reg));
  auto caller = std::make_shared<ExtensionInterceptor>();
  auto callee = std::make_shared<ExtensionInterceptor>();
  agents[0]->add_interceptor(caller);
  agents[1]->add_interceptor(callee);
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "concat", std::string("a"), std::string("b")),
            "ab");
  {
    MutexLock lock(callee->mutex);
    EXPECT_EQ(callee->request_extensions, (Extensions{{"test.ctx", {4, 2}}}));
  }
  {
    MutexLock lock(caller->mutex);
    EXPECT_EQ(caller->response_extensions, (Extensions{{"test.ack", {7}}}));
  }
  // Tensors that require grad arrive as leaves that require grad (this process has
  // autograd), inline or not, and so come back the same way.
  Tensor small = full({4}, Scalar(1.0));
  Tensor large = arange(0, 1 << 18, 1, kFloat32);  // 1 MiB: beside the envelope or lent
  small.set_requires_grad(true);
  large.set_requires_grad(true);
  EXPECT_EQ(agents[0]->rpc_sync<std::vector<bool>>("w1", "grad_flags", small, large),
            (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(agents[0]->rpc_sync<std::vector<bool>>("w1", "grad_flags", small.detach(), large),
            (std::vector<bool>{false, true, true, true}));
  Tensor echoed = agents[0]->rpc_sync<Tensor>("w1", "echo", large);
  EXPECT_TRUE(echoed.requires_grad());
  EXPECT_TRUE(echoed.is_leaf());
  EXPECT_FALSE(echoed.is_same(large));
  EXPECT_TRUE(equal(echoed.detach(), large.detach()));
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, CallsAfterShutdownFailAtOnce) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  expect_clean_shutdown(agents);
  EXPECT_TRUE(agents[0]->is_shut_down());
  const std::string text = error_text<Error>(
      [&] { agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}); });
  EXPECT_NE(text.find("rpc agent 'w0' (rank 0) is shut down"), std::string::npos) << text;
  agents[0]->shutdown();  // idempotent
}

TEST(RpcAgent, GracefulShutdownLetsOutstandingCallsFinish) {
  Registry reg;
  HeldFunction hold;
  hold.define(reg, "hold", 5);
  Agents agents = start_agents(2, test_options(reg));
  Future<int64_t> held = agents[0]->rpc_async<int64_t>("w1", "hold");
  ASSERT_TRUE(hold.entered.wait(10s));
  std::vector<std::string> errors;
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    errors = shutdown_all(agents);
    closed = true;
  });
  // Both agents are seen shutting down while the call is held: the shutdown waits for it.
  ASSERT_TRUE(eventually(
      [&] { return agents[0]->metrics().shutting_down && agents[1]->metrics().shutting_down; }));
  EXPECT_FALSE(held.completed());
  EXPECT_FALSE(closed.load());
  EXPECT_EQ(agents[0]->metrics().pending_calls, 1);
  hold.release.count_down();
  closer.join();
  EXPECT_EQ(held.get(1s), 5);  // completed before the agents closed
  for (const std::string& e : errors)
    EXPECT_EQ(e, "");
  EXPECT_FALSE(agents[0]->metrics().shutting_down);  // closed now
}

TEST(RpcAgent, ForcedShutdownOfAPeerFailsItsPendingCallsWithNetworkError) {
  Registry reg;
  HeldFunction hold;
  hold.define(reg, "hold", 5);
  Agents agents = start_agents(2, test_options(reg));
  std::vector<Future<int64_t>> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(agents[0]->rpc_async<int64_t>("w1", "hold"));
  ASSERT_TRUE(hold.entered.wait(10s));
  const auto t0 = std::chrono::steady_clock::now();
  // w1 goes away; its pool waits for the held handler, so close it on another thread.
  std::thread killer([&] { agents[1]->shutdown(false); });
  for (auto& f : held) {
    ASSERT_TRUE(f.wait(10s));
    const std::string text = error_text<NetworkError>([&] { f.value(); });
    EXPECT_NE(text.find("call 'hold' to worker 'w1' (rank 1)"), std::string::npos) << text;
    EXPECT_NE(text.find("connection to it was lost"), std::string::npos) << text;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  hold.release.count_down();
  killer.join();
  agents[0]->shutdown(false);
}

TEST(RpcAgent, APeerProcessThatDiesFailsPendingCallsPromptly) {
  Registry reg;
  reg.def("die", []() -> int64_t { ::_exit(0); });
  reg.def("ping", [] { return int64_t{1}; });
  test::RankResults results =
      run_two_worker_processes("die", reg, [](int rank, c10d::Store& store, RpcAgent& agent) {
        if (rank == 1) {
          // Serves until "die" ends the process; the wait only bounds a broken test.
          store.wait({"never"}, 30s);
          return;
        }
        EXPECT_EQ(agent.rpc_sync<int64_t>("w1", "ping"), 1);
        Future<int64_t> a = agent.rpc_async<int64_t>("w1", "ping", CallOptions{.timeout = 25s});
        Future<int64_t> b = agent.rpc_async<int64_t>("w1", "die", CallOptions{.timeout = 25s});
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(b.wait(20s));
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
        const std::string text = error_text<NetworkError>([&] { b.value(); });
        EXPECT_NE(text.find("worker 'w1' (rank 1)"), std::string::npos) << text;
        EXPECT_TRUE(a.wait(1s));
        agent.shutdown(false);
      });
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  // Rank 1 ended inside "die", as planned.
  EXPECT_EQ(results.ranks[1].exit_code, 0) << results.summary();
}

TEST(RpcAgent, StartupChecksNamesOptionsAndMissingWorkers) {
  Registry reg;
  auto store = std::make_shared<c10d::HashStore>(5s);
  AgentOptions options = test_options(reg);
  EXPECT_THROW(make_tensorpipe_agent("bad name", 0, 1, store, options), InvalidArgument);
  EXPECT_THROW(make_tensorpipe_agent("", 0, 1, store, options), InvalidArgument);
  EXPECT_THROW(make_tensorpipe_agent("w0", 2, 2, store, options), InvalidArgument);
  AgentOptions bad = options;
  bad.rpc_timeout = 0ms;
  EXPECT_NE(error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("w0", 0, 1, store, bad);
            }).find("rpc_timeout must be > 0"),
            std::string::npos);
  bad = options;
  bad.channels = {"carrier-pigeon"};
  EXPECT_NE(error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("w0", 0, 1, store, bad);
            }).find("unknown channel 'carrier-pigeon'"),
            std::string::npos);
  bad = options;
  bad.device_maps["w1"] = {{Device::cpu(), Device::cuda(0)}};
  EXPECT_NE(error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("w0", 0, 1, store, bad);
            }).find("only CUDA devices are mapped"),
            std::string::npos);
  bad = options;
  bad.device_maps["w1"] = {{Device::cuda(0), Device::cuda(1)}, {Device::cuda(1), Device::cuda(1)}};
  EXPECT_NE(error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("w0", 0, 1, store, bad);
            }).find("one-to-one"),
            std::string::npos);
  bad = options;
  bad.device_maps["ghost"] = {{Device::cuda(0), Device::cuda(0)}};
  EXPECT_NE(error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("w0", 0, 1, std::make_shared<c10d::HashStore>(5s), bad);
            }).find("device_maps names worker 'ghost'"),
            std::string::npos);

  // A name is taken by the first rank that claims it.
  auto shared = std::make_shared<c10d::HashStore>(5s);
  AgentOptions quick = options;
  quick.join_timeout = 300ms;
  std::shared_ptr<RpcAgent> first;
  std::thread t([&] {
    try {
      first = make_tensorpipe_agent("same", 0, 2, shared, quick);
    } catch (const TimeoutError&) {
    }
  });
  t.join();  // rank 1 never came: rank 0 timed out naming it
  const std::string missing = error_text<TimeoutError>(
      [&] { make_tensorpipe_agent("other", 0, 2, std::make_shared<c10d::HashStore>(5s), quick); });
  EXPECT_NE(missing.find("workers that did not: [rank 1]"), std::string::npos) << missing;
  const std::string taken =
      error_text<InvalidArgument>([&] { make_tensorpipe_agent("same", 1, 2, shared, quick); });
  EXPECT_NE(taken.find("'same' is already taken by rank 0"), std::string::npos) << taken;
}

// A handler registered with a chooser runs each request where the chooser says: inline on
// the receiving I/O thread (where run_after_reply refuses, so nothing heavy follows the reply
// there) or on the pool ("rpc-N", where it is accepted). A chooser that throws leaves the
// request to the pool; an empty chooser is refused at registration.
TEST(RpcAgent, AHandlersChooserPicksWhereEachRequestRuns) {
  Registry reg;
  Agents agents = start_agents(2, test_options(reg));
  agents[1]->register_handler(
      150, "chosen",
      [](const CallContext&, const Request&) {
        const bool after = run_after_reply([] {});
        return make_ready_future(Value::list({Value(this_thread_name()), Value(after)}));
      },
      [](const Request& request) {
        if (request.payload == Bytes{9}) throw std::runtime_error("chooser failed");
        return request.payload == Bytes{1} ? Execution::kInline : Execution::kPool;
      });
  auto where = [&](uint8_t byte) {
    Request r;
    r.handler = 150;
    r.payload = Bytes{byte};
    Value reply = agents[0]->send("w1", r).get(10s);
    return std::make_pair(reply.as_list()[0].as_string(), reply.as_list()[1].as_bool());
  };
  const auto [inline_thread, inline_after] = where(1);
  EXPECT_NE(inline_thread.rfind("rpc-", 0), 0u) << inline_thread;
  EXPECT_FALSE(inline_after) << "run_after_reply accepted work on an I/O thread";
  const auto [pool_thread, pool_after] = where(2);
  EXPECT_EQ(pool_thread.rfind("rpc-", 0), 0u) << pool_thread;
  EXPECT_TRUE(pool_after);
  const auto [thrown_thread, thrown_after] = where(9);
  EXPECT_EQ(thrown_thread.rfind("rpc-", 0), 0u) << thrown_thread;
  EXPECT_TRUE(thrown_after);
  const std::string empty = error_text<InvalidArgument>([&] {
    agents[1]->register_handler(
        151, "no chooser",
        [](const CallContext&, const Request&) { return make_ready_future(Value()); },
        ExecutionChooser());
  });
  EXPECT_NE(empty.find("empty execution chooser"), std::string::npos) << empty;
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc

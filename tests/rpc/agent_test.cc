// The TensorPipe agent: calls between workers (ranks as threads, several agents in one
// process, and ranks as processes where a peer dies), typed results checked against values
// worked out here, every error of the call path, handlers and interceptors, malformed
// messages from a raw TensorPipe peer, timeouts, and graceful and forced shutdown.
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/log_capture.h"
#include "support/sync.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using Agents = std::vector<std::shared_ptr<RpcAgent>>;

std::string worker_name(int rank) {
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

AgentOptions test_options(Registry& reg) {
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
AgentOptions lending_options(Registry& reg) {
  AgentOptions o = test_options(reg);
  o.transports = {"local", "tcp"};
  return o;
}

// Starts `n` agents on one store, concurrently (each waits for all).
Agents start_agents(int n, const AgentOptions& options,
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
std::vector<std::string> shutdown_all(const Agents& agents) {
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

void expect_clean_shutdown(const Agents& agents) {
  for (const std::string& e : shutdown_all(agents))
    EXPECT_EQ(e, "");
}

template <typename E, typename F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "(no exception)";
}

void register_basics(Registry& reg) {
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
// peers' first messages arrive on the same threads (connecting once held the agent's lock
// across TensorPipe's connect(), which can run another connection's callback in place, and
// a worker deadlocked on itself).
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
// wins, the others are spare. The peer must go on accepting connections afterwards (a
// spare pipe closed too early once stopped its listener), which w2 checks by calling it.
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

TEST(RpcAgent, TensorsKeepDtypeShapeAndValuesIncludingStridedAndEmpty) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  RpcAgent& w0 = *agents[0];
  // A transposed (non-contiguous) view travels as its logical contents.
  Tensor m = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor back = w0.rpc_sync<Tensor>("w1", "echo", m.transpose(0, 1));
  EXPECT_EQ(back.sizes(), (Shape{3, 2}));
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor ints = tensor<int64_t>({-7, 1LL << 40}, {2, 1});
  Tensor ints_back = w0.rpc_sync<Tensor>("w1", "echo", ints);
  EXPECT_EQ(ints_back.dtype(), kInt64);
  EXPECT_EQ(ints_back.sizes(), (Shape{2, 1}));
  EXPECT_EQ(ints_back.to_vector<int64_t>(), (std::vector<int64_t>{-7, 1LL << 40}));
  Tensor none = zeros({0, 4});
  Tensor none_back = w0.rpc_sync<Tensor>("w1", "echo", none);
  EXPECT_EQ(none_back.sizes(), (Shape{0, 4}));
  // 4 MiB: the bytes arrive intact (sum of 0..n-1 computed here).
  const int64_t n = 1 << 20;
  Tensor big = arange(0, n, 1, kFloat64);
  Tensor big_back = w0.rpc_sync<Tensor>("w1", "echo", big);
  EXPECT_DOUBLE_EQ(sum(big_back).item<double>(), static_cast<double>(n) * (n - 1) / 2);
  expect_clean_shutdown(agents);
}

// A broadcast view (the gradient of a sum is one) travels as its compact data and arrives as
// the full, contiguous tensor: here 1 MiB of float32 that is one number, and a row repeated.
TEST(RpcAgent, BroadcastTensorsTravelCompactAndArriveWhole) {
  Registry reg;
  register_basics(reg);
  // What arrived: its sum, and whether it is a whole contiguous tensor of that shape.
  reg.def("arrived", [](const Tensor& t) {
    return std::vector<double>{sum(t).item<double>(), t.is_contiguous() ? 1.0 : 0.0,
                               static_cast<double>(t.numel())};
  });
  AgentOptions options = lending_options(reg);
  options.direct_copy_min_bytes = 256u << 10;
  Agents agents = start_agents(2, options);
  RpcAgent& w0 = *agents[0];
  const AgentMetrics before = w0.metrics();
  Tensor filled = full({}, Scalar(2.5), kFloat32).expand({512, 512});
  EXPECT_EQ(w0.rpc_sync<std::vector<double>>("w1", "arrived", filled),
            (std::vector<double>{2.5 * 512 * 512, 1.0, 512.0 * 512}));
  Tensor row = tensor<double>({1, 2, 3}, {1, 3}).expand({4, 3});
  Tensor rows = w0.rpc_sync<Tensor>("w1", "echo", row);
  EXPECT_EQ(rows.sizes(), (Shape{4, 3}));
  EXPECT_EQ(rows.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
  // The 1 MiB one was not lent: four bytes travelled. A whole tensor of that size is.
  EXPECT_EQ(w0.metrics().tensors_lent, before.tensors_lent);
  EXPECT_EQ(w0.rpc_sync<std::vector<double>>("w1", "arrived", filled.contiguous()),
            (std::vector<double>{2.5 * 512 * 512, 1.0, 512.0 * 512}));
  EXPECT_EQ(w0.metrics().tensors_lent, before.tensors_lent + 1);
  // A lent reply of 512 KiB (copied where it arrives) and one of 2 MiB (copied on the pool).
  for (int64_t n : {int64_t{128} << 10, int64_t{512} << 10}) {
    const uint64_t copied = w0.metrics().tensors_copied_in;
    Tensor big = w0.rpc_sync<Tensor>("w1", "echo", arange(0, n, 1, kFloat32));
    EXPECT_EQ(w0.metrics().tensors_copied_in, copied + 1) << n;
    EXPECT_DOUBLE_EQ(sum(big.to(kFloat64)).item<double>(), static_cast<double>(n) * (n - 1) / 2);
  }
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
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (dropped() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
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

std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
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
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(agents[0]->metrics().shutting_down && agents[1]->metrics().shutting_down) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_TRUE(agents[0]->metrics().shutting_down && agents[1]->metrics().shutting_down);
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

// Runs `body` in two worker processes that meet through a FileStore in a fresh directory,
// each with an agent on `reg`.
test::RankResults run_two_worker_processes(
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

// x[i] == i + offset exactly (float32 holds every integer below 2^24).
bool holds_arange(const Tensor& t, int64_t n, float scale, float offset) {
  if (t.dtype() != kFloat32 || t.sizes() != Shape{n}) return false;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != scale * static_cast<float>(i) + offset) return false;
  }
  return true;
}

// Large tensors between two agents that can read each other's memory are lent: the receiver
// copies them straight out of the sender (arguments and results alike), every loan is
// released, and the values arrive intact, including sizes that do not split evenly into
// copy pieces and several lent tensors in one message.
TEST(RpcAgent, LargeTensorsAreLentAndCopiedStraightFromTheSender) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, lending_options(reg));
  const int64_t n = 1'000'003;  // ~4 MB: several copy pieces, the last one short
  const Tensor a = arange(n, TensorOptions{kFloat32});
  const Tensor b = add(arange(n, TensorOptions{kFloat32}), 1.0);
  const Tensor sum = agents[0]->rpc_sync<Tensor>("w1", "add", a, b);
  EXPECT_TRUE(holds_arange(sum, n, 2.0f, 1.0f));
  // Below the threshold: sent through TensorPipe as before.
  const Tensor small = arange(1000, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", small), 1000, 1.0f, 0.0f));
  const AgentMetrics caller = agents[0]->metrics();
  EXPECT_EQ(caller.tensors_lent, 2u);  // a and b
  EXPECT_EQ(caller.bytes_lent, 2u * 4u * static_cast<uint64_t>(n));
  EXPECT_EQ(caller.tensors_copied_in, 1u);  // the result
  // The callee released a and b before it ran "add", so before its reply came.
  EXPECT_EQ(caller.loans_outstanding, 0);
  expect_clean_shutdown(agents);
  // Graceful shutdown waits for loans: the caller has released the result by now.
  EXPECT_EQ(agents[1]->metrics().loans_outstanding, 0);
  EXPECT_EQ(agents[1]->metrics().tensors_lent, 1u);
  EXPECT_EQ(agents[1]->metrics().tensors_copied_in, 2u);
}

// Tensors below direct_copy_min_bytes between workers that talk over the local transport go
// through its shared-memory rings (the "ring" channel), in both directions: one smaller than
// a ring (1 MiB) and one four times its size (written as the reader drains it). Without "ring"
// among the channels they take another one and arrive the same. (xth is left out: these agents
// share a process, and xth would carry everything.)
TEST(RpcAgent, TensorsBetweenLocalPeersGoThroughTheRings) {
  Registry reg;
  register_basics(reg);
  const int64_t small = 48 << 10;  // 192 KiB
  const int64_t large = 1 << 20;   // 4 MiB
  for (const bool ring : {true, false}) {
    AgentOptions o = test_options(reg);
    o.channels = ring ? std::vector<std::string>{"ring", "cma", "basic"}
                      : std::vector<std::string>{"cma", "basic"};
    o.direct_copy_min_bytes = 8u << 20;
    Agents agents = start_agents(2, o);
    const bool local = agents[0]->transport_to("w1") == "local";
    for (const int64_t n : {small, large}) {
      EXPECT_TRUE(holds_arange(
          agents[0]->rpc_sync<Tensor>("w1", "echo", arange(n, TensorOptions{kFloat32})), n, 1.0f,
          0.0f))
          << n << " floats, ring " << ring;
    }
    const uint64_t tensors = ring && local ? 2u : 0u;
    const uint64_t bytes = ring && local ? 4u * static_cast<uint64_t>(small + large) : 0u;
    for (const auto& agent : agents) {
      const AgentMetrics m = agent->metrics();
      EXPECT_EQ(m.tensors_through_rings, tensors) << agent->worker_info().name;
      EXPECT_EQ(m.bytes_through_rings, bytes) << agent->worker_info().name;
      EXPECT_EQ(m.tensors_lent, 0u);
    }
    expect_clean_shutdown(agents);
  }
}

// By default a tensor of exactly 1 MiB (512x512 float32) is not lent: between local peers it
// goes through the rings, where it measured faster than a direct copy (benchmarks.md). One
// element more and it is lent. Either way it arrives intact, in both directions.
TEST(RpcAgent, ByDefaultOnlyTensorsLargerThanOneMebibyteAreLent) {
  Registry reg;
  register_basics(reg);
  AgentOptions o = lending_options(reg);
  EXPECT_EQ(o.direct_copy_min_bytes, (size_t{1} << 20) + 1);
  o.channels = {"ring", "cma", "basic"};  // not xth: these agents share a process
  Agents agents = start_agents(2, o);
  const bool local = agents[0]->transport_to("w1") == "local";
  const int64_t mib = int64_t{1} << 18;  // float32 elements in 1 MiB
  const Tensor exact = arange(mib, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", exact), mib, 1.0f, 0.0f));
  for (const auto& agent : agents) {
    const AgentMetrics m = agent->metrics();
    EXPECT_EQ(m.tensors_lent, 0u) << agent->worker_info().name;
    EXPECT_EQ(m.tensors_through_rings, local ? 1u : 0u) << agent->worker_info().name;
  }
  const Tensor larger = arange(mib + 1, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", larger), mib + 1, 1.0f, 0.0f));
  EXPECT_EQ(agents[0]->metrics().tensors_lent, 1u);  // the argument
  EXPECT_EQ(agents[1]->metrics().tensors_lent, 1u);  // the echoed result
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, DirectCopiesCanBeTurnedOffOrRaisedAboveATensor) {
  Registry reg;
  register_basics(reg);
  const int64_t n = 300'000;  // 1.2 MB
  const Tensor a = arange(n, TensorOptions{kFloat32});
  for (int variant = 0; variant < 2; ++variant) {
    AgentOptions o = test_options(reg);
    if (variant == 0) {
      o.direct_copy_threads = 0;
    } else {
      o.direct_copy_min_bytes = 8u << 20;
    }
    Agents agents = start_agents(2, o);
    EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", a), n, 1.0f, 0.0f));
    EXPECT_EQ(agents[0]->metrics().tensors_lent, 0u);
    EXPECT_EQ(agents[1]->metrics().tensors_lent, 0u);
    expect_clean_shutdown(agents);
  }
  AgentOptions bad = test_options(reg);
  bad.direct_copy_threads = 65;
  EXPECT_NE(error_text<InvalidArgument>([&] {
              start_agents(1, bad);
            }).find("direct_copy_threads must be in [0, 64], got 65"),
            std::string::npos);
}

// Between processes: the sender's memory is another address space, read with
// process_vm_readv; the peer's result comes back the same way.
TEST(RpcAgent, LargeTensorsAreLentBetweenProcesses) {
  Registry reg;
  register_basics(reg);
  test::RankResults results = run_two_worker_processes(
      "lend", reg,
      [](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          const int64_t n = 2'000'001;
          const Tensor a = arange(n, TensorOptions{kFloat32});
          for (int i = 0; i < 3; ++i) {
            const Tensor r = agent.rpc_sync<Tensor>("w1", "scale", a, 3.0);
            EXPECT_TRUE(holds_arange(r, n, 3.0f, 0.0f));
          }
          const AgentMetrics m = agent.metrics();
          EXPECT_EQ(m.tensors_lent, 3u);
          EXPECT_EQ(m.tensors_copied_in, 3u);
          EXPECT_EQ(m.bytes_copied_in, 3u * 4u * static_cast<uint64_t>(n));
        }
        agent.shutdown();
        EXPECT_EQ(agent.metrics().loans_outstanding, 0);
      },
      lending_options);
  EXPECT_PRED_FORMAT1(test::AllRanksOk, results);
}

TEST(RpcAgent, OverTcpAloneNothingIsLentAndLargeTensorsStillArrive) {
  Registry reg;
  register_basics(reg);
  AgentOptions o = test_options(reg);
  o.transports = {"tcp"};
  Agents agents = start_agents(2, o);
  const int64_t n = 1'000'003;
  const Tensor a = arange(n, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", a), n, 1.0f, 0.0f));
  for (auto& agent : agents) {
    EXPECT_EQ(agent->metrics().tensors_lent, 0u) << agent->worker_info().name;
    EXPECT_EQ(agent->metrics().tensors_copied_in, 0u) << agent->worker_info().name;
  }
  expect_clean_shutdown(agents);
}

// The address a worker published, read back from the store.
std::string published_url(c10d::Store& store, int rank) {
  std::istringstream in(c10d::to_string(store.get("rpc/1/worker/" + std::to_string(rank))));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("url ", 0) == 0) return line.substr(4);
  }
  return "";
}

TEST(RpcAgent, MalformedMessagesGetAnErrorReplyOrLoseTheirConnection) {
  Registry reg;
  register_basics(reg);
  const std::vector<std::string> o_transports = test_options(reg).transports;
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents = start_agents(1, test_options(reg), store);
  const std::string url = published_url(*store, 0);
  ASSERT_FALSE(url.empty());

  namespace tp = tensorpipe;
  auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("intruder"));
  context->registerTransport(0, "tcp", transport::create_stream_context({}));
  context->registerChannel(0, "basic", tp::channel::basic::create());

  // 1. A request announcing a tensor it does not send: an error reply with its id, then
  //    the connection closes.
  {
    auto pipe = context->connect(url);
    Request req;
    req.id = 42;
    req.function = "echo";
    req.args = {Value(ones({8192}))};  // 32 KiB: travels beside the envelope
    EncodedMessage encoded = encode(Envelope{req});
    tp::Message message;
    message.metadata = encoded.payload;  // and no tensors
    test::CountdownLatch done(1);
    std::string reply_payload;
    std::string read_error;
    pipe->write(std::move(message), [](const tp::Error&) {});
    pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor descriptor) {
      if (error) {
        read_error = error.what();
        done.count_down();
        return;
      }
      reply_payload = descriptor.metadata;
      pipe->read(tp::Allocation{}, [&](const tp::Error&) { done.count_down(); });
    });
    ASSERT_TRUE(done.wait(10s));
    ASSERT_EQ(read_error, "");
    Envelope reply = decode(reply_payload, {});
    const Response& response = std::get<Response>(reply.body);
    EXPECT_EQ(response.id, 42u);
    const ErrorReply& err = std::get<ErrorReply>(response.result);
    EXPECT_EQ(err.kind, ErrorKind::kInvalidArgument);
    EXPECT_TRUE(err.rejected);
    EXPECT_NE(err.message.find("1 tensors announced, 0 sent"), std::string::npos) << err.message;
    pipe->close();
  }
  // 2. A request with a forged loan: the worker names no memory to read for an unknown
  //    peer, refuses a token its lender never issued, and answers with a NetworkError.
  for (const char* as : {"intruder", "w0"}) {
    auto forger = std::make_shared<tp::Context>(tp::ContextOptions().name(as));
    // "w0" claims that name in its handshake too (without a secret the store's record backs
    // it); the intruder claims nothing and is served as an outsider.
    transport::StreamOptions forger_options;
    forger_options.name = as;
    if (std::string(as) == "w0") {
      forger_options.identity = [] { return transport::PeerIdentity{"w0", 0, 0}; };
    }
    forger->registerTransport(0, "tcp", transport::create_stream_context(forger_options));
    forger->registerChannel(0, "basic", tp::channel::basic::create());
    auto pipe = forger->connect(url);
    Request req;
    req.id = 43;
    req.function = "echo";
    req.args = {Value(ones({1 << 20}))};
    EncodedMessage encoded =
        encode(Envelope{req}, nullptr, kDefaultInlineTensorBytes, [](const Tensor&) {
          return Loan{3, 0x1234567};
        });
    ASSERT_TRUE(encoded.tensors.empty());
    tp::Message message;
    message.metadata = encoded.payload;
    test::CountdownLatch done(1);
    std::string reply_payload;
    pipe->write(std::move(message), [](const tp::Error&) {});
    // A release comes first (the forged loans are given back), then the reply.
    std::function<void()> read_one = [&] {
      pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor descriptor) {
        if (error) {
          done.count_down();
          return;
        }
        std::string payload = descriptor.metadata;
        pipe->read(tp::Allocation{}, [&, payload](const tp::Error&) {
          if (std::holds_alternative<Response>(decode(payload, {}).body)) {
            reply_payload = payload;
            done.count_down();
          } else {
            read_one();
          }
        });
      });
    };
    read_one();
    ASSERT_TRUE(done.wait(10s));
    ASSERT_FALSE(reply_payload.empty()) << as;
    const Response response = std::get<Response>(decode(reply_payload, {}).body);
    EXPECT_EQ(response.id, 43u);
    const ErrorReply& err = std::get<ErrorReply>(response.result);
    EXPECT_EQ(err.kind, ErrorKind::kNetwork);
    EXPECT_NE(err.message.find("could not copy the tensors lent by worker"), std::string::npos)
        << err.message;
    // Nothing is read, wherever the loan points: an outsider's memory is never read, and a
    // claim of w0 over tcp names no process (over tcp alone, no worker's memory is read).
    const bool local =
        std::find(o_transports.begin(), o_transports.end(), "local") != o_transports.end();
    EXPECT_NE(err.message.find(std::string(as) == "w0" && local
                                   ? "no local connection with it names its process"
                                   : "cannot be read from here"),
              std::string::npos)
        << err.message;
    pipe->close();
    forger->close();
    forger->join();
  }
  // 3. Noise: the connection is dropped.
  {
    auto pipe = context->connect(url);
    tp::Message message;
    message.metadata = std::string("\xff\xff\x01 not a protobuf \x00\x07", 20);
    pipe->write(std::move(message), [](const tp::Error&) {});
    test::CountdownLatch done(1);
    bool failed = false;
    pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor) {
      failed = static_cast<bool>(error);
      done.count_down();
    });
    ASSERT_TRUE(done.wait(10s));
    EXPECT_TRUE(failed);
  }
  context->close();
  context->join();
  // The worker still serves everyone else.
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w0", "concat", std::string("o"), std::string("k")),
            "ok");
  expect_clean_shutdown(agents);
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

TEST(RpcAgent, CudaTensorsLandOnTheMappedDevice) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg;
  reg.def("where", [](const Tensor& t) { return t.device().str(); });
  reg.def("echo", [](const Tensor& t) { return t; });
  AgentOptions options = test_options(reg);
  options.device_maps["w1"] = {{Device::cuda(0), Device::cuda(0)}};
  Agents agents = start_agents(2, options);
  Tensor x = tensor<float>({1, 2, 3}, {3}).to(Device::cuda(0));
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "where", x), "cuda:0");
  Tensor back = agents[0]->rpc_sync<Tensor>("w1", "echo", x);
  EXPECT_TRUE(back.is_cuda());
  EXPECT_EQ(back.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  // w1 has no map back to w0 for its own sends.
  const std::string unmapped =
      error_text<InvalidArgument>([&] { agents[1]->rpc_sync<std::string>("w0", "where", x); });
  EXPECT_NE(unmapped.find("has no entry for cuda:0"), std::string::npos) << unmapped;
  expect_clean_shutdown(agents);
}

TEST(RpcFreeFunctions, InitCallAndShutdownTheDefaultAgent) {
  Registry& reg = registry();  // the free functions use the process's default registry
  if (!reg.has_function("gw_test_mul")) {
    reg.def("gw_test_mul", [](int64_t a, int64_t b) { return a * b; });
  }
  EXPECT_THROW(default_agent(), Error);
  const auto dir =
      std::filesystem::temp_directory_path() / ("gradwire-rpc-init-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  AgentOptions options;
  options.init_method = "file://" + (dir / "store").string();
  options.join_timeout = 10s;
  init_rpc("solo", 0, 1, options);
  EXPECT_THROW(init_rpc("again", 0, 1, options), Error);
  EXPECT_EQ(get_worker_info().name, "solo");
  EXPECT_EQ(rpc_sync<int64_t>("solo", "gw_test_mul", int64_t{6}, int64_t{7}), 42);
  EXPECT_EQ(rpc_async<int64_t>(0, "gw_test_mul", int64_t{3}, int64_t{5}).get(10s), 15);
  EXPECT_EQ(
      rpc_sync<int64_t>("solo", "gw_test_mul", CallOptions{.timeout = 5s}, int64_t{2}, int64_t{2}),
      4);
  shutdown();
  EXPECT_THROW(rpc_sync<int64_t>("solo", "gw_test_mul", int64_t{1}, int64_t{1}), Error);
  EXPECT_THROW(shutdown(), Error);
  std::filesystem::remove_all(dir);
}

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
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (agents[1]->metrics().running_handlers > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
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

// ---------------------------------------------------------------- faults

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
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (echoed == 0 && std::chrono::steady_clock::now() < deadline) {
    try {
      echoed = agents[0]->rpc_sync<Tensor>("w1", "echo", ones({8192})).numel();
    } catch (const NetworkError&) {
      // Sent on the closing connection before its loss was seen: the next call reconnects.
    }
  }
  EXPECT_EQ(echoed, 8192);
  expect_clean_shutdown(agents);
}

// ---------------------------------------------------------------- documented paths

class ThrowingInterceptor : public Interceptor {
 public:
  void on_outgoing_response(const WorkerInfo&, const Request& request, Response&) override {
    if (request.function == "spoil_reply") throw InvalidArgument("reply spoiled on the way out");
  }
  void on_incoming_response(const WorkerInfo&, Response&, const std::shared_ptr<void>&) override {
    if (refuse_replies) throw TimeoutError("reply refused on the way in");
  }
  std::atomic<bool> refuse_replies{false};
};

TEST(RpcAgentPaths, InterceptorsThrowingOnEitherSideOfTheReply) {
  Registry reg;
  register_basics(reg);
  reg.def("spoil_reply", [] { return int64_t{1}; });
  Agents agents = start_agents(2, test_options(reg));
  auto sender = std::make_shared<ThrowingInterceptor>();
  auto receiver = std::make_shared<ThrowingInterceptor>();
  agents[0]->add_interceptor(sender);
  agents[1]->add_interceptor(receiver);
  // The receiver's interceptor spoils the reply: the caller gets that error, from w1.
  try {
    agents[0]->rpc_sync<int64_t>("w1", "spoil_reply");
    FAIL() << "expected a RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
    EXPECT_NE(std::string(e.what()).find("reply spoiled on the way out"), std::string::npos);
  }
  // The caller's interceptor refuses a reply: the future fails with its error, as thrown.
  sender->refuse_replies = true;
  EXPECT_THROW(agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}),
               TimeoutError);
  sender->refuse_replies = false;
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}), 1);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentPaths, AHandlerReturningAPendingFutureRepliesWhenItCompletes) {
  Registry reg;
  Agents agents = start_agents(2, test_options(reg));
  Future<Value> answer;
  test::CountdownLatch asked{1};
  agents[1]->register_handler(300, "later", [&](const CallContext&, const Request&) {
    asked.count_down();
    return answer;  // completed by another thread, after the handler returned
  });
  Request r;
  r.handler = 300;
  Future<Value> reply = agents[0]->send("w1", r);
  ASSERT_TRUE(asked.wait(10s));
  EXPECT_FALSE(reply.completed());
  std::thread completer([&] { answer.set_value(Value(std::string("done"))); });
  EXPECT_EQ(reply.get(10s).as_string(), "done");
  completer.join();
  expect_clean_shutdown(agents);
}

TEST(RpcAgentPaths, AMessageOverTheReceiversTensorLimitIsRefused) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = test_options(reg);
  options.limits.max_tensor_bytes = 64 << 10;
  options.direct_copy_threads = 0;
  Agents agents = start_agents(2, options);
  EXPECT_EQ(agents[0]->rpc_sync<Tensor>("w1", "echo", ones({8192})).numel(), 8192);
  const std::string text =
      error_text<Error>([&] { agents[0]->rpc_sync<Tensor>("w1", "echo", ones({32768})); });
  // The receiver refuses it and closes the connection, which the sender may see while the
  // message is still being written.
  EXPECT_TRUE(text.find("more than the limit of 65536") != std::string::npos ||
              text.find("the connection to it was lost") != std::string::npos ||
              text.find("to worker 'w1' (rank 1) could not be sent") != std::string::npos)
      << text;
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
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!agents[0]->metrics().shutting_down && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_TRUE(agents[0]->metrics().shutting_down);
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

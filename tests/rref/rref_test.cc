// rref/: remote references across three workers, as threads of one process and as
// processes — creation, to_here, method proxies, references passed on in every pattern
// (each ending with the owner's count of live values back at zero), many in flight, and
// every error the module promises.
#include "gradwire/rref/rref.h"

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
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/fault_injection.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/eventually.h"
#include "support/harness.h"
#include "support/sync.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using rpc::CallContext;
using rpc::CallOptions;
using rpc::Registry;
using rpc::RpcAgent;
using rref::RRef;
using test::Agents;
using test::error_text;
using test::worker_name;

void shutdown_all(const Agents& agents) {
  test::shutdown_agents(agents);
}
rpc::AgentOptions test_options(Registry& reg) {
  return test::agent_options(reg);
}

rpc::CallContext detail_sending(RpcAgent& agent) {
  return rpc::CallContext(&agent, agent.worker_info(), 0, CallContext::Clock::time_point::max());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A counter whose methods run concurrently: thread-safe by itself.
class Counter {
 public:
  explicit Counter(int64_t start) : value_(start) {}
  int64_t add(int64_t n) { return value_ += n; }
  int64_t get() const { return value_.load(); }

 private:
  std::atomic<int64_t> value_;
};

// Not thread-safe: registered .serialised().
class Tally {
 public:
  explicit Tally(int64_t start) : value_(start) {}
  int64_t add(int64_t n) {
    const int64_t before = value_;
    std::this_thread::yield();  // widens the window a lost update would need
    value_ = before + n;
    return value_;
  }
  int64_t get() const { return value_; }

 private:
  int64_t value_;
};

struct Point {
  double x{0}, y{0};
};

// Takes a while to build: its creation outlives a short call timeout.
class SlowBox {
 public:
  explicit SlowBox(int64_t n) : n_(n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  int64_t get() const { return n_; }

 private:
  int64_t n_;
};

// Copyable; its ValueConverter counts the copies the owner makes off its pool (user code
// must never run on an I/O thread).
struct Spot {
  int64_t n{0};
};
std::atomic<ThreadPool*> g_spot_pool{nullptr};  // the owner's pool
std::atomic<int> g_spot_copies{0};
std::atomic<int> g_spot_copies_off_pool{0};

// Has a ValueConverter but is not registered .copyable(): it stays on its owner.
struct Label {
  explicit Label(std::string t) : text(std::move(t)) {}
  std::string text;
};

}  // namespace
}  // namespace gradwire

template <>
struct gradwire::rpc::ValueConverter<gradwire::Point> {
  static Value to(const gradwire::Point& p) { return to_value(std::pair(p.x, p.y)); }
  static gradwire::Point from(const Value& v, const Where& where) {
    auto [x, y] = from_value<std::pair<double, double>>(v, where);
    return gradwire::Point{x, y};
  }
  static std::string name() { return "Point"; }
};

template <>
struct gradwire::rpc::ValueConverter<gradwire::Spot> {
  static Value to(const gradwire::Spot& s) {
    gradwire::ThreadPool* pool = gradwire::g_spot_pool.load();
    ++gradwire::g_spot_copies;
    if (pool == nullptr || !pool->is_worker_thread()) ++gradwire::g_spot_copies_off_pool;
    return Value(s.n);
  }
  static gradwire::Spot from(const Value& v, const Where& where) {
    return gradwire::Spot{from_value<int64_t>(v, where)};
  }
  static std::string name() { return "Spot"; }
};

template <>
struct gradwire::rpc::ValueConverter<gradwire::Label> {
  static Value to(const gradwire::Label& l) { return Value(l.text); }
  static gradwire::Label from(const Value& v, const Where& where) {
    return gradwire::Label(from_value<std::string>(v, where));
  }
  static std::string name() { return "Label"; }
};

namespace gradwire {
namespace {

// A value every worker can check: [n, n + 1, ..., n + 3] as float32.
Tensor make_tensor(int64_t n) {
  return add(arange(4, TensorOptions{}.dtype(kFloat32)), static_cast<double>(n));
}
double tensor_sum(const Tensor& t) {
  return sum(t, kFloat64).item<double>();
}

// Everything the tests call, registered on one registry.
void define(Registry& reg) {
  reg.def("make", [](int64_t n) { return make_tensor(n); });
  reg.def("square", [](int64_t n) { return n * n; });
  reg.def("fail", [](int64_t) -> Tensor { throw std::runtime_error("make refused: bad seed"); });
  reg.def("sum_of", [](const RRef<Tensor>& r) { return tensor_sum(r.to_here()); });
  // On the owner the reference is the owner's own.
  reg.def("sum_local", [](const RRef<Tensor>& r) {
    if (!r.is_owner()) throw std::runtime_error("not the owner");
    return tensor_sum(*r.local_value());
  });
  reg.def("sum_all", [](const std::vector<RRef<Tensor>>& refs) {
    double s = 0;
    for (const auto& r : refs)
      s += tensor_sum(r.to_here());
    return s;
  });
  reg.def("sum_map", [](const std::map<std::string, RRef<Tensor>>& refs) {
    double s = 0;
    for (const auto& [k, r] : refs)
      s += tensor_sum(r.to_here());
    return s;
  });
  // Values made and owned here, returned as references.
  reg.def("make_owned", [](const CallContext& ctx, int64_t n) {
    std::vector<RRef<Tensor>> out;
    for (int64_t i = 0; i < n; ++i)
      out.push_back(rref::remote<Tensor>(*ctx.agent(), ctx.agent()->worker_info(), "make", i));
    return out;
  });
  // A reference to another worker's value, passed on (a fork of a fork).
  reg.def("forward", [](const RRef<Tensor>& r) { return r; });
  reg.def("echo_rref", [](const RRef<Counter>& r) { return r; });
  reg.def_class<Counter>("Counter")
      .ctor<int64_t>()
      .method("add", &Counter::add)
      .method("get", &Counter::get)
      .method("boom", [](Counter&) -> int64_t { throw std::runtime_error("boom"); });
  reg.def_class<Tally>("Tally")
      .ctor<int64_t>()
      .method("add", &Tally::add)
      .method("get", &Tally::get)
      .serialised();
  reg.def_class<Point>("Point").ctor<double, double>().copyable();
  reg.def_class<Label>("Label").ctor<std::string>();
}

class RRefThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    define(reg_);
    // Every agent may be told to drop, delay or cut what it sends (no rule: nothing).
    rpc::AgentOptions options = test_options(reg_);
    options.faults = faults_;
    if (rpc_timeout_.count() > 0) options.rpc_timeout = rpc_timeout_;
    agents_ = test::start_agents(3, options);
  }
  void TearDown() override {
    if (!agents_.empty()) shutdown_all(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }
  // Every worker has nothing in flight, and the owner holds `live` values. With none left,
  // no worker holds a reference, a fork or a pending call either (checked while the agents
  // run: a shutdown drops whatever is left, so a check after it could not fail).
  void expect_settled(int owner, int64_t live = 0) {
    for (auto& a : agents_)
      rref::wait_idle(*a, 10s);
    EXPECT_TRUE(rref::wait_owned_values(w(owner), live, 10s))
        << "owner holds " << rref::metrics(w(owner)).owned_values << " values";
    const rref::RRefMetrics m = rref::metrics(w(owner));
    EXPECT_EQ(m.owned_values, live);
    if (live == 0) {
      EXPECT_EQ(m.shared_values, 0);
      EXPECT_EQ(m.owned_forks, 0);
    }
    for (auto& a : agents_) {
      // A server lets go of the references a request carried just after its reply left.
      const bool settled = eventually(
          [&] {
            const rref::RRefMetrics n = rref::metrics(*a);
            return n.pending_children == 0 && n.messages_in_flight == 0 &&
                   (live > 0 || (n.user_references == 0 && n.owned_values == 0)) &&
                   a->metrics().pending_calls == 0;
          },
          10s);
      const rref::RRefMetrics n = rref::metrics(*a);
      EXPECT_TRUE(settled) << a->worker_info().describe() << ": " << n.pending_children
                           << " pending children, " << n.messages_in_flight
                           << " messages in flight, " << n.user_references << " user references, "
                           << n.owned_values << " owned values, " << a->metrics().pending_calls
                           << " pending calls";
    }
  }

  Registry reg_;
  std::shared_ptr<rpc::FaultInjector> faults_ = std::make_shared<rpc::FaultInjector>();
  std::chrono::milliseconds rpc_timeout_{0};  // 0: the test options' own
  Agents agents_;
};

// The same workers, whose protocol messages time out after one second.
class RRefShortTimeout : public RRefThreads {
 protected:
  RRefShortTimeout() { rpc_timeout_ = 1s; }
};

TEST_F(RRefThreads, RemoteValueArrivesWithToHere) {
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{5});
  EXPECT_EQ(r.owner().name, "w1");
  EXPECT_FALSE(r.is_owner());
  EXPECT_TRUE(r.creation().wait(10s));
  EXPECT_TRUE(r.confirmed_by_owner());
  Tensor t = r.to_here();
  EXPECT_EQ(t.sizes(), Shape{4});
  EXPECT_DOUBLE_EQ(tensor_sum(t), 5 + 6 + 7 + 8);
  EXPECT_EQ(rref::metrics(w(1)).owned_values, 1);
  EXPECT_EQ(rref::metrics(w(0)).user_references, 1);
  r = RRef<Tensor>();
  expect_settled(1);
  EXPECT_EQ(rref::metrics(w(0)).user_references, 0);
}

TEST_F(RRefThreads, RemoteToSelfIsAnOwnerReferenceWithoutAHop) {
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w0", "make", int64_t{1});
  EXPECT_TRUE(r.is_owner());
  EXPECT_TRUE(r.confirmed_by_owner());
  EXPECT_DOUBLE_EQ(tensor_sum(*r.local_value()), 1 + 2 + 3 + 4);
  EXPECT_DOUBLE_EQ(tensor_sum(r.to_here()), 10);
  RRef<Counter> c = rref::remote<Counter>(w(0), "w0", "Counter", int64_t{3});
  EXPECT_EQ(c.rpc_sync<int64_t>("add", int64_t{4}), 7);
  EXPECT_EQ(c.local_value()->get(), 7);
  EXPECT_EQ(c.remote<int64_t>("get").to_here(), 7);
  EXPECT_EQ(rref::metrics(w(0)).messages_in_flight, 0);
  r = {};
  c = {};
  expect_settled(0);
}

TEST_F(RRefThreads, ObjectsLiveOnTheOwnerAndProxiesCallThem) {
  RRef<Counter> c = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{10});
  EXPECT_EQ(c.rpc_sync<int64_t>("add", int64_t{5}), 15);
  EXPECT_EQ(c.rpc_async<int64_t>("add", int64_t{1}).get(10s), 16);
  RRef<int64_t> got = c.remote<int64_t>("get");
  EXPECT_EQ(got.to_here(), 16);
  EXPECT_EQ(got.owner().name, "w1");
  // The object on the owner is the one the proxies changed.
  RRef<Counter> echoed = w(0).rpc_sync<RRef<Counter>>("w1", "echo_rref", c);
  EXPECT_EQ(echoed.rpc_sync<int64_t>("get"), 16);
  echoed = {};
  got = {};
  c = {};
  expect_settled(1);
}

// Calls `add(1)` n times at once on the object `r` names, from wherever this runs.
template <typename C>
int64_t add_ones(const RRef<C>& r, int64_t n) {
  std::vector<Future<int64_t>> calls;
  for (int64_t i = 0; i < n; ++i)
    calls.push_back(r.template rpc_async<int64_t>("add", int64_t{1}));
  int64_t ok = 0;
  for (auto& f : calls)
    ok += f.wait(20s) && !f.has_error() ? 1 : 0;
  return ok;
}

TEST_F(RRefThreads, ConcurrentProxyCallsOnOneObject) {
  reg_.def("add_counter", [](const RRef<Counter>& r, int64_t n) { return add_ones(r, n); });
  reg_.def("add_tally", [](const RRef<Tally>& r, int64_t n) { return add_ones(r, n); });
  RRef<Counter> c = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{0});
  RRef<Tally> t = rref::remote<Tally>(w(0), "w1", "Tally", int64_t{0});
  ASSERT_TRUE(c.creation().wait(10s));
  ASSERT_TRUE(t.creation().wait(10s));
  // Two users (w0 here, w2 through its own fork) and the owner itself (w1 through its owner
  // reference), 100 calls each on both objects, all at once.
  std::vector<Future<int64_t>> remote_callers;
  for (const char* at : {"w2", "w1"}) {
    remote_callers.push_back(w(0).rpc_async<int64_t>(at, "add_counter", c, int64_t{100}));
    remote_callers.push_back(w(0).rpc_async<int64_t>(at, "add_tally", t, int64_t{100}));
  }
  EXPECT_EQ(add_ones(c, 100), 100);
  EXPECT_EQ(add_ones(t, 100), 100);
  for (auto& f : remote_callers)
    EXPECT_EQ(f.get(30s), 100);
  EXPECT_EQ(c.rpc_sync<int64_t>("get"), 300);
  // A serialised class loses no update although its methods are not thread-safe.
  EXPECT_EQ(t.rpc_sync<int64_t>("get"), 300);
  c = {};
  t = {};
  expect_settled(1);
}

TEST_F(RRefThreads, UserToOwnerArrivesAsTheOwnersOwnValue) {
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{2});
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w1", "sum_local", r), 2 + 3 + 4 + 5);
  r = {};
  expect_settled(1);
}

TEST_F(RRefThreads, UserToUserForkAndAForkOfAFork) {
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{3});
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w2", "sum_of", r), 3 + 4 + 5 + 6);
  // w2 hands its fork back to w0: a new reference to the same value.
  RRef<Tensor> back = w(0).rpc_sync<RRef<Tensor>>("w2", "forward", r);
  EXPECT_FALSE(back.is_owner());
  EXPECT_DOUBLE_EQ(tensor_sum(back.to_here()), 18);
  r = {};
  EXPECT_DOUBLE_EQ(tensor_sum(back.to_here()), 18);
  back = {};
  expect_settled(1);
}

TEST_F(RRefThreads, ReferencesReturnedFromAFunctionAndInsideContainers) {
  std::vector<RRef<Tensor>> owned =
      w(0).rpc_sync<std::vector<RRef<Tensor>>>("w1", "make_owned", int64_t{3});
  ASSERT_EQ(owned.size(), 3u);
  EXPECT_TRUE(rref::wait_owned_values(w(1), 3, 10s));
  double expect = 0;
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(owned[static_cast<size_t>(i)].owner().name, "w1");
    expect += static_cast<double>(4 * i + 6);
    EXPECT_DOUBLE_EQ(tensor_sum(owned[static_cast<size_t>(i)].to_here()),
                     static_cast<double>(4 * i + 6));
  }
  // The list to a third worker, and a map of them to the owner.
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w2", "sum_all", owned), expect);
  std::map<std::string, RRef<Tensor>> named{{"a", owned[0]}, {"b", owned[2]}};
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w1", "sum_map", named), 6 + 14);
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w2", "sum_map", named), 6 + 14);
  owned.clear();
  named.clear();
  expect_settled(1);
}

TEST_F(RRefThreads, DeletionRacingWithAForkNeverFreesEarly) {
  for (int i = 0; i < 30; ++i) {
    Future<double> seen;
    {
      RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{i});
      seen = w(0).rpc_async<double>("w2", "sum_of", r);
      // The only handle on w0 goes while its fork is on the way to w2.
    }
    EXPECT_DOUBLE_EQ(seen.get(20s), 4.0 * i + 6) << "round " << i;
  }
  expect_settled(1);
}

TEST_F(RRefThreads, AThousandRemoteCallsInFlight) {
  std::vector<RRef<int64_t>> refs;
  refs.reserve(1000);
  for (int64_t i = 0; i < 1000; ++i)
    refs.push_back(rref::remote<int64_t>(w(0), "w1", "square", i));
  std::vector<Future<int64_t>> values;
  for (auto& r : refs)
    values.push_back(r.to_here_async());
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(values[static_cast<size_t>(i)].get(30s), i * i);
  EXPECT_EQ(rref::metrics(w(1)).owned_values, 1000);
  refs.clear();
  values.clear();
  expect_settled(1);
}

TEST_F(RRefThreads, CopyableClassesComeHereAndOthersAreRefused) {
  RRef<Point> p = rref::remote<Point>(w(0), "w1", "Point", 1.5, -2.0);
  Point here = p.to_here();
  EXPECT_EQ(here.x, 1.5);
  EXPECT_EQ(here.y, -2.0);
  RRef<Label> l = rref::remote<Label>(w(0), "w1", "Label", std::string("kept"));
  std::string text = error_text<InvalidArgument>([&] { l.to_here(); });
  EXPECT_TRUE(contains(text, "'Label' are not copyable")) << text;
  // A result of the wrong type is named with the call it came from.
  RRef<Counter> c = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{1});
  text = error_text<InvalidArgument>([&] { c.rpc_sync<RRef<Counter>>("get"); });
  EXPECT_TRUE(contains(text, "Counter.get")) << text;
  p = {};
  l = {};
  c = {};
  expect_settled(1);
}

TEST_F(RRefThreads, ACreationThatThrewFailsEveryUseWithItsMessage) {
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "fail", int64_t{1});
  std::string text = error_text<RemoteError>([&] { r.to_here(); });
  EXPECT_TRUE(contains(text, "make refused: bad seed")) << text;
  EXPECT_TRUE(contains(text, "w1")) << text;
  EXPECT_THROW(r.creation().get(10s), RemoteError);
  RRef<Counter> c = rref::remote<Counter>(w(0), "w1", "Counter", std::string("not an int"));
  text = error_text<InvalidArgument>([&] { c.rpc_sync<int64_t>("get"); });
  EXPECT_TRUE(contains(text, "Counter(int)")) << text;
  EXPECT_TRUE(contains(text, "string")) << text;
  // A method that throws is a RemoteError, the object intact.
  RRef<Counter> ok = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{1});
  text = error_text<RemoteError>([&] { ok.rpc_sync<int64_t>("boom"); });
  EXPECT_TRUE(contains(text, "boom")) << text;
  EXPECT_EQ(ok.rpc_sync<int64_t>("get"), 1);
  r = {};
  c = {};
  ok = {};
  expect_settled(1);
}

TEST_F(RRefThreads, UnknownMethodsWrongArgumentsAndWrongTypesAreNamed) {
  RRef<Counter> c = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{0});
  std::string text = error_text<InvalidArgument>([&] { c.rpc_sync<int64_t>("nope"); });
  EXPECT_TRUE(contains(text, "Counter")) << text;
  EXPECT_TRUE(contains(text, "nope")) << text;
  text = error_text<InvalidArgument>([&] { c.rpc_sync<int64_t>("add", std::string("x")); });
  EXPECT_TRUE(contains(text, "Counter.add(int) -> int")) << text;
  EXPECT_TRUE(contains(text, "string")) << text;
  // The owner holds a Tensor; the caller asked for a string.
  RRef<std::string> wrong = rref::remote<std::string>(w(0), "w1", "make", int64_t{1});
  text = error_text<InvalidArgument>([&] { wrong.to_here(); });
  EXPECT_TRUE(contains(text, "returns Tensor, not string")) << text;
  // A received reference of another type than the parameter.
  text = error_text<InvalidArgument>([&] { w(0).rpc_sync<double>("w2", "sum_of", c); });
  EXPECT_TRUE(contains(text, "expected RRef<Tensor>, received RRef<Counter>")) << text;
  // local_value on a user, and as another type on the owner.
  text = error_text<InvalidArgument>([&] { c.local_value(); });
  EXPECT_TRUE(contains(text, "owned by 'w1' (rank 1)")) << text;
  RRef<Tensor> mine = rref::remote<Tensor>(w(0), "w0", "make", int64_t{0});
  text = error_text<InvalidArgument>([&] { RRef<int64_t>(mine.core_ptr()).local_value(); });
  EXPECT_TRUE(contains(text, "holds Tensor")) << text;
  c = {};
  wrong = {};
  mine = {};
  expect_settled(1);
}

TEST_F(RRefThreads, ToHerePastItsTimeoutIsATimeoutError) {
  test::CountdownLatch release(1);
  reg_.def("slow", [&release](int64_t n) {
    EXPECT_TRUE(release.wait(20s));
    return n;
  });
  RRef<int64_t> r = rref::remote<int64_t>(w(0), "w1", "slow", int64_t{7});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = error_text<TimeoutError>([&] { r.to_here(100ms); });
  EXPECT_TRUE(contains(text, "to_here")) << text;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  release.count_down();
  EXPECT_EQ(r.to_here(), 7);
  r = {};
  expect_settled(1);
}

// 24 remote() calls time out after 50 ms while their Creates wait for the owner's four pool
// threads (each constructor takes 300 ms). Each creator drops its reference at once, so its
// Delete reaches the owner before its Create: the owner must then count nothing for it.
TEST_F(RRefThreads, ADeleteNeverOvertakesItsCreate) {
  reg_.def_class<SlowBox>("SlowBox").ctor<int64_t>().method("get", &SlowBox::get);
  std::vector<RRef<SlowBox>> refs;
  for (int64_t i = 0; i < 24; ++i)
    refs.push_back(rref::remote<SlowBox>(w(0), "w1", "SlowBox", CallOptions{50ms}, i));
  for (auto& r : refs) {
    Future<void> created = r.creation();
    ASSERT_TRUE(created.wait(10s));
    EXPECT_THROW(created.value(), TimeoutError);
  }
  refs.clear();
  expect_settled(1);
  // The owner still serves creations as usual.
  RRef<SlowBox> kept = rref::remote<SlowBox>(w(0), "w1", "SlowBox", int64_t{7});
  EXPECT_EQ(kept.rpc_sync<int64_t>("get"), 7);
  kept = {};
  expect_settled(1);
}

// A call that times out gives up the forks it carried: its receiver, reached later, finds
// the value freed and its AddFork refused (the owner makes no placeholder for it that would
// never be filled, and the sender keeps no pending child).
TEST_F(RRefThreads, ATimedOutCallReleasesItsForksAndALateForkOfAFreedValueIsRefused) {
  test::CountdownLatch refused(1);
  std::mutex mutex;
  std::string seen;
  reg_.def("sum_or_record", [&](const RRef<Tensor>& r) {
    try {
      return tensor_sum(r.to_here(10s));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen = e.what();
      refused.count_down();
      throw;
    }
  });
  faults_->add({.action = rpc::FaultAction::kDelay,
                .from = "w0",
                .to = "w2",
                .kind = rpc::MessageKind::kRequest,
                .function = "sum_or_record",
                .delay = 500ms});
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  ASSERT_TRUE(r.creation().wait(10s));
  EXPECT_THROW(w(0).rpc_sync<double>("w2", "sum_or_record", CallOptions{100ms}, r), TimeoutError);
  EXPECT_EQ(rref::metrics(w(0)).pending_children, 0);
  r = {};
  // Freed before the delayed request reaches w2.
  EXPECT_TRUE(rref::wait_owned_values(w(1), 0, 10s));
  ASSERT_TRUE(refused.wait(10s));
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(contains(seen, "was freed")) << seen;
  }
  expect_settled(1);
  EXPECT_EQ(rref::metrics(w(2)).user_references, 0);
}

// Replies that arrive after their call timed out: the references they carry (forks the
// owner counted for the caller, and a fork a user made for it) are released all the same.
TEST_F(RRefThreads, ALateReplyStillReleasesTheReferencesItCarried) {
  for (const char* fn : {"make_owned", "forward"}) {
    faults_->add({.action = rpc::FaultAction::kDelay,
                  .kind = rpc::MessageKind::kReply,
                  .function = fn,
                  .delay = 400ms});
  }
  EXPECT_THROW(
      w(0).rpc_sync<std::vector<RRef<Tensor>>>("w1", "make_owned", CallOptions{100ms}, int64_t{3}),
      TimeoutError);
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{2});
  EXPECT_THROW(w(0).rpc_sync<RRef<Tensor>>("w2", "forward", CallOptions{100ms}, r), TimeoutError);
  r = {};
  expect_settled(1);
  for (auto& a : agents_) {
    const rref::RRefMetrics m = rref::metrics(*a);
    EXPECT_EQ(m.user_references, 0);
    EXPECT_EQ(m.owned_values, 0);
  }
}

// References converted for a message that never left: a later argument failed to convert,
// or the send threw before the interceptors saw the request. Their forks are given back.
TEST_F(RRefThreads, ReferencesInAMessageThatNeverLeftAreReleased) {
  reg_.def("sum_two", [](const RRef<Tensor>& a, const RRef<Tensor>& b) {
    return tensor_sum(a.to_here()) + tensor_sum(b.to_here());
  });
  RRef<Tensor> theirs = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  ASSERT_TRUE(theirs.creation().wait(10s));
  RRef<Tensor> mine = rref::make_local(w(0), make_tensor(2));
  RRef<Counter> counter = rref::remote<Counter>(w(0), "w1", "Counter", int64_t{0});
  ASSERT_TRUE(counter.creation().wait(10s));
  for (const RRef<Tensor>& r : {theirs, mine}) {
    // The second argument is an empty reference: it cannot be converted.
    EXPECT_THROW(w(0).rpc_async<double>("w2", "sum_two", r, RRef<Tensor>()), Error);
    EXPECT_THROW(rref::remote<double>(w(0), "w2", "sum_two", r, RRef<Tensor>()), Error);
    EXPECT_THROW(counter.rpc_async<int64_t>("add", r, RRef<Tensor>()), Error);
    // A negative timeout fails the send before any interceptor sees it.
    EXPECT_THROW(w(0).rpc_async<double>("w2", "sum_of", CallOptions{-1ms}, r), InvalidArgument);
    EXPECT_THROW(
        w(0).call("w2", "sum_of", {rpc::to_value(r, detail_sending(w(0)))}, CallOptions{-1ms}),
        InvalidArgument);
  }
  const rref::RRefMetrics m = rref::metrics(w(0));
  EXPECT_EQ(m.pending_children, 0);
  EXPECT_EQ(m.owned_forks, 0);
  EXPECT_EQ(m.shared_values, 0);
  // Both still work.
  EXPECT_DOUBLE_EQ(w(0).rpc_sync<double>("w2", "sum_two", theirs, mine), 10 + 14);
  theirs = {};
  mine = {};
  counter = {};
  expect_settled(1);
  expect_settled(0);
}

// Refuses every reply to `function` after the interceptors before it saw it, as a reply
// that fails to encode is refused.
class RefuseReplies : public rpc::Interceptor {
 public:
  explicit RefuseReplies(std::string function) : function_(std::move(function)) {}
  void on_outgoing_response(const rpc::WorkerInfo&, const rpc::Request& request,
                            rpc::Response&) override {
    if (request.function == function_) throw Error("reply refused by the test");
  }

 private:
  std::string function_;
};

// A reply whose references were counted for the caller but that was never written: the
// caller gets an error reply, and the owner counts nothing for it.
TEST_F(RRefThreads, AReplyThatIsNotWrittenReleasesItsReferences) {
  w(1).add_interceptor(std::make_shared<RefuseReplies>("make_owned"));
  const std::string text = error_text<RemoteError>(
      [&] { w(0).rpc_sync<std::vector<RRef<Tensor>>>("w1", "make_owned", int64_t{2}); });
  EXPECT_TRUE(contains(text, "reply refused by the test")) << text;
  expect_settled(1);
}

// to_here's copy is user code (copy_object and the class's converter; a converter for a
// value held as T): it runs on the owner's pool, like every handler, never on the I/O
// thread that received the fetch.
// A result whose later element fails to convert after a reference in it was converted
// (its fork counted by the owner, or kept as a pending child by a user): the caller gets
// the error, and the fork is given back.
TEST_F(RRefThreads, AResultThatFailsToConvertReleasesTheReferencesConvertedFirst) {
  // An undefined tensor cannot be sent: the tuple's second element fails.
  reg_.def("owned_and_hole", [](const CallContext& ctx) {
    return std::make_tuple(rref::make_local(*ctx.agent(), make_tensor(1)), Tensor());
  });
  reg_.def("forward_and_hole", [](const RRef<Tensor>& r) { return std::make_tuple(r, Tensor()); });
  using Pair = std::tuple<RRef<Tensor>, Tensor>;
  std::string text =
      error_text<InvalidArgument>([&] { w(0).rpc_sync<Pair>("w1", "owned_and_hole"); });
  EXPECT_TRUE(contains(text, "undefined Tensor")) << text;
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  text = error_text<InvalidArgument>([&] { w(0).rpc_sync<Pair>("w2", "forward_and_hole", r); });
  EXPECT_TRUE(contains(text, "undefined Tensor")) << text;
  r = {};
  expect_settled(1);
}

// An AddFork lost on its way: the receiver's confirmation times out, its reference is
// given up, and the owner, which never counted the fork, remembers it as given up and tells
// the user that sent it that it is settled (that user's pending child would otherwise keep
// its reference, and its shutdown, waiting).
TEST_F(RRefShortTimeout, AForkWhoseAddForkIsLostIsSettledWhenItsHolderGivesItUp) {
  reg_.def("sum_or_fail", [](const RRef<Tensor>& r) {
    return tensor_sum(r.to_here(std::chrono::milliseconds(300)));
  });
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  ASSERT_TRUE(r.creation().wait(10s));
  // The first bookkeeping request w2 sends w1 is the AddFork of the fork w0 sends it.
  Future<void> dropped = faults_->add({.action = rpc::FaultAction::kDrop,
                                       .from = "w2",
                                       .to = "w1",
                                       .kind = rpc::MessageKind::kRequest,
                                       .handler = rref::kRRefControlHandler});
  // The AddFork itself times out after the agents' rpc_timeout (1 s).
  const std::string text = error_text<RemoteError>(
      [&] { w(0).rpc_sync<double>("w2", "sum_or_fail", CallOptions{10s}, r); });
  EXPECT_TRUE(contains(text, "timed out")) << text;
  EXPECT_TRUE(dropped.wait(1s));
  r = {};
  expect_settled(1);
}

TEST_F(RRefThreads, ToHereCopiesOnTheOwnersPool) {
  reg_.def_class<Spot>("Spot").ctor<int64_t>().copyable();
  g_spot_pool = std::dynamic_pointer_cast<ThreadPool>(w(1).executor()).get();
  ASSERT_NE(g_spot_pool.load(), nullptr);
  g_spot_copies = 0;
  g_spot_copies_off_pool = 0;
  RRef<Spot> spot = rref::remote<Spot>(w(0), "w1", "Spot", int64_t{4});
  ASSERT_TRUE(spot.creation().wait(10s));
  std::vector<Future<Spot>> copies;
  for (int i = 0; i < 20; ++i)
    copies.push_back(spot.to_here_async());
  for (auto& c : copies)
    EXPECT_EQ(c.get(10s).n, 4);
  EXPECT_EQ(g_spot_copies.load(), 20);
  EXPECT_EQ(g_spot_copies_off_pool.load(), 0);
  g_spot_pool = nullptr;
  spot = {};
  expect_settled(1);
}

// A value an RRef holds may not itself hold references (they would never be counted as
// held by the owner): remote() of such a value fails with InvalidArgument, make_local
// refuses it at once, and the references made for it are given back.
TEST_F(RRefThreads, AHeldValueContainingReferencesIsRefused) {
  using Refs = std::vector<RRef<Tensor>>;
  RRef<Refs> refs = rref::remote<Refs>(w(0), "w1", "make_owned", int64_t{2});
  ASSERT_TRUE(refs.creation().wait(10s));
  std::string text = error_text<InvalidArgument>([&] { refs.creation().get(); });
  EXPECT_TRUE(contains(text, "contains references")) << text;
  text = error_text<InvalidArgument>([&] { refs.to_here(); });
  EXPECT_TRUE(contains(text, "contains references")) << text;
  RRef<Tensor> theirs = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  text = error_text<InvalidArgument>([&] { rref::make_local(w(0), Refs{theirs}); });
  EXPECT_TRUE(contains(text, "contains references")) << text;
  EXPECT_EQ(rref::metrics(w(0)).pending_children, 0);
  refs = {};
  theirs = {};
  expect_settled(1);
}

// A graceful shutdown gives up the references still held and waits for their deletes, so
// the owner holds nothing when it closes: what each context still held then (the closing
// drops it all) is recorded and must be nothing.
TEST_F(RRefThreads, GracefulShutdownReleasesReferencesStillHeld) {
  RRef<Tensor> held = rref::remote<Tensor>(w(0), "w1", "make", int64_t{1});
  RRef<Tensor> forked = w(0).rpc_sync<RRef<Tensor>>("w2", "forward", held);
  EXPECT_DOUBLE_EQ(tensor_sum(forked.to_here()), 10);
  EXPECT_GE(rref::metrics(w(1)).owned_forks, 2);  // held and forked (w2's own may still be going)
  shutdown_all(agents_);
  const rref::RRefMetrics owner = rref::metrics_at_close(w(1));
  EXPECT_EQ(owner.owned_values, 0);
  EXPECT_EQ(owner.shared_values, 0);
  EXPECT_EQ(owner.owned_forks, 0);
  for (auto& a : agents_) {
    const rref::RRefMetrics m = rref::metrics_at_close(*a);
    EXPECT_EQ(m.pending_children, 0);
    EXPECT_EQ(m.messages_in_flight, 0);
  }
  // Used after its agent shut down.
  const std::string text = error_text<Error>([&] { held.to_here(); });
  EXPECT_TRUE(contains(text, "shut down")) << text;
  EXPECT_THROW(rref::remote<Tensor>(w(0), "w1", "make", int64_t{1}), Error);
  agents_.clear();
}

TEST_F(RRefThreads, MalformedProtocolMessagesAreRefusedAndTheWorkerCarriesOn) {
  auto send_raw = [&](const std::string& payload, std::vector<rpc::Value> args = {}) {
    rpc::Request request;
    request.handler = rref::kRRefControlHandler;
    request.payload.assign(payload.begin(), payload.end());
    request.args = std::move(args);
    return w(0).send("w1", std::move(request));
  };
  std::string text = error_text<InvalidArgument>([&] { send_raw("\xff\xff garbage").get(10s); });
  EXPECT_TRUE(contains(text, "malformed rref message")) << text;
  text = error_text<InvalidArgument>([&] { send_raw("").get(10s); });
  EXPECT_TRUE(contains(text, "malformed rref message")) << text;
  // A reference naming a worker outside the group, inside an ordinary call.
  rpc::Value forged(
      rpc::RRefDescriptor{7, (uint64_t{1} << 48) | 5, (uint64_t{1} << 48) | 6, "Tensor"});
  text = error_text<InvalidArgument>([&] { w(0).call("w1", "sum_of", {forged}).get(10s); });
  EXPECT_TRUE(contains(text, "malformed RRef")) << text;
  // A reference the owner never made.
  rpc::Value unknown(
      rpc::RRefDescriptor{1, (uint64_t{1} << 48) | 999, (uint64_t{1} << 48) | 1000, "Tensor"});
  text = error_text<InvalidArgument>([&] { w(0).call("w1", "sum_local", {unknown}).get(10s); });
  EXPECT_TRUE(contains(text, "does not own")) << text;
  // The worker still serves.
  RRef<Tensor> r = rref::remote<Tensor>(w(0), "w1", "make", int64_t{0});
  EXPECT_DOUBLE_EQ(tensor_sum(r.to_here()), 6);
  r = {};
  expect_settled(1);
}

// A Lost notice (docs/rref.md, "A dead worker") makes its receiver release what the sender
// held there, and nothing else: a worker speaks only for itself. One naming another
// incarnation of the receiver is stale and ignored; a reason full of terminal escapes is
// taken (quoted printably in the log) without harm.
TEST_F(RRefThreads, ALostNoticeReleasesOnlyWhatItsSenderHeld) {
  // RRefMessage { Lost lost = 7 { int32 incarnation = 1; bytes why = 2; } }
  auto lost = [](uint8_t incarnation, const std::string& why) {
    std::string inner;
    inner += '\x08';
    inner += static_cast<char>(incarnation);
    inner += '\x12';
    inner += static_cast<char>(why.size());
    inner += why;
    std::string out;
    out += '\x3a';
    out += static_cast<char>(inner.size());
    return out + inner;
  };
  auto send_raw = [&](int from, const std::string& payload) {
    rpc::Request request;
    request.handler = rref::kRRefControlHandler;
    request.payload.assign(payload.begin(), payload.end());
    return w(from).send("w1", std::move(request));
  };
  RRef<Tensor> mine = rref::remote<Tensor>(w(0), "w1", "make", int64_t{0});
  RRef<Tensor> theirs = rref::remote<Tensor>(w(2), "w1", "make", int64_t{1});
  ASSERT_TRUE(mine.creation().wait(10s));
  ASSERT_TRUE(theirs.creation().wait(10s));
  EXPECT_EQ(rref::metrics(w(1)).owned_values, 2);
  // Stale: for an incarnation of w1 that is not running.
  send_raw(0, lost(5, "an old loss")).get(10s);
  EXPECT_DOUBLE_EQ(tensor_sum(mine.to_here()), 6);
  EXPECT_EQ(rref::metrics(w(1)).owned_values, 2);
  // w2 declares its connection to w1 lost: w1 releases w2's fork, and w0's is untouched.
  send_raw(2, lost(0, std::string(100, '\x1b') + "[2J")).get(10s);
  EXPECT_TRUE(rref::wait_owned_values(w(1), 1, 10s))
      << "w1 owns " << rref::metrics(w(1)).owned_values << " values";
  EXPECT_DOUBLE_EQ(tensor_sum(mine.to_here()), 6);
  // w2's own reference is dead on w1 now: its Delete is a no-op there.
  theirs = {};
  mine = {};
  expect_settled(1);
}

TEST_F(RRefThreads, MakeLocalSharesWhatTheOwnerHolds) {
  Tensor weight = make_tensor(2);
  RRef<Tensor> w_ref = rref::make_local(w(1), weight);
  EXPECT_TRUE(w_ref.is_owner());
  // Another worker reads it; the owner's in-place change is seen: the reference is the
  // tensor itself, not a copy.
  EXPECT_DOUBLE_EQ(w(1).rpc_sync<double>("w2", "sum_of", w_ref), 2 + 3 + 4 + 5);
  weight.fill_(1.0);
  EXPECT_DOUBLE_EQ(w(1).rpc_sync<double>("w2", "sum_of", w_ref), 4);
  // A reference belongs to its agent: another agent of this process may not send it.
  EXPECT_THROW(w(0).rpc_sync<double>("w2", "sum_of", w_ref), InvalidArgument);
  auto counter = std::make_shared<Counter>(5);
  RRef<Counter> c = rref::make_local(w(1), counter);
  RRef<Counter> there = w(1).rpc_sync<RRef<Counter>>("w0", "echo_rref", c);
  EXPECT_TRUE(there.is_owner());
  EXPECT_EQ(there.rpc_sync<int64_t>("add", int64_t{1}), 6);
  EXPECT_EQ(counter->get(), 6);
  EXPECT_THROW(rref::make_local<Counter>(w(1), nullptr), InvalidArgument);
  w_ref = {};
  c = {};
  there = {};
  expect_settled(1);
}

TEST(RRefEmpty, AnEmptyReferenceIsAnError) {
  RRef<Tensor> r;
  EXPECT_FALSE(r.valid());
  EXPECT_THROW(r.owner(), Error);
  EXPECT_THROW(r.to_here(), Error);
}

// References to a worker that was lost fail at once with a NetworkError naming the lost
// incarnation, before and after a replacement rejoins under its name (once, the loss was
// forgotten on rejoin, and an old reference sent to the replacement, which waited for a
// creation that never came). References made after the rejoin reach the replacement.
TEST(RRefRejoin, ReferencesToALostIncarnationFailAtOnceBeforeAndAfterItsReplacementRejoins) {
  Registry reg;
  define(reg);
  rpc::AgentOptions options = test_options(reg);
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      agents[static_cast<size_t>(r)] =
          rpc::create_tensorpipe_agent(test::worker_name(r), r, 3, store, options);
    }
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] { agents[static_cast<size_t>(r)]->start(); });
    for (auto& t : threads)
      t.join();
  }
  RpcAgent& w0 = *agents[0];
  RRef<Counter> counter = rref::remote<Counter>(w0, "w1", "Counter", int64_t{5});
  RRef<Tensor> value = rref::remote<Tensor>(w0, "w1", "make", int64_t{1});
  EXPECT_EQ(counter.rpc_sync<int64_t>("get"), 5);
  ASSERT_TRUE(value.creation().wait(10s));
  agents[1]->shutdown(false);
  // w0 learns of the loss when its connection goes; until then a call may fail otherwise.
  std::string text;
  eventually([&] {
    text = error_text<NetworkError>([&] { counter.rpc_sync<int64_t>("get"); });
    return contains(text, "incarnation 0");
  });
  EXPECT_TRUE(contains(text, "'w1' (rank 1) incarnation 0, was lost")) << text;

  rpc::AgentOptions rejoining = options;
  rejoining.rejoin = true;
  auto w1 = rpc::make_tensorpipe_agent("w1", 1, 3, store, rejoining);
  ASSERT_EQ(w1->incarnation(), 1);
  // A call from the replacement reaches w0 only after w0 was told that it rejoined.
  EXPECT_EQ(w1->rpc_sync<int64_t>("w0", "square", int64_t{3}), 9);
  const auto t0 = std::chrono::steady_clock::now();
  text = error_text<NetworkError>([&] { counter.rpc_sync<int64_t>("get"); });
  EXPECT_TRUE(contains(text, "incarnation 0, was lost")) << text;
  text = error_text<NetworkError>([&] { value.to_here(); });
  EXPECT_TRUE(contains(text, "incarnation 0, was lost")) << text;
  text = error_text<NetworkError>([&] { counter.remote<int64_t>("get").to_here(); });
  EXPECT_TRUE(contains(text, "incarnation 0, was lost")) << text;
  // Nor may it travel on.
  text = error_text<NetworkError>([&] { w0.rpc_sync<double>("w2", "sum_of", value); });
  EXPECT_TRUE(contains(text, "incarnation 0, was lost")) << text;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);

  // The replacement serves new references.
  RRef<Counter> fresh = rref::remote<Counter>(w0, "w1", "Counter", int64_t{1});
  EXPECT_EQ(fresh.rpc_sync<int64_t>("add", int64_t{2}), 3);
  counter = {};
  value = {};
  fresh = {};
  agents[1] = w1;
  // Nothing is left anywhere before the group shuts down.
  for (auto& a : agents)
    rref::wait_idle(*a, 10s);
  EXPECT_TRUE(rref::wait_owned_values(*w1, 0, 10s));
  for (auto& a : agents) {
    const rref::RRefMetrics m = rref::metrics(*a);
    EXPECT_EQ(m.owned_values, 0);
    EXPECT_EQ(m.owned_forks, 0);
    EXPECT_EQ(m.user_references, 0);
    EXPECT_EQ(m.pending_children, 0);
    EXPECT_EQ(a->metrics().pending_calls, 0);
  }
  test::shutdown_agents(agents);
}

// ---- processes

// Runs `body` on three worker processes meeting through a FileStore.
test::RankResults run_three_processes(
    const std::string& tag, Registry& reg,
    const std::function<void(int rank, c10d::Store& store, RpcAgent& agent)>& body) {
  return test::run_agent_processes("rref-" + tag, 3, test_options(reg), body);
}

TEST(RRefProcesses, EveryPatternLeavesTheOwnerWithNothing) {
  Registry reg;
  define(reg);
  test::RankResults results =
      run_three_processes("patterns", reg, [](int rank, c10d::Store& store, RpcAgent& agent) {
        if (rank == 0) {
          {
            RRef<Tensor> r = rref::remote<Tensor>(agent, "w1", "make", int64_t{2});
            EXPECT_DOUBLE_EQ(agent.rpc_sync<double>("w1", "sum_local", r), 14);
            EXPECT_DOUBLE_EQ(agent.rpc_sync<double>("w2", "sum_of", r), 14);
            RRef<Tensor> back = agent.rpc_sync<RRef<Tensor>>("w2", "forward", r);
            EXPECT_DOUBLE_EQ(tensor_sum(back.to_here()), 14);
            auto owned = agent.rpc_sync<std::vector<RRef<Tensor>>>("w1", "make_owned", int64_t{2});
            EXPECT_DOUBLE_EQ(agent.rpc_sync<double>("w2", "sum_all", owned), 6 + 10);
            RRef<Counter> c = rref::remote<Counter>(agent, "w1", "Counter", int64_t{0});
            std::vector<Future<int64_t>> calls;
            for (int i = 0; i < 50; ++i)
              calls.push_back(c.rpc_async<int64_t>("add", int64_t{2}));
            for (auto& f : calls)
              EXPECT_TRUE(f.wait(20s) && !f.has_error());
            EXPECT_EQ(c.rpc_sync<int64_t>("get"), 100);
            for (int i = 0; i < 10; ++i) {
              RRef<Tensor> racing = rref::remote<Tensor>(agent, "w1", "make", int64_t{i});
              Future<double> seen = agent.rpc_async<double>("w2", "sum_of", racing);
              racing = {};
              EXPECT_DOUBLE_EQ(seen.get(20s), 4.0 * i + 6);
            }
          }
          rref::wait_idle(agent, 20s);
          store.set("done0", "1");
        } else if (rank == 2) {
          store.wait({"done0"}, 30s);
          rref::wait_idle(agent, 20s);
          store.set("done2", "1");
        } else {
          store.wait({"done0", "done2"}, 30s);
          rref::wait_idle(agent, 20s);
          EXPECT_TRUE(rref::wait_owned_values(agent, 0, 20s))
              << rref::metrics(agent).owned_values << " values left";
          EXPECT_EQ(rref::metrics(agent).owned_forks, 0);
        }
        // Nothing else is left on any worker either, checked while all still serve.
        EXPECT_TRUE(eventually(
            [&] {
              const rref::RRefMetrics m = rref::metrics(agent);
              return m.user_references == 0 && m.pending_children == 0 &&
                     m.messages_in_flight == 0 && agent.metrics().pending_calls == 0;
            },
            10s))
            << "rank " << rank << ": " << rref::metrics(agent).user_references
            << " user references, " << agent.metrics().pending_calls << " pending calls";
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(RRefProcesses, ADeadOwnerFailsPendingAndLaterCallsNamingIt) {
  Registry reg;
  define(reg);
  reg.def("die_later", [](const CallContext&) -> int64_t { ::_exit(0); });
  test::RankResults results =
      run_three_processes("owner", reg, [](int rank, c10d::Store& store, RpcAgent& agent) {
        if (rank == 1) {
          store.wait({"never"}, 40s);  // serves until "die_later" ends the process
          return;
        }
        if (rank == 2) {
          store.wait({"done0"}, 40s);
          agent.shutdown(false);
          return;
        }
        RRef<Counter> c = rref::remote<Counter>(agent, "w1", "Counter", int64_t{1});
        EXPECT_EQ(c.rpc_sync<int64_t>("get"), 1);
        Future<int64_t> death = agent.rpc_async<int64_t>("w1", "die_later");
        EXPECT_TRUE(death.wait(20s));
        const auto t0 = std::chrono::steady_clock::now();
        const std::string text = error_text<NetworkError>([&] { c.rpc_sync<int64_t>("get"); });
        EXPECT_TRUE(contains(text, "w1") || contains(text, "worker 1")) << text;
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
        // Later calls fail at once.
        const auto t1 = std::chrono::steady_clock::now();
        EXPECT_THROW(c.remote<int64_t>("get").to_here(), NetworkError);
        EXPECT_THROW(c.rpc_sync<int64_t>("get"), NetworkError);
        EXPECT_LT(std::chrono::steady_clock::now() - t1, 2s);
        c = {};
        store.set("done0", "1");
        agent.shutdown(false);
      });
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_TRUE(results.ranks[2].ok) << results.summary();
  EXPECT_EQ(results.ranks[1].exit_code, 0) << results.summary();
}

// The store of this process's rank function, for functions it serves (one per process).
c10d::Store*& parked_store() {
  static c10d::Store* store = nullptr;
  return store;
}

// A worker killed outright while it builds a value for remote(): the creator, and another
// worker whose call it was serving, both get a NetworkError naming it within 2 s, and both
// shut down cleanly.
TEST(RRefProcesses, AnOwnerKilledMidRemoteFailsEveryWaiterNamingIt) {
  Registry reg;
  define(reg);
  struct Doomed {
    Doomed() { ::kill(::getpid(), SIGKILL); }
  };
  reg.def_class<Doomed>("Doomed").ctor<>();
  reg.def("park", [](const CallContext&) -> int64_t {
    // Holds w2's call until the process dies; the wait only bounds a broken test.
    parked_store()->set("parked", "1");
    parked_store()->wait({"never"}, 40s);
    return 0;
  });
  test::RankResults results =
      run_three_processes("sigkill", reg, [](int rank, c10d::Store& store, RpcAgent& agent) {
        auto expect_named_quickly = [](const auto& started, const std::string& text) {
          EXPECT_TRUE(contains(text, "'w1'")) << text;
          EXPECT_LT(std::chrono::steady_clock::now() - started, 2s) << text;
        };
        if (rank == 1) {
          parked_store() = &store;
          store.set("w1_ready", "1");
          store.wait({"never"}, 40s);  // serves until "Doomed" ends the process
          return;
        }
        if (rank == 2) {
          store.wait({"w1_ready"}, 20s);
          Future<int64_t> parked = agent.rpc_async<int64_t>("w1", "park");
          store.wait({"parked"}, 20s);
          store.set("w2_ready", "1");
          store.wait({"killing"}, 20s);
          const auto t0 = std::chrono::steady_clock::now();
          ASSERT_TRUE(parked.wait(20s));
          expect_named_quickly(t0, error_text<NetworkError>([&] { parked.value(); }));
          store.set("done2", "1");
          agent.shutdown(false);
          return;
        }
        store.wait({"w2_ready"}, 20s);
        store.set("killing", "1");
        const auto t0 = std::chrono::steady_clock::now();
        RRef<Doomed> doomed = rref::remote<Doomed>(agent, "w1", "Doomed");
        Future<void> confirmed = doomed.creation();
        ASSERT_TRUE(confirmed.wait(20s));
        expect_named_quickly(t0, error_text<NetworkError>([&] { confirmed.value(); }));
        // Using the reference later fails at once, naming the owner too.
        const auto t1 = std::chrono::steady_clock::now();
        expect_named_quickly(t1, error_text<NetworkError>([&] { doomed.rpc_sync<int64_t>("x"); }));
        doomed = {};
        store.wait({"done2"}, 20s);
        agent.shutdown(false);
      });
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_TRUE(results.ranks[2].ok) << results.summary();
  EXPECT_EQ(results.ranks[1].term_signal, SIGKILL) << results.summary();
}

TEST(RRefProcesses, ADeadUserDoesNotPinValues) {
  Registry reg;
  define(reg);
  reg.def("hold_and_die", [](const RRef<Tensor>& r) -> int64_t {
    EXPECT_DOUBLE_EQ(tensor_sum(r.to_here()), 10);
    ::_exit(0);
  });
  test::RankResults results =
      run_three_processes("user", reg, [](int rank, c10d::Store& store, RpcAgent& agent) {
        if (rank == 2) {
          store.wait({"never"}, 40s);  // holds a fork until "hold_and_die" ends it
          return;
        }
        if (rank == 1) {
          store.wait({"done0"}, 40s);
          agent.shutdown(false);
          return;
        }
        // w0 owns a value and forks it to w2, which dies holding it.
        {
          RRef<Tensor> mine = rref::remote<Tensor>(agent, "w0", "make", int64_t{1});
          Future<int64_t> gone = agent.rpc_async<int64_t>("w2", "hold_and_die", mine);
          EXPECT_TRUE(gone.wait(20s));
          EXPECT_THROW(gone.value(), NetworkError);
        }
        EXPECT_TRUE(rref::wait_owned_values(agent, 0, 10s))
            << rref::metrics(agent).owned_values << " values pinned by the dead worker";
        store.set("done0", "1");
        agent.shutdown(false);
      });
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_TRUE(results.ranks[1].ok) << results.summary();
  EXPECT_EQ(results.ranks[2].exit_code, 0) << results.summary();
}

}  // namespace
}  // namespace gradwire

// Registry: functions, lambdas, asynchronous functions and classes are called with Values;
// unknown names, wrong arity and wrong types are InvalidArguments that name the function
// and the expected and received types; what a function throws reaches the future. Functions,
// methods and converters may take the call's context; each entry is one object, found once
// and never copied per call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::rpc {
namespace {

// A value whose conversion records the caller of the call it is converted for, as an RRef
// argument will find its agent through the context.
struct Stamped {
  int64_t value = 0;
  std::string converted_for;  // the caller's name in the context `from` received
};

// A converter written against the text form of `where`, as converters were before Where.
struct Legacy {
  int64_t value = 0;
};

}  // namespace

template <>
struct ValueConverter<Stamped> {
  static Value to(const Stamped& s, const CallContext& ctx) {
    return Value(std::to_string(s.value) + "@" + ctx.caller().name);
  }
  static Stamped from(const Value& v, const Where& where, const CallContext& ctx) {
    return Stamped{from_value<int64_t>(v, where, ctx), ctx.caller().name};
  }
  static std::string name() { return "Stamped"; }
};

template <>
struct ValueConverter<Legacy> {
  static Value to(const Legacy& l) { return Value(l.value); }
  static Legacy from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kInt) throw InvalidArgument(where + ": not a Legacy");
    return Legacy{v.as_int()};
  }
  static std::string name() { return "Legacy"; }
};

namespace {

using namespace std::chrono_literals;

// Counts the copies made of it (moves are free), to show what the registry copies.
struct CopyCounter {
  explicit CopyCounter(std::shared_ptr<std::atomic<int>> copies) : copies(std::move(copies)) {}
  CopyCounter(const CopyCounter& other) : copies(other.copies) { ++*copies; }
  CopyCounter(CopyCounter&&) noexcept = default;
  CopyCounter& operator=(const CopyCounter&) = delete;
  CopyCounter& operator=(CopyCounter&&) = delete;
  std::shared_ptr<std::atomic<int>> copies;
};

// A context as an agent would give it. The agent pointer is only compared, never used.
CallContext context_from(const std::string& caller, int id, uint64_t request_id,
                         CallContext::Clock::time_point deadline) {
  static int agent_stand_in = 0;
  return CallContext(reinterpret_cast<RpcAgent*>(&agent_stand_in), WorkerInfo{caller, id},
                     request_id, deadline);
}

std::shared_ptr<ThreadPool> pool() {
  static auto p = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 2, .name = "reg"});
  return p;
}

int64_t twice(int64_t x) {
  return 2 * x;
}

std::string error_of(const Future<Value>& f) {
  EXPECT_TRUE(f.wait(5s));
  try {
    f.value();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RegistryTest, FunctionsAndLambdasAreCalledWithConvertedArguments) {
  Registry r;
  r.def("twice", &twice);
  r.def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
  r.def("join", [](std::vector<std::string> parts, std::string sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i)
      out += (i > 0 ? sep : "") + parts[i];
    return out;
  });
  int calls = 0;
  r.def("count", [&calls]() mutable { ++calls; });

  EXPECT_EQ(r.invoke("twice", {Value(int64_t{21})}, pool()).get(5s).as_int(), 42);
  const Value sum =
      r.invoke("add", {Value(ones({2})), Value(full({2}, Scalar(2)))}, pool()).get(5s);
  EXPECT_TRUE(equal(sum.as_tensor(), full({2}, Scalar(3))));
  EXPECT_EQ(r.invoke("join", {to_value(std::vector<std::string>{"a", "b"}), Value("-")}, pool())
                .get(5s)
                .as_string(),
            "a-b");
  EXPECT_TRUE(r.invoke("count", {}, pool()).get(5s).is_none());
  EXPECT_EQ(calls, 1);

  EXPECT_EQ(r.signature("add").text(), "add(Tensor, Tensor) -> Tensor");
  EXPECT_EQ(r.signature("join").text(), "join(list<string>, string) -> string");
  EXPECT_EQ(r.signature("count").text(), "count() -> None");
  EXPECT_EQ(r.functions().size(), 4u);
}

TEST(RegistryTest, AsynchronousFunctionsReplyWhenTheirFutureCompletes) {
  Registry r;
  Future<int64_t> pending;
  r.def("later", [pending]() { return pending; });
  r.def("later_void", []() {
    Future<void> f;
    f.set_value();
    return f;
  });
  EXPECT_EQ(r.signature("later").text(), "later() -> Future<int>");
  Future<Value> reply = r.invoke("later", {}, pool());
  EXPECT_FALSE(reply.wait(20ms));
  Future<int64_t>(pending).set_value(7);
  EXPECT_EQ(reply.get(5s).as_int(), 7);
  EXPECT_TRUE(r.invoke("later_void", {}, pool()).get(5s).is_none());
}

TEST(RegistryTest, FunctionsRecordWhereTheyRun) {
  Registry reg;
  reg.def("pooled", [](int64_t x) { return x + 1; });
  reg.def(
      "quick", [](int64_t x) { return x * 2; }, Execution::kInline);
  EXPECT_EQ(reg.execution("pooled"), Execution::kPool);
  EXPECT_EQ(reg.execution("quick"), Execution::kInline);
  EXPECT_EQ(reg.execution("unknown"), Execution::kPool);
  // How it runs changes nothing about what it computes.
  EXPECT_EQ(reg.invoke("quick", {Value(int64_t{21})}, pool()).get(5s).as_int(), 42);
}

TEST(RegistryTest, BadCallsNameTheFunctionAndTheTypes) {
  Registry r;
  r.def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
  r.def("small", [](int32_t x) { return x; });
  EXPECT_EQ(error_of(r.invoke("nope", {}, pool())),
            "no function 'nope' is registered (registered: add, small)");
  EXPECT_EQ(error_of(r.invoke("add", {Value(ones({1}))}, pool())),
            "add(Tensor, Tensor) -> Tensor takes 2 arguments, got 1 (Tensor float32[1])");
  EXPECT_EQ(error_of(r.invoke("add", {Value(ones({1})), Value("x")}, pool())),
            "argument 2 of add(Tensor, Tensor) -> Tensor: expected Tensor, got string \"x\"");
  EXPECT_EQ(error_of(r.invoke("small", {Value(int64_t{1} << 33)}, pool())),
            "argument 1 of small(int32) -> int32: expected int32, got int 8589934592, which is "
            "out of its range");
  EXPECT_THROW(r.def("add", [] { return 1; }), InvalidArgument);
  EXPECT_THROW(r.signature("nope"), InvalidArgument);
  // The errors are InvalidArgument, so the agent can send them back typed.
  Future<Value> f = r.invoke("nope", {}, pool());
  f.wait(5s);
  EXPECT_THROW(f.value(), InvalidArgument);
}

TEST(RegistryTest, WhatTheFunctionThrowsReachesTheFuture) {
  Registry r;
  r.def("boom", []() -> int64_t { throw std::runtime_error("boom"); });
  r.def("timeout", []() -> int64_t { throw TimeoutError("slow"); });
  EXPECT_EQ(error_of(r.invoke("boom", {}, pool())), "boom");
  Future<Value> f = r.invoke("timeout", {}, pool());
  f.wait(5s);
  EXPECT_THROW(f.value(), TimeoutError);
}

class Counter {
 public:
  explicit Counter(int64_t start) : value_(start) {}
  int64_t add(int64_t by) { return value_ += by; }
  int64_t get() const { return value_; }
  Tensor scaled(const Tensor& t) const { return t * Scalar(value_); }

 private:
  int64_t value_;
};

TEST(RegistryTest, ClassesAreConstructedAndTheirMethodsCalled) {
  Registry r;
  r.def_class<Counter>("Counter")
      .ctor<int64_t>()
      .method("add", &Counter::add)
      .method("get", &Counter::get)
      .method("scaled", &Counter::scaled)
      .method("reset", [](Counter& c, int64_t to) { c.add(to - c.get()); });
  EXPECT_TRUE(r.has_class("Counter"));
  EXPECT_EQ(r.class_name_of<Counter>(), "Counter");
  EXPECT_EQ(r.class_name_of<int>(), "");
  std::shared_ptr<void> c = r.construct("Counter", {Value(int64_t{10})});
  EXPECT_EQ(r.invoke_method("Counter", "add", c, {Value(int64_t{5})}, pool()).get(5s).as_int(), 15);
  EXPECT_EQ(r.invoke_method("Counter", "get", c, {}, pool()).get(5s).as_int(), 15);
  const Value t = r.invoke_method("Counter", "scaled", c, {Value(ones({2}))}, pool()).get(5s);
  EXPECT_TRUE(equal(t.as_tensor(), full({2}, Scalar(15))));
  r.invoke_method("Counter", "reset", c, {Value(int64_t{1})}, pool()).get(5s);
  EXPECT_EQ(static_cast<Counter*>(c.get())->get(), 1);
  EXPECT_EQ(r.method_signature("Counter", "add").text(), "Counter.add(int) -> int");

  EXPECT_THROW(r.construct("Counter", {Value("ten")}), InvalidArgument);
  EXPECT_THROW(r.construct("Nope", {}), InvalidArgument);
  EXPECT_EQ(error_of(r.invoke_method("Counter", "nope", c, {}, pool())),
            "class 'Counter' has no method 'nope' (methods: add, get, reset, scaled)");
  EXPECT_NE(error_of(r.invoke_method("Counter", "add", nullptr, {Value(int64_t{1})}, pool()))
                .find("called on no object"),
            std::string::npos);
  EXPECT_THROW(r.def_class<Counter>("Counter"), InvalidArgument);
}

TEST(RegistryTest, FunctionsTakingTheContextSeeTheOneGivenToInvoke) {
  Registry r;
  CallContext seen;
  r.def("whoami", [&seen](const CallContext& ctx, int64_t x) {
    seen = ctx;
    return ctx.caller().name + ":" + std::to_string(x);
  });
  r.def("ping", [](const CallContext& ctx) { return ctx.request_id(); });
  // The context is no argument on the wire: not in the signature, not counted.
  EXPECT_EQ(r.signature("whoami").text(), "whoami(int) -> string");
  EXPECT_EQ(r.signature("ping").text(), "ping() -> uint64");

  const auto deadline = CallContext::Clock::now() + 3s;
  const CallContext ctx = context_from("trainer3", 3, 77, deadline);
  EXPECT_EQ(r.invoke(ctx, "whoami", {Value(int64_t{5})}, pool()).get(5s).as_string(), "trainer3:5");
  EXPECT_EQ(seen.agent(), ctx.agent());
  EXPECT_EQ(seen.caller().name, "trainer3");
  EXPECT_EQ(seen.caller().id, 3);
  EXPECT_EQ(seen.request_id(), 77u);
  EXPECT_EQ(seen.deadline(), deadline);
  EXPECT_EQ(r.invoke(ctx, "ping", {}, pool()).get(5s).as_int(), 77);

  // Without a context the call is made outside any agent.
  EXPECT_EQ(r.invoke("whoami", {Value(int64_t{1})}, pool()).get(5s).as_string(), ":1");
  EXPECT_EQ(seen.agent(), nullptr);
  EXPECT_EQ(seen.caller().id, -1);
  EXPECT_EQ(seen.request_id(), 0u);
  EXPECT_EQ(seen.deadline(), CallContext::Clock::time_point::max());

  EXPECT_EQ(error_of(r.invoke(ctx, "whoami", {}, pool())),
            "whoami(int) -> string takes 1 argument, got 0 ()");
  EXPECT_EQ(error_of(r.invoke(ctx, "ping", {Value(int64_t{1})}, pool())),
            "ping() -> uint64 takes 0 arguments, got 1 (int 1)");
}

TEST(RegistryTest, ConvertersOfArgumentsAndResultsReceiveTheContext) {
  Registry r;
  r.def("stamps", [](std::vector<std::optional<Stamped>> list, std::map<std::string, Stamped> map,
                     Stamped single) {
    std::vector<std::string> out;
    for (const auto& s : list)
      out.push_back(s ? s->converted_for : "none");
    for (const auto& [key, s] : map)
      out.push_back(key + "=" + s.converted_for);
    out.push_back(single.converted_for);
    return out;
  });
  r.def("make", [](int64_t v) { return std::vector<std::optional<Stamped>>{Stamped{v, ""}, {}}; });
  r.def("make_later", [](int64_t v) { return make_ready_future(Stamped{v, ""}); });
  EXPECT_EQ(r.signature("stamps").text(),
            "stamps(list<optional<Stamped>>, map<string, Stamped>, Stamped) -> list<string>");

  const CallContext ctx = context_from("w7", 7, 1, CallContext::Clock::time_point::max());
  const Value list = Value::list({Value(int64_t{1}), Value(), Value(int64_t{2})});
  const Value map = Value::map({{Value("a"), Value(int64_t{3})}, {Value("b"), Value(int64_t{4})}});
  const Value got = r.invoke(ctx, "stamps", {list, map, Value(int64_t{5})}, pool()).get(5s);
  EXPECT_EQ(from_value<std::vector<std::string>>(got, "result"),
            (std::vector<std::string>{"w7", "none", "w7", "a=w7", "b=w7", "w7"}));

  // Results convert with the context too, immediate or asynchronous.
  EXPECT_EQ(r.invoke(ctx, "make", {Value(int64_t{9})}, pool()).get(5s),
            Value::list({Value("9@w7"), Value()}));
  EXPECT_EQ(r.invoke(ctx, "make_later", {Value(int64_t{8})}, pool()).get(5s), Value("8@w7"));
  // Outside any agent the caller is nobody.
  EXPECT_EQ(r.invoke("make_later", {Value(int64_t{8})}, pool()).get(5s), Value("8@"));

  // Nested errors name the element inside the argument, as for any type.
  EXPECT_EQ(error_of(r.invoke(
                ctx, "stamps",
                {Value::list({Value(int64_t{1}), Value("x")}), map, Value(int64_t{5})}, pool())),
            "argument 1 of stamps(list<optional<Stamped>>, map<string, Stamped>, Stamped) -> "
            "list<string> [1]: expected int, got string \"x\"");
}

TEST(RegistryTest, ConvertersTakingWhereAsTextStillWork) {
  Registry r;
  r.def("legacy", [](std::vector<Legacy> xs) { return xs.size() == 1 ? xs[0].value : -1; });
  EXPECT_EQ(r.invoke("legacy", {Value::list({Value(int64_t{4})})}, pool()).get(5s).as_int(), 4);
  EXPECT_EQ(error_of(r.invoke("legacy", {Value::list({Value(int64_t{4}), Value(true)})}, pool())),
            "argument 1 of legacy(list<Legacy>) -> int [1]: not a Legacy");
}

TEST(RegistryTest, MethodsMayTakeTheContext) {
  struct Greeter {
    std::string greet(const CallContext& ctx, const std::string& greeting) const {
      return greeting + ", " + ctx.caller().name;
    }
  };
  Registry r;
  r.def_class<Greeter>("Greeter")
      .ctor<>()
      .method("greet", &Greeter::greet)
      .method("id", [](Greeter&, const CallContext& ctx, int64_t add) {
        return static_cast<int64_t>(ctx.request_id()) + add;
      });
  EXPECT_EQ(r.method_signature("Greeter", "greet").text(), "Greeter.greet(string) -> string");
  EXPECT_EQ(r.method_signature("Greeter", "id").text(), "Greeter.id(int) -> int");
  const CallContext ctx = context_from("w2", 2, 40, CallContext::Clock::time_point::max());
  std::shared_ptr<void> g = r.construct(ctx, "Greeter", {});
  EXPECT_EQ(r.invoke_method(ctx, "Greeter", "greet", g, {Value("hello")}, pool()).get(5s),
            Value("hello, w2"));
  EXPECT_EQ(r.invoke_method(ctx, "Greeter", "id", g, {Value(int64_t{2})}, pool()).get(5s),
            Value(int64_t{42}));
  EXPECT_EQ(error_of(r.invoke_method(ctx, "Greeter", "id", g, {}, pool())),
            "Greeter.id(int) -> int takes 1 argument, got 0 ()");
}

TEST(RegistryTest, AMutableCallableKeepsItsStateAcrossCalls) {
  Registry r;
  r.def("count", [n = int64_t{0}]() mutable { return ++n; });
  EXPECT_EQ(r.invoke("count", {}, pool()).get(5s).as_int(), 1);
  EXPECT_EQ(r.invoke("count", {}, pool()).get(5s).as_int(), 2);
  EXPECT_EQ(r.find("count")->invoke(CallContext(), {}, pool()).get(5s).as_int(), 3);
}

TEST(RegistryTest, CallablesAreNotCopiedPerCall) {
  auto copies = std::make_shared<std::atomic<int>>(0);
  Registry r;
  r.def("probe", [c = CopyCounter(copies)](int64_t x) { return c.copies ? x : -1; });
  r.def_class<Counter>("Counter").ctor<int64_t>().method(
      "probe", [c = CopyCounter(copies)](Counter& self) { return c.copies ? self.get() : -1; });
  const int after_registration = copies->load();
  std::shared_ptr<void> counter = r.construct("Counter", {Value(int64_t{6})});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.invoke("probe", {Value(int64_t{i})}, pool()).get(5s).as_int(), i);
    EXPECT_EQ(r.invoke_method("Counter", "probe", counter, {}, pool()).get(5s).as_int(), 6);
  }
  auto found = r.find("probe");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->invoke(CallContext(), {Value(int64_t{9})}, pool()).get(5s).as_int(), 9);
  EXPECT_EQ(copies->load(), after_registration);
}

TEST(RegistryTest, FindLooksUpOnceAndTheEntryIsCalledDirectly) {
  Registry r;
  r.def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
  r.def(
      "quick", [](const CallContext& ctx) { return ctx.caller().id; }, Execution::kInline);
  EXPECT_EQ(r.find("nope"), nullptr);
  EXPECT_EQ(std::string(r.unknown_function("nope").what()),
            "no function 'nope' is registered (registered: add, quick)");

  std::shared_ptr<const RegisteredFunction> add = r.find("add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->signature().text(), "add(Tensor, Tensor) -> Tensor");
  EXPECT_EQ(add->execution(), Execution::kPool);
  const Value sum =
      add->invoke(CallContext(), {Value(ones({2})), Value(ones({2}))}, pool()).get(5s);
  EXPECT_TRUE(equal(sum.as_tensor(), full({2}, Scalar(2))));
  // Its failures are in the future, as invoke's.
  Future<Value> bad = add->invoke(CallContext(), {Value(ones({2})), Value(int64_t{1})}, pool());
  EXPECT_EQ(error_of(bad),
            "argument 2 of add(Tensor, Tensor) -> Tensor: expected Tensor, got int 1");
  EXPECT_THROW(bad.value(), CallRejected);

  std::shared_ptr<const RegisteredFunction> quick = r.find("quick");
  ASSERT_NE(quick, nullptr);
  EXPECT_EQ(quick->execution(), Execution::kInline);
  EXPECT_EQ(quick->signature().text(), "quick() -> int32");
  const CallContext ctx = context_from("w4", 4, 1, CallContext::Clock::time_point::max());
  EXPECT_EQ(quick->invoke(ctx, {}, pool()).get(5s).as_int(), 4);
}

TEST(RegistryTest, NestedErrorsNameTheElementKeyOrValue) {
  Registry r;
  r.def("nested", [](std::vector<std::optional<int32_t>>, std::map<std::string, int64_t>) {});
  r.def("keys", [](std::map<int64_t, std::pair<int64_t, std::string>>) {});
  const std::string nested = "nested(list<optional<int32>>, map<string, int>) -> None";
  const Value good_map = Value::map({{Value("k"), Value(int64_t{1})}});
  EXPECT_EQ(
      error_of(r.invoke("nested", {Value::list({Value(), Value(int64_t{1}), Value("x")}), good_map},
                        pool())),
      "argument 1 of " + nested + " [2]: expected int32, got string \"x\"");
  EXPECT_EQ(error_of(r.invoke("nested", {Value::list({}), Value::map({{Value("k"), Value(1.5)}})},
                              pool())),
            "argument 2 of " + nested + " [string \"k\"]: expected int, got double 1.5");
  // The first bad argument is the one reported.
  EXPECT_EQ(error_of(r.invoke("nested", {Value(true), Value(false)}, pool())),
            "argument 1 of " + nested + ": expected list<optional<int32>>, got bool true");

  const std::string keys = "keys(map<int, pair<int, string>>) -> None";
  EXPECT_EQ(error_of(r.invoke("keys", {Value::map({{Value("a"), Value()}})}, pool())),
            "argument 1 of " + keys + " key: expected int, got string \"a\"");
  EXPECT_EQ(
      error_of(r.invoke(
          "keys",
          {Value::map({{Value(int64_t{1}), Value::list({Value(int64_t{1}), Value(int64_t{2})})}})},
          pool())),
      "argument 1 of " + keys + " [int 1] [1]: expected string, got int 2");
  const Value pair = Value::list({Value(int64_t{1}), Value("s")});
  EXPECT_EQ(
      error_of(r.invoke(
          "keys", {Value::map({{Value(int64_t{1}), pair}, {Value(int64_t{1}), pair}})}, pool())),
      "argument 1 of " + keys + ": duplicate map key int 1");
}

TEST(RegistryTest, TheDefaultRegistryIsShared) {
  registry().def("rpc_test_default_fn", [] { return int64_t{5}; });
  EXPECT_TRUE(registry().has_function("rpc_test_default_fn"));
  EXPECT_EQ(registry().invoke("rpc_test_default_fn", {}, pool()).get(5s).as_int(), 5);
}

}  // namespace
}  // namespace gradwire::rpc

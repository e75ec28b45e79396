// Registry: functions, lambdas, asynchronous functions and classes are called with Values;
// unknown names, wrong arity and wrong types are InvalidArguments that name the function
// and the expected and received types; what a function throws reaches the future.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
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

using namespace std::chrono_literals;

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

TEST(RegistryTest, TheDefaultRegistryIsShared) {
  registry().def("rpc_test_default_fn", [] { return int64_t{5}; });
  EXPECT_TRUE(registry().has_function("rpc_test_default_fn"));
  EXPECT_EQ(registry().invoke("rpc_test_default_fn", {}, pool()).get(5s).as_int(), 5);
}

}  // namespace
}  // namespace gradwire::rpc

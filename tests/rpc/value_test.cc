// Value and ValueConverter: every supported C++ type round-trips, and every mismatch is an
// InvalidArgument naming where, what was expected and what arrived; where is rendered only
// on a mismatch; the call's context reaches context-aware converters through every container.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/value_convert.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::rpc {
namespace {

// Converts as its int, remembering the request id of the context it was converted with.
struct Tracked {
  int64_t value = 0;
  uint64_t request = 0;
  bool operator==(const Tracked&) const = default;
};

}  // namespace

template <>
struct ValueConverter<Tracked> {
  static Value to(const Tracked& t, const CallContext& ctx) {
    return Value::list({Value(t.value), Value(static_cast<int64_t>(ctx.request_id()))});
  }
  static Tracked from(const Value& v, const Where& where, const CallContext& ctx) {
    return Tracked{from_value<int64_t>(v, where, ctx), ctx.request_id()};
  }
  static std::string name() { return "Tracked"; }
};

namespace {

template <typename T>
T round_trip(const T& x) {
  return from_value<T>(to_value(x), "test");
}

std::string mismatch(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(ValueTest, ScalarsRoundTrip) {
  EXPECT_EQ(round_trip(true), true);
  EXPECT_EQ(round_trip(int64_t{-5}), -5);
  EXPECT_EQ(round_trip(int32_t{7}), 7);
  EXPECT_EQ(round_trip(uint16_t{65535}), 65535);
  EXPECT_EQ(round_trip(2.5), 2.5);
  EXPECT_EQ(round_trip(1.5f), 1.5f);
  EXPECT_EQ(round_trip(std::string("hé")), "hé");
  EXPECT_EQ(round_trip(Bytes{0, 255, 7}), (Bytes{0, 255, 7}));
  const RRefDescriptor r{3, 11, 12, "PS"};
  EXPECT_EQ(round_trip(r), r);
  EXPECT_EQ(to_value(int8_t{-3}).type(), ValueType::kInt);
  EXPECT_TRUE(Value().is_none());
}

TEST(ValueTest, TensorsShareStorage) {
  Tensor t = arange(Scalar(6)).view({2, 3});
  Tensor back = round_trip(t);
  EXPECT_TRUE(back.is_same(t));
  EXPECT_EQ(to_value(t).describe(), "Tensor int64[2, 3]");
  EXPECT_THROW(to_value(Tensor()), InvalidArgument);
}

TEST(ValueTest, ContainersRoundTrip) {
  EXPECT_EQ(round_trip(std::vector<int>{1, 2, 3}), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(round_trip(std::vector<std::vector<double>>{{1.0}, {}, {2.0, 3.0}}),
            (std::vector<std::vector<double>>{{1.0}, {}, {2.0, 3.0}}));
  EXPECT_EQ(round_trip(std::array<int64_t, 2>{4, 5}), (std::array<int64_t, 2>{4, 5}));
  EXPECT_EQ(round_trip(std::make_pair(std::string("a"), 1)), std::make_pair(std::string("a"), 1));
  EXPECT_EQ(round_trip(std::make_tuple(1, 2.0, std::string("x"))),
            std::make_tuple(1, 2.0, std::string("x")));
  const std::map<std::string, std::vector<int>> m{{"a", {1}}, {"b", {2, 3}}};
  EXPECT_EQ(round_trip(m), m);
  const std::unordered_map<int64_t, bool> u{{1, true}, {-2, false}};
  EXPECT_EQ(round_trip(u), u);
  EXPECT_EQ(round_trip(std::optional<int>{}), std::nullopt);
  EXPECT_EQ(round_trip(std::optional<int>{9}), 9);
}

TEST(ValueTest, TypeNamesDescribeSignatures) {
  EXPECT_EQ(type_name<Tensor>(), "Tensor");
  EXPECT_EQ(type_name<int64_t>(), "int");
  EXPECT_EQ(type_name<int32_t>(), "int32");
  EXPECT_EQ(type_name<uint8_t>(), "uint8");
  EXPECT_EQ(type_name<std::vector<float>>(), "list<float>");
  EXPECT_EQ((type_name<std::map<std::string, Tensor>>()), "map<string, Tensor>");
  EXPECT_EQ((type_name<std::tuple<int64_t, Bytes>>()), "tuple<int, bytes>");
  EXPECT_EQ(type_name<std::optional<double>>(), "optional<double>");
}

TEST(ValueTest, MismatchesNameWhereExpectedAndReceived) {
  EXPECT_EQ(mismatch([] { from_value<Tensor>(Value("x"), "argument 1 of f"); }),
            "argument 1 of f: expected Tensor, got string \"x\"");
  EXPECT_EQ(mismatch([] { from_value<int32_t>(Value(int64_t{1} << 40), "argument 2 of f"); }),
            "argument 2 of f: expected int32, got int 1099511627776, which is out of its range");
  EXPECT_EQ(mismatch([] { from_value<uint8_t>(Value(int64_t{-1}), "x"); }),
            "x: expected uint8, got int -1, which is out of its range");
  EXPECT_EQ(
      mismatch([] {
        from_value<std::vector<int64_t>>(Value::list({Value(int64_t{1}), Value(2.5)}), "result");
      }),
      "result [1]: expected int, got double 2.5");
  EXPECT_EQ(mismatch([] { from_value<std::array<int, 3>>(Value::list({}), "a"); }),
            "a: expected list<int32>[3], got list[0]");
  EXPECT_EQ(mismatch([] { Value(int64_t{1}).as_string(); }),
            "expected a value of type string, got int 1");
  EXPECT_NE(mismatch([] {
              Value::map({{Value(1.5), Value()}});
            }).find("a map key must be"),
            std::string::npos);
  EXPECT_NE(mismatch([] {
              from_value<std::map<int64_t, int64_t>>(
                  Value::map({{Value(int64_t{1}), Value(int64_t{1})},
                              {Value(int64_t{1}), Value(int64_t{2})}}),
                  "m");
            }).find("duplicate map key int 1"),
            std::string::npos);
  // An int is a fine double (as in Python); a double is not an int.
  EXPECT_EQ(from_value<double>(Value(int64_t{3}), "d"), 3.0);
  EXPECT_THROW(from_value<int64_t>(Value(3.0), "i"), InvalidArgument);
  EXPECT_THROW(to_value(uint64_t{1} << 63), InvalidArgument);
}

// A Where::Render that counts how often it renders.
void counting_render(std::string& out, const void* count, size_t index) {
  ++*static_cast<int*>(const_cast<void*>(count));
  out += "step " + std::to_string(index);
}

TEST(ValueTest, WhereIsRenderedOnlyOnAMismatch) {
  int renders = 0;
  const Where root = Where::custom(&counting_render, &renders, 4);
  const Value good = Value::map({{Value("a"), Value::list({Value(int64_t{1})})}});
  EXPECT_EQ((from_value<std::map<std::string, std::vector<int64_t>>>(good, root).at("a")),
            (std::vector<int64_t>{1}));
  EXPECT_EQ(renders, 0);
  const Value bad = Value::map({{Value("a"), Value::list({Value(int64_t{1}), Value("x")})}});
  EXPECT_EQ(mismatch([&] { from_value<std::map<std::string, std::vector<int64_t>>>(bad, root); }),
            "step 4 [string \"a\"] [1]: expected int, got string \"x\"");
  EXPECT_EQ(renders, 1);

  // Each step renders as the text it replaces.
  const std::string text = "result";
  const Where from_text = text;
  EXPECT_EQ(Where::element(from_text, 3).str(), "result [3]");
  EXPECT_EQ(Where::map_key(Where::element(from_text, 0)).str(), "result [0] key");
  const Value key(int64_t{-2});
  EXPECT_EQ(Where::map_value(Where("m"), key).str(), "m [int -2]");
  EXPECT_EQ(Where(std::string_view("view")).str(), "view");
}

TEST(ValueTest, TheContextReachesConvertersInsideEveryContainer) {
  const CallContext ctx(nullptr, WorkerInfo{"w1", 1}, 42, CallContext::Clock::time_point::max());
  const Tracked t{5, 42};
  const Value one = to_value(Tracked{5, 0}, ctx);
  EXPECT_EQ(one, Value::list({Value(int64_t{5}), Value(int64_t{42})}));

  // Into C++: every container hands the context down.
  const Value five(int64_t{5});
  EXPECT_EQ(from_value<Tracked>(five, "x", ctx), t);
  EXPECT_EQ(from_value<std::vector<std::optional<Tracked>>>(Value::list({five, Value()}), "x", ctx),
            (std::vector<std::optional<Tracked>>{t, std::nullopt}));
  EXPECT_EQ((from_value<std::array<Tracked, 2>>(Value::list({five, five}), "x", ctx)),
            (std::array<Tracked, 2>{t, t}));
  EXPECT_EQ((from_value<std::tuple<Tracked, std::pair<int, Tracked>>>(
                Value::list({five, Value::list({Value(int64_t{0}), five})}), "x", ctx)),
            std::make_tuple(t, std::make_pair(0, t)));
  EXPECT_EQ(
      (from_value<std::map<std::string, Tracked>>(Value::map({{Value("k"), five}}), "x", ctx)),
      (std::map<std::string, Tracked>{{"k", t}}));
  EXPECT_EQ((from_value<std::unordered_map<int64_t, Tracked>>(
                Value::map({{Value(int64_t{1}), five}}), "x", ctx)),
            (std::unordered_map<int64_t, Tracked>{{1, t}}));
  // Without one, converters see the context of no call.
  EXPECT_EQ(from_value<std::vector<Tracked>>(Value::list({five}), "x")[0].request, 0u);

  // Out of C++: the same.
  EXPECT_EQ(to_value(std::vector<std::optional<Tracked>>{t, std::nullopt}, ctx),
            Value::list({one, Value()}));
  EXPECT_EQ(to_value(std::array<Tracked, 1>{t}, ctx), Value::list({one}));
  EXPECT_EQ(to_value(std::make_tuple(t, std::make_pair(int64_t{0}, t)), ctx),
            Value::list({one, Value::list({Value(int64_t{0}), one})}));
  EXPECT_EQ(to_value(std::map<std::string, Tracked>{{"k", t}}, ctx),
            Value::map({{Value("k"), one}}));
  EXPECT_EQ(to_value(std::unordered_map<int64_t, Tracked>{{1, t}}, ctx),
            Value::map({{Value(int64_t{1}), one}}));
  EXPECT_EQ(to_value(std::vector<Tracked>{t}),
            Value::list({Value::list({five, Value(int64_t{0})})}));
}

TEST(ValueTest, EqualityIsStructural) {
  EXPECT_EQ(Value::list({Value(true), Value("a")}), Value::list({Value(true), Value("a")}));
  EXPECT_NE(Value::list({Value(true)}), Value::list({Value(false)}));
  EXPECT_NE(Value(int64_t{1}), Value(1.0));
  Tensor t = zeros({2});
  EXPECT_EQ(Value(t), Value(t.view({2})));
  EXPECT_NE(Value(t), Value(zeros({2})));
}

}  // namespace
}  // namespace gradwire::rpc

// ValueConverter<T>: how a C++ type becomes a Value and back, and what it is called in
// messages. The registry uses it for every argument and result, so a call with the wrong
// types fails with a message naming the expected and the received types.
//
//   to_value(x)              Value from a C++ value
//   from_value<T>(v, where)  C++ value from a Value; `where` ("argument 2 of 'add'") starts
//                            the message of the InvalidArgument thrown on a mismatch
//   type_name<T>()           "Tensor", "int", "list<double>", "map<string, Tensor>", ...
//
// Supported: Value itself, bool, every integer type (range-checked: an int64 that does not
// fit an int32 parameter is an error, not a truncation), float and double, std::string,
// Bytes, Tensor, RRefDescriptor, std::optional<T> (None or T), std::vector<T>,
// std::array<T, N>, std::pair, std::tuple, std::map and std::unordered_map with bool,
// integer or string keys. Specialise ValueConverter for your own types.
//
// Thread-safety: stateless.
//
// Example:
//   Value v = to_value(std::vector<int>{1, 2});
//   auto back = from_value<std::vector<int64_t>>(v, "result");
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/value.h"

namespace gradwire::rpc {

template <typename T, typename Enable = void>
struct ValueConverter;  // specialisations below; a missing one is a compile error

template <typename T>
Value to_value(const T& x) {
  return ValueConverter<std::decay_t<T>>::to(x);
}

template <typename T>
std::decay_t<T> from_value(const Value& v, const std::string& where) {
  return ValueConverter<std::decay_t<T>>::from(v, where);
}

template <typename T>
std::string type_name() {
  return ValueConverter<std::decay_t<T>>::name();
}

namespace detail {

// "<where>: expected <expected>, got <describe(v)>".
[[noreturn]] void throw_type_mismatch(const std::string& where, const std::string& expected,
                                      const Value& received);
[[noreturn]] void throw_out_of_range(const std::string& where, const std::string& expected,
                                     int64_t received);

}  // namespace detail

template <>
struct ValueConverter<Value> {
  static Value to(const Value& v) { return v; }
  static Value from(const Value& v, const std::string&) { return v; }
  static std::string name() { return "any"; }
};

template <>
struct ValueConverter<bool> {
  static Value to(bool v) { return Value(v); }
  static bool from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kBool) detail::throw_type_mismatch(where, name(), v);
    return v.as_bool();
  }
  static std::string name() { return "bool"; }
};

template <typename T>
struct ValueConverter<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static Value to(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<int64_t>::max())) {
        throw InvalidArgument("value " + std::to_string(v) + " does not fit an rpc int (int64)");
      }
    }
    return Value(static_cast<int64_t>(v));
  }
  static T from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kInt) detail::throw_type_mismatch(where, name(), v);
    const int64_t x = v.as_int();
    if constexpr (std::is_signed_v<T>) {
      if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          x > static_cast<int64_t>(std::numeric_limits<T>::max())) {
        detail::throw_out_of_range(where, name(), x);
      }
    } else {
      if (x < 0 || static_cast<uint64_t>(x) > std::numeric_limits<T>::max()) {
        detail::throw_out_of_range(where, name(), x);
      }
    }
    return static_cast<T>(x);
  }
  static std::string name() {
    if constexpr (std::is_same_v<T, int64_t>) {
      return "int";
    } else {
      return std::string(std::is_signed_v<T> ? "int" : "uint") + std::to_string(8 * sizeof(T));
    }
  }
};

template <typename T>
struct ValueConverter<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static Value to(T v) { return Value(static_cast<double>(v)); }
  static T from(const Value& v, const std::string& where) {
    // An int is accepted where a floating-point number is expected, as in Python.
    if (v.type() != ValueType::kDouble && v.type() != ValueType::kInt) {
      detail::throw_type_mismatch(where, name(), v);
    }
    return static_cast<T>(v.as_double());
  }
  static std::string name() { return std::is_same_v<T, float> ? "float" : "double"; }
};

template <>
struct ValueConverter<std::string> {
  static Value to(const std::string& v) { return Value(v); }
  static std::string from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kString) detail::throw_type_mismatch(where, name(), v);
    return v.as_string();
  }
  static std::string name() { return "string"; }
};

template <>
struct ValueConverter<const char*> {
  static Value to(const char* v) { return Value(std::string(v)); }
  static std::string name() { return "string"; }
};

template <>
struct ValueConverter<Bytes> {
  static Value to(const Bytes& v) { return Value(v); }
  static Bytes from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kBytes) detail::throw_type_mismatch(where, name(), v);
    return v.as_bytes();
  }
  static std::string name() { return "bytes"; }
};

template <>
struct ValueConverter<Tensor> {
  static Value to(const Tensor& v) {
    if (!v.defined()) throw InvalidArgument("an undefined Tensor cannot be sent; send None");
    return Value(v);
  }
  static Tensor from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kTensor) detail::throw_type_mismatch(where, name(), v);
    return v.as_tensor();
  }
  static std::string name() { return "Tensor"; }
};

template <>
struct ValueConverter<RRefDescriptor> {
  static Value to(const RRefDescriptor& v) { return Value(v); }
  static RRefDescriptor from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kRRef) detail::throw_type_mismatch(where, name(), v);
    return v.as_rref();
  }
  static std::string name() { return "RRef"; }
};

template <typename T>
struct ValueConverter<std::optional<T>> {
  static Value to(const std::optional<T>& v) { return v ? to_value(*v) : Value(); }
  static std::optional<T> from(const Value& v, const std::string& where) {
    if (v.is_none()) return std::nullopt;
    return from_value<T>(v, where);
  }
  static std::string name() { return "optional<" + type_name<T>() + ">"; }
};

template <typename T, typename A>
struct ValueConverter<std::vector<T, A>, std::enable_if_t<!std::is_same_v<T, uint8_t>>> {
  static Value to(const std::vector<T, A>& v) {
    Value::List items;
    items.reserve(v.size());
    for (const auto& x : v)
      items.push_back(to_value(x));
    return Value::list(std::move(items));
  }
  static std::vector<T, A> from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kList) detail::throw_type_mismatch(where, name(), v);
    std::vector<T, A> out;
    out.reserve(v.as_list().size());
    size_t i = 0;
    for (const Value& item : v.as_list())
      out.push_back(from_value<T>(item, where + " [" + std::to_string(i++) + "]"));
    return out;
  }
  static std::string name() { return "list<" + type_name<T>() + ">"; }
};

template <typename T, size_t N>
struct ValueConverter<std::array<T, N>> {
  static Value to(const std::array<T, N>& v) {
    Value::List items;
    for (const auto& x : v)
      items.push_back(to_value(x));
    return Value::list(std::move(items));
  }
  static std::array<T, N> from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kList || v.as_list().size() != N) {
      detail::throw_type_mismatch(where, name(), v);
    }
    std::array<T, N> out{};
    for (size_t i = 0; i < N; ++i)
      out[i] = from_value<T>(v.as_list()[i], where + " [" + std::to_string(i) + "]");
    return out;
  }
  static std::string name() { return "list<" + type_name<T>() + ">[" + std::to_string(N) + "]"; }
};

template <typename... Ts>
struct ValueConverter<std::tuple<Ts...>> {
  static Value to(const std::tuple<Ts...>& v) {
    return std::apply([](const auto&... xs) { return Value::list(Value::List{to_value(xs)...}); },
                      v);
  }
  static std::tuple<Ts...> from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kList || v.as_list().size() != sizeof...(Ts)) {
      detail::throw_type_mismatch(where, name(), v);
    }
    return unpack(v.as_list(), where, std::index_sequence_for<Ts...>{});
  }
  static std::string name() {
    std::string s = "tuple<";
    bool first = true;
    ((s += (first ? "" : ", ") + type_name<Ts>(), first = false), ...);
    return s + ">";
  }

 private:
  template <size_t... I>
  static std::tuple<Ts...> unpack(const Value::List& items, const std::string& where,
                                  std::index_sequence<I...>) {
    return std::tuple<Ts...>(from_value<Ts>(items[I], where + " [" + std::to_string(I) + "]")...);
  }
};

template <typename A, typename B>
struct ValueConverter<std::pair<A, B>> {
  static Value to(const std::pair<A, B>& v) {
    return Value::list(Value::List{to_value(v.first), to_value(v.second)});
  }
  static std::pair<A, B> from(const Value& v, const std::string& where) {
    auto t = ValueConverter<std::tuple<A, B>>::from(v, where);
    return {std::move(std::get<0>(t)), std::move(std::get<1>(t))};
  }
  static std::string name() { return "pair<" + type_name<A>() + ", " + type_name<B>() + ">"; }
};

namespace detail {

template <typename M>
struct MapConverter {
  using K = typename M::key_type;
  using V = typename M::mapped_type;
  static Value to(const M& m) {
    Value::Map entries;
    entries.reserve(m.size());
    for (const auto& [k, v] : m)
      entries.emplace_back(to_value(k), to_value(v));
    return Value::map(std::move(entries));
  }
  static M from(const Value& v, const std::string& where) {
    if (v.type() != ValueType::kMap) throw_type_mismatch(where, name(), v);
    M out;
    for (const auto& [k, x] : v.as_map()) {
      K key = from_value<K>(k, where + " key");
      const std::string at = where + " [" + k.describe() + "]";
      if (!out.emplace(std::move(key), from_value<V>(x, at)).second) {
        throw InvalidArgument(where + ": duplicate map key " + k.describe());
      }
    }
    return out;
  }
  static std::string name() { return "map<" + type_name<K>() + ", " + type_name<V>() + ">"; }
};

}  // namespace detail

template <typename K, typename V, typename C, typename A>
struct ValueConverter<std::map<K, V, C, A>> : detail::MapConverter<std::map<K, V, C, A>> {};
template <typename K, typename V, typename H, typename E, typename A>
struct ValueConverter<std::unordered_map<K, V, H, E, A>>
    : detail::MapConverter<std::unordered_map<K, V, H, E, A>> {};

}  // namespace gradwire::rpc

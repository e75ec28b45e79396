// ValueConverter<T>: how a C++ type becomes a Value and back, and what it is called in
// messages. The registry uses it for every argument and result, so a call with the wrong
// types fails with a message naming the expected and the received types.
//
//   to_value(x), to_value(x, ctx)
//                            Value from a C++ value
//   from_value<T>(v, where), from_value<T>(v, where, ctx)
//                            C++ value from a Value; `where` ("argument 2 of 'add'") starts
//                            the message of the InvalidArgument thrown on a mismatch
//   type_name<T>()           "Tensor", "int", "list<double>", "map<string, Tensor>", ...
//
// Supported: Value itself, bool, every integer type (range-checked: an int64 that does not
// fit an int32 parameter is an error, not a truncation), float and double, std::string,
// Bytes, Tensor, RRefDescriptor, std::optional<T> (None or T), std::vector<T>,
// std::array<T, N>, std::pair, std::tuple, std::map and std::unordered_map with bool,
// integer or string keys. Specialise ValueConverter for your own types:
//
//   template <> struct ValueConverter<Point> {
//     static Value to(const Point& p) { return to_value(std::pair(p.x, p.y)); }
//     static Point from(const Value& v, const Where& where) {
//       auto [x, y] = from_value<std::pair<double, double>>(v, where);
//       return Point{x, y};
//     }
//     static std::string name() { return "Point"; }
//   };
//
// The call's context. A converter may instead take the CallContext of the call whose
// arguments or result it converts — `from(v, where, ctx)` and `to(x, ctx)` — which is how
// a type that means something only to the agent serving the call (an RRef, which must find
// its agent's reference bookkeeping) is converted. The two-argument from_value/to_value
// pass a context "outside any agent" (CallContext{}); every container converter hands the
// context it was given to its elements, so a context-aware type works nested in lists,
// maps, optionals and tuples too. A converter with both forms is called with the context.
// (A converter with the form `from(const Value&, const std::string&)` works too; it
// receives the rendered text.)
//
// Where. Converting arguments is on every call's path, and the description of where a
// value sits ("element 3 of argument 1 of f(list<int>) -> None") is needed only when one
// is refused. So `where` is a Where: a chain of steps (text, an element index, a map key
// or value) from the value back to its root, rendered by str() only when an error is
// thrown. A Where refers to what it was built from (its parent, text, key) and is meant
// to live as a parameter of the call that uses it: never store one.
//
// Thread-safety: stateless; a user converter that is not must synchronise itself.
//
// Example:
//   Value v = to_value(std::vector<int>{1, 2});
//   auto back = from_value<std::vector<int64_t>>(v, "result");
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/call_context.h"
#include "gradwire/rpc/value.h"

namespace gradwire::rpc {

// Where a value being converted sits, rendered lazily (see the head of this file).
//
//   Where("result")                       result
//   Where::element(parent, 2)             <parent> [2]
//   Where::map_key(parent)                <parent> key
//   Where::map_value(parent, key)         <parent> [<key.describe()>]
//   Where::custom(render, subject, i)     whatever render(out, subject, i) appends
//
// Implicitly built from const char*, std::string and std::string_view (which it refers
// to, not copies), so code passing a string keeps compiling.
class Where {
 public:
  // Appends the description of step `index` of `subject` to `out`.
  using Render = void (*)(std::string& out, const void* subject, size_t index);

  Where(const char* text) : kind_(Kind::kText), text_(text) {}
  Where(const std::string& text) : kind_(Kind::kText), text_(text) {}
  Where(std::string_view text) : kind_(Kind::kText), text_(text) {}

  static Where element(const Where& parent, size_t index) {
    return Where(Kind::kElement, &parent, index, nullptr);
  }
  static Where map_key(const Where& parent) { return Where(Kind::kMapKey, &parent, 0, nullptr); }
  static Where map_value(const Where& parent, const Value& key) {
    return Where(Kind::kMapValue, &parent, 0, &key);
  }
  // A root rendered by `render` — the registry's "argument 2 of add(Tensor, Tensor) -> Tensor"
  // builds the signature's text only when needed.
  static Where custom(Render render, const void* subject, size_t index) {
    Where w(Kind::kCustom, nullptr, index, subject);
    w.render_ = render;
    return w;
  }

  // The full description, root first.
  std::string str() const;

 private:
  enum class Kind : uint8_t { kText, kElement, kMapKey, kMapValue, kCustom };
  Where(Kind kind, const Where* parent, size_t index, const void* subject)
      : kind_(kind), parent_(parent), index_(index), subject_(subject) {}
  void append_to(std::string& out) const;

  Kind kind_;
  const Where* parent_ = nullptr;
  size_t index_ = 0;
  const void* subject_ = nullptr;  // kMapValue: the key Value; kCustom: render's subject
  Render render_ = nullptr;
  std::string_view text_;
};

template <typename T, typename Enable = void>
struct ValueConverter;  // specialisations below; a missing one is a compile error

namespace detail {

// The context of a conversion made outside any call (CallContext{}).
const CallContext& no_call_context();

template <typename C>
concept ConvertsFromWithContext = requires(const Value& v, const Where& w, const CallContext& c) {
  C::from(v, w, c);
};
template <typename C>
concept ConvertsFromWhere = requires(const Value& v, const Where& w) {
  C::from(v, w);
};
template <typename C, typename T>
concept ConvertsToWithContext = requires(const T& x, const CallContext& c) {
  { C::to(x, c) } -> std::convertible_to<Value>;
};

}  // namespace detail

template <typename T>
Value to_value(const T& x, const CallContext& ctx) {
  using C = ValueConverter<std::decay_t<T>>;
  if constexpr (detail::ConvertsToWithContext<C, T>) {
    return C::to(x, ctx);
  } else {
    return C::to(x);
  }
}

template <typename T>
Value to_value(const T& x) {
  return to_value(x, detail::no_call_context());
}

template <typename T>
std::decay_t<T> from_value(const Value& v, const Where& where, const CallContext& ctx) {
  using C = ValueConverter<std::decay_t<T>>;
  if constexpr (detail::ConvertsFromWithContext<C>) {
    return C::from(v, where, ctx);
  } else if constexpr (detail::ConvertsFromWhere<C>) {
    return C::from(v, where);
  } else {
    return C::from(v, where.str());  // a converter taking the description as text
  }
}

template <typename T>
std::decay_t<T> from_value(const Value& v, const Where& where) {
  return from_value<T>(v, where, detail::no_call_context());
}

template <typename T>
std::string type_name() {
  return ValueConverter<std::decay_t<T>>::name();
}

namespace detail {

// "<where>: expected <expected>, got <describe(v)>".
[[noreturn]] void throw_type_mismatch(const Where& where, const std::string& expected,
                                      const Value& received);
[[noreturn]] void throw_out_of_range(const Where& where, const std::string& expected,
                                     int64_t received);
[[noreturn]] void throw_duplicate_key(const Where& where, const Value& key);

}  // namespace detail

template <>
struct ValueConverter<Value> {
  static Value to(const Value& v) { return v; }
  static Value from(const Value& v, const Where&) { return v; }
  static std::string name() { return "any"; }
};

template <>
struct ValueConverter<bool> {
  static Value to(bool v) { return Value(v); }
  static bool from(const Value& v, const Where& where) {
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
  static T from(const Value& v, const Where& where) {
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
  static T from(const Value& v, const Where& where) {
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
  static std::string from(const Value& v, const Where& where) {
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
  static Bytes from(const Value& v, const Where& where) {
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
  static Tensor from(const Value& v, const Where& where) {
    if (v.type() != ValueType::kTensor) detail::throw_type_mismatch(where, name(), v);
    return v.as_tensor();
  }
  static std::string name() { return "Tensor"; }
};

template <>
struct ValueConverter<RRefDescriptor> {
  static Value to(const RRefDescriptor& v) { return Value(v); }
  static RRefDescriptor from(const Value& v, const Where& where) {
    if (v.type() != ValueType::kRRef) detail::throw_type_mismatch(where, name(), v);
    return v.as_rref();
  }
  static std::string name() { return "RRef"; }
};

// The containers below take the call's context and hand it to their elements; their
// two-argument forms convert outside any call.

template <typename T>
struct ValueConverter<std::optional<T>> {
  static Value to(const std::optional<T>& v, const CallContext& ctx) {
    return v ? to_value(*v, ctx) : Value();
  }
  static Value to(const std::optional<T>& v) { return to(v, detail::no_call_context()); }
  static std::optional<T> from(const Value& v, const Where& where, const CallContext& ctx) {
    if (v.is_none()) return std::nullopt;
    return from_value<T>(v, where, ctx);
  }
  static std::optional<T> from(const Value& v, const Where& where) {
    return from(v, where, detail::no_call_context());
  }
  static std::string name() { return "optional<" + type_name<T>() + ">"; }
};

template <typename T, typename A>
struct ValueConverter<std::vector<T, A>, std::enable_if_t<!std::is_same_v<T, uint8_t>>> {
  static Value to(const std::vector<T, A>& v, const CallContext& ctx) {
    Value::List items;
    items.reserve(v.size());
    for (const auto& x : v)
      items.push_back(to_value(x, ctx));
    return Value::list(std::move(items));
  }
  static Value to(const std::vector<T, A>& v) { return to(v, detail::no_call_context()); }
  static std::vector<T, A> from(const Value& v, const Where& where, const CallContext& ctx) {
    if (v.type() != ValueType::kList) detail::throw_type_mismatch(where, name(), v);
    const Value::List& items = v.as_list();
    std::vector<T, A> out;
    out.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i)
      out.push_back(from_value<T>(items[i], Where::element(where, i), ctx));
    return out;
  }
  static std::vector<T, A> from(const Value& v, const Where& where) {
    return from(v, where, detail::no_call_context());
  }
  static std::string name() { return "list<" + type_name<T>() + ">"; }
};

template <typename T, size_t N>
struct ValueConverter<std::array<T, N>> {
  static Value to(const std::array<T, N>& v, const CallContext& ctx) {
    Value::List items;
    items.reserve(N);
    for (const auto& x : v)
      items.push_back(to_value(x, ctx));
    return Value::list(std::move(items));
  }
  static Value to(const std::array<T, N>& v) { return to(v, detail::no_call_context()); }
  static std::array<T, N> from(const Value& v, const Where& where, const CallContext& ctx) {
    if (v.type() != ValueType::kList || v.as_list().size() != N) {
      detail::throw_type_mismatch(where, name(), v);
    }
    std::array<T, N> out{};
    for (size_t i = 0; i < N; ++i)
      out[i] = from_value<T>(v.as_list()[i], Where::element(where, i), ctx);
    return out;
  }
  static std::array<T, N> from(const Value& v, const Where& where) {
    return from(v, where, detail::no_call_context());
  }
  static std::string name() { return "list<" + type_name<T>() + ">[" + std::to_string(N) + "]"; }
};

template <typename... Ts>
struct ValueConverter<std::tuple<Ts...>> {
  static Value to(const std::tuple<Ts...>& v, const CallContext& ctx) {
    return std::apply(
        [&](const auto&... xs) { return Value::list(Value::List{to_value(xs, ctx)...}); }, v);
  }
  static Value to(const std::tuple<Ts...>& v) { return to(v, detail::no_call_context()); }
  static std::tuple<Ts...> from(const Value& v, const Where& where, const CallContext& ctx) {
    if (v.type() != ValueType::kList || v.as_list().size() != sizeof...(Ts)) {
      detail::throw_type_mismatch(where, name(), v);
    }
    return unpack(v.as_list(), where, ctx, std::index_sequence_for<Ts...>{});
  }
  static std::tuple<Ts...> from(const Value& v, const Where& where) {
    return from(v, where, detail::no_call_context());
  }
  static std::string name() {
    std::string s = "tuple<";
    bool first = true;
    ((s += (first ? "" : ", ") + type_name<Ts>(), first = false), ...);
    return s + ">";
  }

 private:
  template <size_t... I>
  static std::tuple<Ts...> unpack(const Value::List& items, const Where& where,
                                  const CallContext& ctx, std::index_sequence<I...>) {
    return std::tuple<Ts...>(from_value<Ts>(items[I], Where::element(where, I), ctx)...);
  }
};

template <typename A, typename B>
struct ValueConverter<std::pair<A, B>> {
  static Value to(const std::pair<A, B>& v, const CallContext& ctx) {
    return Value::list(Value::List{to_value(v.first, ctx), to_value(v.second, ctx)});
  }
  static Value to(const std::pair<A, B>& v) { return to(v, detail::no_call_context()); }
  static std::pair<A, B> from(const Value& v, const Where& where, const CallContext& ctx) {
    auto t = ValueConverter<std::tuple<A, B>>::from(v, where, ctx);
    return {std::move(std::get<0>(t)), std::move(std::get<1>(t))};
  }
  static std::pair<A, B> from(const Value& v, const Where& where) {
    return from(v, where, detail::no_call_context());
  }
  static std::string name() { return "pair<" + type_name<A>() + ", " + type_name<B>() + ">"; }
};

namespace detail {

template <typename M>
struct MapConverter {
  using K = typename M::key_type;
  using V = typename M::mapped_type;
  static Value to(const M& m, const CallContext& ctx) {
    Value::Map entries;
    entries.reserve(m.size());
    for (const auto& [k, v] : m)
      entries.emplace_back(to_value(k, ctx), to_value(v, ctx));
    return Value::map(std::move(entries));
  }
  static Value to(const M& m) { return to(m, no_call_context()); }
  static M from(const Value& v, const Where& where, const CallContext& ctx) {
    if (v.type() != ValueType::kMap) throw_type_mismatch(where, name(), v);
    M out;
    for (const auto& [k, x] : v.as_map()) {
      K key = from_value<K>(k, Where::map_key(where), ctx);
      if (!out.emplace(std::move(key), from_value<V>(x, Where::map_value(where, k), ctx)).second) {
        throw_duplicate_key(where, k);
      }
    }
    return out;
  }
  static M from(const Value& v, const Where& where) { return from(v, where, no_call_context()); }
  static std::string name() { return "map<" + type_name<K>() + ", " + type_name<V>() + ">"; }
};

}  // namespace detail

template <typename K, typename V, typename C, typename A>
struct ValueConverter<std::map<K, V, C, A>> : detail::MapConverter<std::map<K, V, C, A>> {};
template <typename K, typename V, typename H, typename E, typename A>
struct ValueConverter<std::unordered_map<K, V, H, E, A>>
    : detail::MapConverter<std::unordered_map<K, V, H, E, A>> {};

}  // namespace gradwire::rpc

// Registry: the functions and classes a worker lets its peers call, by name.
//
// Only what is registered can be called from the wire; nothing received is ever turned
// into code. Each entry keeps its C++ signature, so arguments arriving as Values are
// checked and converted (ValueConverter) before the function runs, and a wrong name,
// arity or type becomes an InvalidArgument naming the function, the expected and the
// received types — which the agent sends back to the caller.
//
//   def(name, fn)                 a plain function, a lambda or any callable with one
//                                 signature; a callable returning Future<T> replies when
//                                 that future completes (asynchronous execution)
//   def(name, fn, Execution::kInline)
//                                 the same, run by the agent on the I/O thread that received
//                                 the request instead of its pool (see Execution)
//   def_class<T>(name)            a class: .ctor<Args...>() and .method(name, &T::m) (or a
//                                 callable taking T& first)
//   invoke(name, args, executor)  checks and converts args, calls, converts the result;
//                                 continuations of asynchronous results run on executor
//   construct / invoke_method     the same for classes (rref/ keeps the objects)
//
// registry() is the process's default registry, which agents use unless given another:
// registering is declaring code, not runtime state, so one per process is what users
// expect (several agents in one process share it).
//
// Thread-safety: every method may be called from any thread; definitions made while calls
// run are seen by later lookups.
// Errors: def of a name already defined: InvalidArgument. An unknown name, a wrong arity or
// argument type: CallRejected (an InvalidArgument). What the function throws is stored in the
// returned future as is.
//
// Example:
//   rpc::registry().def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
//   rpc::registry().def_class<Counter>("Counter").ctor<int64_t>().method("inc", &Counter::inc);
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "gradwire/core/executor.h"
#include "gradwire/core/future.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/value_convert.h"

namespace gradwire::rpc {

// A call the registry refused before running any user code: an unknown function, class or
// method, a wrong number of arguments, or an argument of the wrong type. The agent sends it
// back marked as such, so the caller gets an InvalidArgument (a mistake in the call) rather
// than a RemoteError (a failure of the function).
class CallRejected : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// "add(Tensor, Tensor) -> Tensor".
struct Signature {
  std::string name;
  std::vector<std::string> parameters;
  std::string result;
  std::string text() const;
};

namespace detail {

template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {
  using value_type = T;
};

// Turns what a function returned into Future<Value>.
template <typename R>
struct ResultAdapter {
  static std::string name() {
    if constexpr (std::is_void_v<R>) {
      return "None";
    } else if constexpr (IsFuture<R>::value) {
      using U = typename IsFuture<R>::value_type;
      if constexpr (std::is_void_v<U>) {
        return "Future<None>";
      } else {
        return "Future<" + type_name<U>() + ">";
      }
    } else {
      return type_name<R>();
    }
  }
};

template <typename F>
Future<Value> call_and_wrap(F&& call, const std::shared_ptr<Executor>& executor) {
  using R = std::decay_t<std::invoke_result_t<F&>>;
  if constexpr (std::is_void_v<R>) {
    call();
    return make_ready_future(Value());
  } else if constexpr (IsFuture<R>::value) {
    using U = typename IsFuture<R>::value_type;
    R pending = call();
    return pending.then(executor, [](R done) {
      if constexpr (std::is_void_v<U>) {
        done.get(std::chrono::milliseconds(1));
        return Value();
      } else {
        return to_value(done.value());
      }
    });
  } else {
    return make_ready_future(to_value(call()));
  }
}

std::string argument_list(const std::vector<Value>& args);
[[noreturn]] void throw_arity(const Signature& sig, const std::vector<Value>& args);

template <typename Tuple, size_t... I>
Tuple convert_args(const std::vector<Value>& args, const Signature& sig,
                   std::index_sequence<I...>) {
  return Tuple(from_value<std::tuple_element_t<I, Tuple>>(
      args[I], "argument " + std::to_string(I + 1) + " of " + sig.text())...);
}

template <typename... Args>
std::tuple<std::decay_t<Args>...> convert_all(const std::vector<Value>& args,
                                              const Signature& sig) {
  if (args.size() != sizeof...(Args)) throw_arity(sig, args);
  try {
    return convert_args<std::tuple<std::decay_t<Args>...>>(args, sig,
                                                           std::index_sequence_for<Args...>{});
  } catch (const CallRejected&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw CallRejected(e.what());
  }
}

template <typename R, typename... Args>
Signature make_signature(std::string name) {
  return Signature{std::move(name), {type_name<Args>()...}, ResultAdapter<std::decay_t<R>>::name()};
}

// A callable's signature, from std::function's deduction guide.
template <typename F>
struct CallableTraits : CallableTraits<decltype(std::function{std::declval<F>()})> {};
template <typename R, typename... Args>
struct CallableTraits<std::function<R(Args...)>> {
  using Result = R;
  using ArgsTuple = std::tuple<Args...>;
};

}  // namespace detail

class Registry;

template <typename T>
class ClassBuilder {
 public:
  // Registers the constructor T(Args...).
  template <typename... Args>
  ClassBuilder& ctor();
  // A member function (const or not), or a callable whose first parameter is T& (or
  // const T&).
  template <typename M>
  ClassBuilder& method(std::string name, M method);

 private:
  friend class Registry;
  ClassBuilder(Registry& registry, std::string name)
      : registry_(registry), name_(std::move(name)) {}
  template <typename R, typename... Args, typename Call>
  ClassBuilder& add_method(std::string name, Call call);
  Registry& registry_;
  std::string name_;
};

// Where the receiving agent runs a registered function.
// - kPool (the default): on the agent's thread pool. Any function may block, wait for other
//   calls, or take long.
// - kInline: on the I/O thread that received the request, with no hand-off to the pool:
//   about half the latency of a small call (a thread wake-up each way is most of it). Only
//   for short functions that never block: no rpc_sync, no waiting on futures or locks held
//   long, no large computations — while it runs, that I/O thread delivers nothing else. A
//   function returning Future<T> replies from the pool when the future completes.
enum class Execution { kPool, kInline };

class Registry {
 public:
  using Invoker = std::function<Future<Value>(const std::vector<Value>& args,
                                              const std::shared_ptr<Executor>& executor)>;
  using Constructor = std::function<std::shared_ptr<void>(const std::vector<Value>& args)>;
  using MethodInvoker = std::function<Future<Value>(const std::shared_ptr<void>& object,
                                                    const std::vector<Value>& args,
                                                    const std::shared_ptr<Executor>& executor)>;

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  template <typename F>
  Registry& def(std::string name, F fn, Execution execution = Execution::kPool);

  template <typename T>
  ClassBuilder<T> def_class(std::string name);

  bool has_function(std::string_view name) const;
  // kPool for a name that is not registered.
  Execution execution(std::string_view name) const;
  Signature signature(std::string_view name) const;  // InvalidArgument when unknown
  std::vector<Signature> functions() const;
  // Never throws: a failure (unknown name, bad arguments, the function's own exception)
  // is stored in the returned future.
  Future<Value> invoke(std::string_view name, const std::vector<Value>& args,
                       const std::shared_ptr<Executor>& executor) const;

  bool has_class(std::string_view name) const;
  // The registered class of C++ type T, or "" (rref/ uses it to name types).
  template <typename T>
  std::string class_name_of() const;
  // Throws InvalidArgument for an unknown class, a class without a constructor, or bad
  // arguments; rethrows what the constructor throws.
  std::shared_ptr<void> construct(std::string_view class_name,
                                  const std::vector<Value>& args) const;
  Signature method_signature(std::string_view class_name, std::string_view method) const;
  Future<Value> invoke_method(std::string_view class_name, std::string_view method,
                              const std::shared_ptr<void>& object, const std::vector<Value>& args,
                              const std::shared_ptr<Executor>& executor) const;

  // Low-level registration (what def and def_class use).
  void add_function(Signature signature, Invoker invoker, Execution execution = Execution::kPool);
  void add_class(std::string name, std::type_index type);
  void add_constructor(std::string_view class_name, Signature signature, Constructor ctor);
  void add_method(std::string_view class_name, Signature signature, MethodInvoker invoker);

 private:
  struct Function {
    Signature signature;
    Invoker invoker;
    Execution execution{Execution::kPool};
  };
  struct Method {
    Signature signature;
    MethodInvoker invoker;
  };
  struct Class {
    std::type_index type;
    std::optional<Signature> ctor_signature;
    Constructor ctor;
    std::map<std::string, Method, std::less<>> methods;
  };
  // Both require mutex_ held (shared) and throw InvalidArgument naming what exists.
  const Class& find_class(std::string_view name) const;
  const Method& find_method(std::string_view class_name, std::string_view method) const;

  mutable std::shared_mutex mutex_;
  std::map<std::string, Function, std::less<>> functions_;
  std::map<std::string, Class, std::less<>> classes_;
};

// The process's default registry.
Registry& registry();

// ---- templates

template <typename F>
Registry& Registry::def(std::string name, F fn, Execution execution) {
  using Traits = detail::CallableTraits<F>;
  using R = typename Traits::Result;
  [&]<typename... Args>(std::tuple<Args...>*) {
    Signature sig = detail::make_signature<R, std::decay_t<Args>...>(name);
    Signature captured = sig;
    add_function(
        std::move(sig),
        [fn = std::move(fn), captured](const std::vector<Value>& args,
                                       const std::shared_ptr<Executor>& executor) mutable {
          auto converted = detail::convert_all<Args...>(args, captured);
          return detail::call_and_wrap([&]() -> R { return std::apply(fn, converted); }, executor);
        },
        execution);
  }(static_cast<typename Traits::ArgsTuple*>(nullptr));
  return *this;
}

template <typename T>
ClassBuilder<T> Registry::def_class(std::string name) {
  add_class(name, std::type_index(typeid(T)));
  return ClassBuilder<T>(*this, std::move(name));
}

template <typename T>
std::string Registry::class_name_of() const {
  std::shared_lock lock(mutex_);
  for (const auto& [name, cls] : classes_) {
    if (cls.type == std::type_index(typeid(T))) return name;
  }
  return "";
}

template <typename T>
template <typename... Args>
ClassBuilder<T>& ClassBuilder<T>::ctor() {
  Signature sig = detail::make_signature<void, Args...>(name_);
  sig.result = name_;
  Signature captured = sig;
  registry_.add_constructor(name_, std::move(sig), [captured](const std::vector<Value>& args) {
    auto converted = detail::convert_all<Args...>(args, captured);
    return std::static_pointer_cast<void>(std::apply(
        [](auto&&... xs) { return std::make_shared<T>(std::forward<decltype(xs)>(xs)...); },
        std::move(converted)));
  });
  return *this;
}

template <typename T>
template <typename R, typename... Args, typename Call>
ClassBuilder<T>& ClassBuilder<T>::add_method(std::string name, Call call) {
  Signature sig = detail::make_signature<R, std::decay_t<Args>...>(name_ + "." + name);
  Signature captured = sig;
  registry_.add_method(
      name_, std::move(sig),
      [call = std::move(call), captured](const std::shared_ptr<void>& object,
                                         const std::vector<Value>& args,
                                         const std::shared_ptr<Executor>& executor) mutable {
        T& self = *static_cast<T*>(object.get());
        auto converted = detail::convert_all<Args...>(args, captured);
        return detail::call_and_wrap(
            [&]() -> R {
              return std::apply([&](auto&... xs) -> R { return call(self, xs...); }, converted);
            },
            executor);
      });
  return *this;
}

namespace detail {

template <typename T, typename M>
struct MethodTraits;
template <typename T, typename R, typename C, typename... Args>
struct MethodTraits<T, R (C::*)(Args...)> {
  using Result = R;
  using ArgsTuple = std::tuple<Args...>;
};
template <typename T, typename R, typename C, typename... Args>
struct MethodTraits<T, R (C::*)(Args...) const> {
  using Result = R;
  using ArgsTuple = std::tuple<Args...>;
};

template <typename Tuple>
struct DropFirst;
template <typename First, typename... Rest>
struct DropFirst<std::tuple<First, Rest...>> {
  using type = std::tuple<Rest...>;
};

}  // namespace detail

template <typename T>
template <typename M>
ClassBuilder<T>& ClassBuilder<T>::method(std::string name, M method) {
  if constexpr (std::is_member_function_pointer_v<M>) {
    using Traits = detail::MethodTraits<T, M>;
    using R = typename Traits::Result;
    return [&]<typename... Args>(std::tuple<Args...>*) -> ClassBuilder& {
      return add_method<R, Args...>(std::move(name), [method](T& self, auto&&... xs) -> R {
        return (self.*method)(std::forward<decltype(xs)>(xs)...);
      });
    }(static_cast<typename Traits::ArgsTuple*>(nullptr));
  } else {
    using Traits = detail::CallableTraits<M>;
    using R = typename Traits::Result;
    using Rest = typename detail::DropFirst<typename Traits::ArgsTuple>::type;
    return [&]<typename... Args>(std::tuple<Args...>*) -> ClassBuilder& {
      return add_method<R, Args...>(std::move(name), [method](T& self, auto&&... xs) -> R {
        return method(self, std::forward<decltype(xs)>(xs)...);
      });
    }(static_cast<Rest*>(nullptr));
  }
}

}  // namespace gradwire::rpc

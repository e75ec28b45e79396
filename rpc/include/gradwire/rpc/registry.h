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
//   find(name)                    the registered function, looked up once: the agent reads
//                                 its execution() and invokes it without a second lookup
//   invoke(ctx, name, args, executor)
//                                 checks and converts args, calls, converts the result;
//                                 an asynchronous result is converted by the executor's
//                                 worker that completes it, or on the executor
//   construct / invoke_method     the same for classes (rref/ keeps the objects)
//   .copyable()                   a class whose objects may be copied to a caller (rref's
//                                 to_here), through its ValueConverter
//   .serialised()                 a class whose methods run one at a time per object;
//                                 otherwise they run concurrently and must be thread-safe
//
// The call's context. A function or method may take `const CallContext&` as its first
// parameter (after `T&` for a method): the agent serving the call, the caller, the request
// id and its deadline (call_context.h). It is not an argument on the wire: signatures and
// arity leave it out. The same context reaches every ValueConverter that converts the
// call's arguments and result, so context-aware types (RRefs) convert where they sit.
// invoke() without a context passes CallContext{} ("outside any agent").
//
// One entry per function, never copied per call. The callable given to def() is stored
// once; every call runs that same object — a mutable lambda keeps its state from call to
// call, and large captures are not copied. Calls run concurrently on the agent's pool
// threads, so a callable with mutable state must synchronise it itself:
//   std::atomic<int64_t> n{0};
//   reg.def("count", [&n] { return ++n; });              // fine
//   reg.def("count", [n = int64_t{0}]() mutable { return ++n; });  // one caller at a time only
//
// registry() is the process's default registry, which agents use unless given another:
// registering is declaring code, not runtime state, so one per process is what users
// expect (several agents in one process share it).
//
// Thread-safety: every method may be called from any thread; definitions made while calls
// run are seen by later lookups. Lookups share a reader lock; no user code runs under it.
// Errors: def of a name already defined: InvalidArgument. An unknown name, a wrong arity or
// argument type: CallRejected (an InvalidArgument). What the function throws is stored in the
// returned future as is.
//
// Example:
//   rpc::registry().def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
//   rpc::registry().def("whoami", [](const rpc::CallContext& ctx) { return ctx.caller().name; });
//   rpc::registry().def_class<Counter>("Counter").ctor<int64_t>().method("inc", &Counter::inc);
#pragma once

#include <functional>
#include <map>
#include <memory>
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
#include "gradwire/rpc/call_context.h"
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

// Where the receiving agent runs a registered function.
// - kPool (the default): on the agent's thread pool. Any function may block, wait for other
//   calls, or take long.
// - kInline: on the I/O thread that received the request, with no hand-off to the pool:
//   about half the latency of a small call (a thread wake-up each way is most of it). Only
//   for short functions that never block: no rpc_sync, no waiting on futures or locks held
//   long, no large computations — while it runs, that I/O thread delivers nothing else. A
//   function returning Future<T> replies from the pool when the future completes.
//   TensorPipe runs its loop on whichever thread enters it first, so a thread that is
//   sending (a caller in rpc_async, a pool thread writing a reply) sometimes takes a request
//   off the wire; such a request runs on the agent's inline thread instead (one thread,
//   started when first needed), so that an inline function never runs inside somebody's
//   send (where a lock it takes may be held) and never waits for a busy pool.
enum class Execution { kPool, kInline };

// One registered function: its signature, where it runs, and the code that converts its
// arguments, calls it and converts its result. Registry::find() hands out shared pointers
// to it, so a caller that looked it up once keeps it alive and calls it outside the
// registry's lock; it stays valid after the registry is gone.
//
// Thread-safety: immutable once built; invoke() may run on many threads at once (see the
// head of this file about callables with mutable state).
class RegisteredFunction {
 public:
  using Invoker =
      std::function<Future<Value>(const CallContext& ctx, const std::vector<Value>& args,
                                  const std::shared_ptr<Executor>& executor)>;

  // Built by Registry::add_function (what def() uses).
  RegisteredFunction(Signature signature, Invoker invoker, Execution execution)
      : signature_(std::move(signature)), invoker_(std::move(invoker)), execution_(execution) {}

  const Signature& signature() const { return signature_; }
  Execution execution() const { return execution_; }

  // Converts `args` (each converter seeing `ctx`), calls the function and converts its
  // result; a Future<T> result completes the returned future later, from `executor`.
  // Never throws: a wrong arity or argument type (CallRejected) and whatever the function
  // throws are stored in the returned future.
  Future<Value> invoke(const CallContext& ctx, const std::vector<Value>& args,
                       const std::shared_ptr<Executor>& executor) const;

 private:
  Signature signature_;
  // std::function::operator() is const but calls its target as non-const, so a mutable
  // callable stored here keeps its state across calls (and must synchronise it).
  Invoker invoker_;
  Execution execution_;
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
Future<Value> call_and_wrap(F&& call, const std::shared_ptr<Executor>& executor,
                            const CallContext& ctx) {
  using R = std::decay_t<std::invoke_result_t<F&>>;
  if constexpr (std::is_void_v<R>) {
    call();
    return make_ready_future(Value());
  } else if constexpr (IsFuture<R>::value) {
    using U = typename IsFuture<R>::value_type;
    R pending = call();
    // The result is converted once it exists: at once when it already does; else on the
    // thread that completes it when that is one of the executor's own (a pool worker, which
    // has its value in hand), otherwise on the executor. The context travels by value.
    return gradwire::detail::map_here_or_on<Value>(pending, executor, [ctx](const R& done) {
      if constexpr (std::is_void_v<U>) {
        done.get(std::chrono::milliseconds(1));
        return Value();
      } else {
        return to_value(done.value(), ctx);
      }
    });
  } else {
    return make_ready_future(to_value(call(), ctx));
  }
}

std::string argument_list(const std::vector<Value>& args);
[[noreturn]] void throw_arity(const Signature& sig, const std::vector<Value>& args);
// A Where::Render for "argument <index + 1> of <signature text>"; `signature` is a
// const Signature*.
void render_argument(std::string& out, const void* signature, size_t index);

template <typename Tuple, size_t... I>
Tuple convert_args(const std::vector<Value>& args, const Signature& sig, const CallContext& ctx,
                   std::index_sequence<I...>) {
  // Braces: arguments convert left to right, so the first bad one is the one reported.
  return Tuple{from_value<std::tuple_element_t<I, Tuple>>(
      args[I], Where::custom(&render_argument, &sig, I), ctx)...};
}

template <typename... Args>
std::tuple<std::decay_t<Args>...> convert_all(const std::vector<Value>& args, const Signature& sig,
                                              const CallContext& ctx) {
  if (args.size() != sizeof...(Args)) throw_arity(sig, args);
  try {
    return convert_args<std::tuple<std::decay_t<Args>...>>(args, sig, ctx,
                                                           std::index_sequence_for<Args...>{});
  } catch (const CallRejected&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw CallRejected(e.what());
  }
}

// A converted argument, handed to a parameter of type P: moved, unless P is a non-const
// lvalue reference (which needs an lvalue). Saves copying strings and lists per call.
template <typename P, typename T>
std::conditional_t<std::is_lvalue_reference_v<P> && !std::is_const_v<std::remove_reference_t<P>>,
                   T&, T&&>
pass_argument(T& converted) {
  if constexpr (std::is_lvalue_reference_v<P> && !std::is_const_v<std::remove_reference_t<P>>) {
    return converted;
  } else {
    return std::move(converted);
  }
}

// fn(prefix..., converted arguments...), each argument passed as its parameter in Params
// (a std::tuple of the declared parameter types) wants it.
template <typename R, typename Params, typename F, typename Converted, size_t... I,
          typename... Prefix>
R call_converted(F& fn, Converted& converted, std::index_sequence<I...>, Prefix&... prefix) {
  return fn(prefix..., pass_argument<std::tuple_element_t<I, Params>>(std::get<I>(converted))...);
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

// Whether a parameter list starts with the call's context, and the parameters after it
// (the ones that travel on the wire).
template <typename Tuple>
struct SplitContext {
  static constexpr bool kTakesContext = false;
  using Wire = Tuple;
};
template <typename First, typename... Rest>
struct SplitContext<std::tuple<First, Rest...>> {
  static constexpr bool kTakesContext = std::is_same_v<std::remove_cvref_t<First>, CallContext>;
  static_assert(!kTakesContext || std::is_convertible_v<const CallContext&, First>,
                "a registered function takes the call's context as const CallContext&");
  using Wire = std::conditional_t<kTakesContext, std::tuple<Rest...>, std::tuple<First, Rest...>>;
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
  // const T&); either may take `const CallContext&` next, before the wire parameters.
  template <typename M>
  ClassBuilder& method(std::string name, M method);
  // Objects of T may be copied to a caller (RRef<T>::to_here): they travel as
  // ValueConverter<T> makes them, which T must have.
  ClassBuilder& copyable();
  // Methods of one object run one at a time (rref/ holds a lock per object around each
  // call), for classes that are not thread-safe. Without it, methods run concurrently on
  // the agent's pool threads and T must synchronise itself.
  ClassBuilder& serialised();

 private:
  friend class Registry;
  ClassBuilder(Registry& registry, std::string name)
      : registry_(registry), name_(std::move(name)) {}
  // `call` is invoked as call(T&, [const CallContext&,] Params...).
  template <typename R, typename Params, bool kTakesContext, typename Call>
  ClassBuilder& add_method(std::string name, Call call);
  Registry& registry_;
  std::string name_;
};

class Registry {
 public:
  using Invoker = RegisteredFunction::Invoker;
  using Constructor =
      std::function<std::shared_ptr<void>(const CallContext& ctx, const std::vector<Value>& args)>;
  using MethodInvoker = std::function<Future<Value>(
      const CallContext& ctx, const std::shared_ptr<void>& object, const std::vector<Value>& args,
      const std::shared_ptr<Executor>& executor)>;

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers `fn` under `name`. Its parameters, after an optional leading
  // `const CallContext&`, are the call's arguments; `fn` is moved into the one entry that
  // every call runs (see the head of this file).
  template <typename F>
  Registry& def(std::string name, F fn, Execution execution = Execution::kPool);

  template <typename T>
  ClassBuilder<T> def_class(std::string name);

  // The function registered under `name`, or null. One lookup under the reader lock; the
  // entry is then used without the lock. What the agent calls for every request:
  //   auto fn = registry.find(request.function);
  //   if (!fn) return make_failed_future<Value>(registry.unknown_function(request.function));
  //   ... fn->execution() ...  fn->invoke(ctx, request.args, pool);
  std::shared_ptr<const RegisteredFunction> find(std::string_view name) const;
  // The error for a call to a function that is not registered:
  // "no function 'nope' is registered (registered: add, mul)".
  CallRejected unknown_function(std::string_view name) const;

  bool has_function(std::string_view name) const;
  // kPool for a name that is not registered.
  Execution execution(std::string_view name) const;
  Signature signature(std::string_view name) const;  // CallRejected when unknown
  std::vector<Signature> functions() const;
  // find(name) and its invoke(); never throws: a failure (unknown name, bad arguments, the
  // function's own exception) is stored in the returned future. Without `ctx`, the call is
  // made outside any agent (CallContext{}).
  Future<Value> invoke(const CallContext& ctx, std::string_view name,
                       const std::vector<Value>& args,
                       const std::shared_ptr<Executor>& executor) const;
  Future<Value> invoke(std::string_view name, const std::vector<Value>& args,
                       const std::shared_ptr<Executor>& executor) const;

  // What rref/ needs to know of a class: its C++ type and how its objects may be used.
  struct ClassInfo {
    std::string name;
    std::type_index type;
    bool copyable{false};
    bool serialised{false};
  };
  // Function signatures turn into copies for copyable classes (copy_object).
  using Copier = std::function<Value(const CallContext& ctx, const std::shared_ptr<void>& object)>;

  bool has_class(std::string_view name) const;
  // CallRejected naming the registered classes when there is no such class.
  ClassInfo class_info(std::string_view class_name) const;
  // The object as a Value (ValueConverter of its type); CallRejected when the class is not
  // copyable.
  Value copy_object(const CallContext& ctx, std::string_view class_name,
                    const std::shared_ptr<void>& object) const;
  void set_copyable(std::string_view class_name, Copier copier);
  void set_serialised(std::string_view class_name);
  // The registered class of C++ type T, or "" (rref/ uses it to name types).
  template <typename T>
  std::string class_name_of() const;
  // Throws InvalidArgument (CallRejected) for an unknown class, a class without a
  // constructor, or bad arguments; rethrows what the constructor throws.
  std::shared_ptr<void> construct(const CallContext& ctx, std::string_view class_name,
                                  const std::vector<Value>& args) const;
  std::shared_ptr<void> construct(std::string_view class_name,
                                  const std::vector<Value>& args) const;
  Signature method_signature(std::string_view class_name, std::string_view method) const;
  // Never throws, as invoke().
  Future<Value> invoke_method(const CallContext& ctx, std::string_view class_name,
                              std::string_view method, const std::shared_ptr<void>& object,
                              const std::vector<Value>& args,
                              const std::shared_ptr<Executor>& executor) const;
  Future<Value> invoke_method(std::string_view class_name, std::string_view method,
                              const std::shared_ptr<void>& object, const std::vector<Value>& args,
                              const std::shared_ptr<Executor>& executor) const;

  // Low-level registration (what def and def_class use).
  void add_function(Signature signature, Invoker invoker, Execution execution = Execution::kPool);
  void add_class(std::string name, std::type_index type);
  void add_constructor(std::string_view class_name, Signature signature, Constructor ctor);
  void add_method(std::string_view class_name, Signature signature, MethodInvoker invoker);

 private:
  // Like functions, constructors and methods are shared entries, called outside the lock
  // and never copied per call.
  struct Method {
    Signature signature;
    MethodInvoker invoker;
  };
  struct Ctor {
    Signature signature;
    Constructor construct;
  };
  struct Class {
    std::type_index type;
    std::shared_ptr<const Ctor> ctor;
    std::shared_ptr<const Copier> copier;  // null: not copyable
    bool serialised{false};
    std::map<std::string, std::shared_ptr<const Method>, std::less<>> methods;
  };
  // Require mutex_ held (shared).
  CallRejected unknown_function_locked(std::string_view name) const;
  // Both require mutex_ held (shared) and throw CallRejected naming what exists.
  const Class& find_class(std::string_view name) const;
  const Method& find_method(std::string_view class_name, std::string_view method) const;
  std::shared_ptr<const Method> find_method_entry(std::string_view class_name,
                                                  std::string_view method) const;

  mutable std::shared_mutex mutex_;
  std::map<std::string, std::shared_ptr<const RegisteredFunction>, std::less<>> functions_;
  std::map<std::string, Class, std::less<>> classes_;
};

// The process's default registry.
Registry& registry();

// ---- templates

template <typename F>
Registry& Registry::def(std::string name, F fn, Execution execution) {
  using Traits = detail::CallableTraits<F>;
  using R = typename Traits::Result;
  using Split = detail::SplitContext<typename Traits::ArgsTuple>;
  using Params = typename Split::Wire;
  [&]<typename... Args>(std::tuple<Args...>*) {
    Signature sig = detail::make_signature<R, std::decay_t<Args>...>(name);
    Signature captured = sig;
    add_function(
        std::move(sig),
        [fn = std::move(fn), sig = std::move(captured)](
            const CallContext& ctx, const std::vector<Value>& args,
            const std::shared_ptr<Executor>& executor) mutable {
          auto converted = detail::convert_all<Args...>(args, sig, ctx);
          return detail::call_and_wrap(
              [&]() -> R {
                if constexpr (Split::kTakesContext) {
                  return detail::call_converted<R, Params>(fn, converted,
                                                           std::index_sequence_for<Args...>{}, ctx);
                } else {
                  return detail::call_converted<R, Params>(fn, converted,
                                                           std::index_sequence_for<Args...>{});
                }
              },
              executor, ctx);
        },
        execution);
  }(static_cast<Params*>(nullptr));
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
  registry_.add_constructor(
      name_, std::move(sig),
      [sig = std::move(captured)](const CallContext& ctx, const std::vector<Value>& args) {
        auto converted = detail::convert_all<Args...>(args, sig, ctx);
        return std::static_pointer_cast<void>(std::apply(
            [](auto&&... xs) { return std::make_shared<T>(std::forward<decltype(xs)>(xs)...); },
            std::move(converted)));
      });
  return *this;
}

template <typename T>
template <typename R, typename Params, bool kTakesContext, typename Call>
ClassBuilder<T>& ClassBuilder<T>::add_method(std::string name, Call call) {
  [&]<typename... Args>(std::tuple<Args...>*) {
    Signature sig = detail::make_signature<R, std::decay_t<Args>...>(name_ + "." + name);
    Signature captured = sig;
    registry_.add_method(
        name_, std::move(sig),
        [call = std::move(call), sig = std::move(captured)](
            const CallContext& ctx, const std::shared_ptr<void>& object,
            const std::vector<Value>& args, const std::shared_ptr<Executor>& executor) mutable {
          T& self = *static_cast<T*>(object.get());
          auto converted = detail::convert_all<Args...>(args, sig, ctx);
          return detail::call_and_wrap(
              [&]() -> R {
                if constexpr (kTakesContext) {
                  return detail::call_converted<R, Params>(
                      call, converted, std::index_sequence_for<Args...>{}, self, ctx);
                } else {
                  return detail::call_converted<R, Params>(
                      call, converted, std::index_sequence_for<Args...>{}, self);
                }
              },
              executor, ctx);
        });
  }(static_cast<Params*>(nullptr));
  return *this;
}

template <typename T>
ClassBuilder<T>& ClassBuilder<T>::copyable() {
  registry_.set_copyable(name_, [](const CallContext& ctx, const std::shared_ptr<void>& object) {
    return to_value(*static_cast<const T*>(object.get()), ctx);
  });
  return *this;
}

template <typename T>
ClassBuilder<T>& ClassBuilder<T>::serialised() {
  registry_.set_serialised(name_);
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
    using Split = detail::SplitContext<typename Traits::ArgsTuple>;
    return add_method<typename Traits::Result, typename Split::Wire, Split::kTakesContext>(
        std::move(name), [method](T& self, auto&&... xs) -> typename Traits::Result {
          return (self.*method)(std::forward<decltype(xs)>(xs)...);
        });
  } else {
    using Traits = detail::CallableTraits<M>;
    using Split =
        detail::SplitContext<typename detail::DropFirst<typename Traits::ArgsTuple>::type>;
    return add_method<typename Traits::Result, typename Split::Wire, Split::kTakesContext>(
        std::move(name), std::move(method));
  }
}

}  // namespace gradwire::rpc

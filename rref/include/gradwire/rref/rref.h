// RRef<T>: a reference to a value or an object that lives on one worker (its owner) and is
// used from others — what a parameter server is built from.
//
//   rpc::registry().def_class<ParameterServer>("ParameterServer")
//       .ctor<int64_t>()
//       .method("forward", &ParameterServer::forward)
//       .method("parameter_rrefs", &ParameterServer::parameter_rrefs);
//   RRef<ParameterServer> ps = rref::remote<ParameterServer>("ps0", "ParameterServer", 10);
//   Tensor y = ps.rpc_sync<Tensor>("forward", x);        // runs on ps0, on the object
//   RRef<Tensor> w = rref::remote<Tensor>("ps0", "make_weights", 4);
//   Tensor here = w.to_here();                              // a copy of the value
//
// remote<T>(to, "Name", args...) returns at once: the owner `to` runs the registered
// class constructor (T a class registered with def_class) or function (T its result type:
// Tensor, std::vector<Tensor>, ...) and keeps the result. A remote() whose target is the
// caller itself makes an owner reference and runs the constructor or function on the
// agent's pool, with no network hop.
//
// Handles. RRef<T> is a cheap handle: copies share one reference. The owner keeps the
// value exactly as long as a reference to it is left anywhere — a handle on the owner, a
// reference held by another worker (a user), or one in flight inside a message. RRefs may
// be passed as arguments and results of rpc_sync/rpc_async, of remote() and of the method
// proxies, alone or inside lists, maps, optionals and tuples: sent to the owner they arrive
// as the owner's own reference; sent elsewhere they arrive as a new user reference (a fork)
// that the owner learns of before the sender may let go of its own. docs/rref.md describes
// the protocol and its guarantees.
//
// Method proxies. rpc_sync<R>/rpc_async<R>(method, args...) call a method registered with
// def_class on the owner's object; remote<R>(method, args...) keeps the method's result on
// the owner and returns a reference to it. Calls from many workers run concurrently on the
// owner's pool threads: the class must be thread-safe, or be registered with .serialised()
// (its methods then run one at a time per object). The reference remote() returned sends
// its calls at once (the owner awaits the creation); a reference received from another
// worker waits until the owner has confirmed it.
//
// Thread-safety: every method may be called from any thread, on the same handle or on
// copies, concurrently. Only assignment to one handle object needs the caller's
// synchronisation.
//
// Errors:
// - a call on a reference whose creating call threw fails with a RemoteError carrying the
//   remote message (to_here, every proxy call, remote());
// - the owner dies: pending calls fail with NetworkError naming the owner, and later ones
//   at once;
// - to_here and proxy calls past their timeout (CallOptions, else the agent's rpc_timeout):
//   TimeoutError;
// - an unknown method or wrong argument types: InvalidArgument naming the class, the
//   method, the expected and the received types;
// - local_value() on a user reference: InvalidArgument naming the owner;
// - T that does not match what the owner holds: InvalidArgument naming both types (from
//   remote() itself, or where a received reference is converted);
// - to_here() of an object whose class is not registered .copyable(): InvalidArgument;
// - any use once the reference's agent has shut down: Error;
// - an empty RRef (default-constructed): Error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "gradwire/core/future.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"

namespace gradwire::rref {

// The handler ids rref/ owns on every agent (rpc/ owns 1, dist_autograd/ 3): creations,
// method calls and fetches (they run user code: constructors, methods, copies and
// converters), served on the agent's pool; and the protocol's bookkeeping (fork, accept,
// delete), answered on the thread that received it.
inline constexpr uint32_t kRRefHandler = 2;
inline constexpr uint32_t kRRefControlHandler = 4;

// What one worker's reference bookkeeping holds (metrics(agent)).
struct RRefMetrics {
  int64_t owned_values{0};        // values and objects this worker owns, alive
  int64_t shared_values{0};       // of those, the ones referenced from elsewhere
  int64_t owned_forks{0};         // references to owned values held elsewhere or in flight
  int64_t user_references{0};     // references to other workers' values held here
  int64_t pending_children{0};    // references this worker sent that their owner has not
                                  // yet accepted (each keeps the value alive)
  int64_t messages_in_flight{0};  // protocol messages sent and not yet answered
};

namespace detail {

// How local_value() turns a held value into a T: classes are held as objects already;
// value types are converted from the held Value once, then held as that T.
struct LocalType {
  std::type_index type;
  std::string name;
  std::shared_ptr<void> (*from)(const rpc::Value& value, const rpc::CallContext& ctx) = nullptr;
  rpc::Value (*to)(const std::shared_ptr<void>& object, const rpc::CallContext& ctx) = nullptr;
};

// A value from the owner, and what must stay alive until it is converted (references
// inside a result made on this worker).
struct Reply {
  Future<rpc::Value> value;
  std::shared_ptr<void> keep;
};

// The state every RRef<T> handle to one reference on one worker shares: an owner
// reference (the value lives here) or a user reference (one fork of another worker's).
// Implemented in rref/src; RRef<T> is its typed face. Thread-safe.
class RRefCore {
 public:
  virtual ~RRefCore() = default;
  virtual const rpc::WorkerInfo& owner() const = 0;
  virtual uint64_t rref_id() const = 0;
  // The registered class name or the value type's name ("Counter", "Tensor").
  virtual const std::string& type_name() const = 0;
  virtual bool is_owner() const = 0;
  virtual bool confirmed_by_owner() const = 0;
  virtual Future<void> creation() const = 0;
  // The held value as a Value (a copy for the caller).
  virtual Reply fetch(rpc::CallOptions options) = 0;
  virtual Reply call(std::string method, std::vector<rpc::Value> args,
                     rpc::CallOptions options) = 0;
  virtual std::shared_ptr<RRefCore> remote(std::string method, std::string result_type,
                                           std::vector<rpc::Value> args,
                                           rpc::CallOptions options) = 0;
  // This reference as it travels in a message: mints a fork that keeps the value alive
  // until the receiver's reference is accounted for.
  virtual rpc::Value to_value(const rpc::CallContext& ctx) = 0;
  virtual std::shared_ptr<void> local_object(const LocalType& type,
                                             std::chrono::milliseconds timeout) = 0;
  // The agent the reference belongs to; Error once it has shut down.
  virtual rpc::RpcAgent& agent() const = 0;
  // "RRef 0:3 (Counter) owned by 'w0' (rank 0)".
  virtual std::string describe() const = 0;
};

// remote(): `name` is a class (constructor) or a function registered on the owner.
std::shared_ptr<RRefCore> create(rpc::RpcAgent& agent, const rpc::Destination& to, std::string name,
                                 std::string type_name, std::vector<rpc::Value> args,
                                 rpc::CallOptions options);
// An owner reference to a value (held as `value`) or an object made here.
std::shared_ptr<RRefCore> own_value(rpc::RpcAgent& agent, std::string type_name, rpc::Value value);
std::shared_ptr<RRefCore> own_object(rpc::RpcAgent& agent, std::string class_name,
                                     std::shared_ptr<void> object);
// A received rpc::Value of kind kRRef, as the reference it names on the agent serving
// `ctx`; InvalidArgument (starting with `where`) for another kind, another type, or outside
// an agent.
std::shared_ptr<RRefCore> receive(const rpc::Value& value, const rpc::Where& where,
                                  const rpc::CallContext& ctx, const std::string& expected_type);
[[noreturn]] void throw_empty();
// Registers rref/ with every agent a factory builds (called once per program, from here).
bool ensure_registered();
inline const bool kRegistered = ensure_registered();
[[noreturn]] void throw_unnamed_type(const std::string& cpp_name);
std::string demangle(const char* name);
// The context for converting arguments sent by `agent`.
rpc::CallContext sending_context(rpc::RpcAgent& agent);
// How long a call on a reference may take: the options' timeout, else the agent's
// rpc_timeout. A call waiting for its reference's confirmation counts that wait too.
std::chrono::milliseconds wait_bound(rpc::RpcAgent& agent, const rpc::CallOptions& options);
[[noreturn]] void throw_timeout(const std::string& what, std::chrono::milliseconds waited);

// Waits for `pending` at most `bound`; TimeoutError naming `what` past it.
template <typename T>
T await(Future<T> pending, std::chrono::milliseconds bound, const std::string& what) {
  if (!pending.wait(bound)) throw_timeout(what, bound);
  if constexpr (std::is_void_v<T>) {
    pending.value();
  } else {
    return pending.value();
  }
}

template <typename T>
concept HasValueConverter = requires {
  rpc::ValueConverter<T>::name();
};

// T's name as `registry` knows it: its registered class name, else its value type name.
template <typename T>
std::string type_name_in(const rpc::Registry& registry) {
  std::string cls = registry.template class_name_of<T>();
  if (!cls.empty()) return cls;
  if constexpr (HasValueConverter<T>) {
    return rpc::type_name<T>();
  } else {
    throw_unnamed_type(demangle(typeid(T).name()));
  }
}

// T's name for signatures, which are built without an agent: the process's registry.
template <typename T>
std::string static_type_name() {
  std::string cls = rpc::registry().template class_name_of<T>();
  if (!cls.empty()) return cls;
  if constexpr (HasValueConverter<T>) {
    return rpc::type_name<T>();
  } else {
    return demangle(typeid(T).name());
  }
}

template <typename T>
LocalType local_type(const rpc::Registry& registry) {
  LocalType type{std::type_index(typeid(T)), type_name_in<T>(registry)};
  if constexpr (HasValueConverter<T>) {
    type.from = [](const rpc::Value& value, const rpc::CallContext& ctx) -> std::shared_ptr<void> {
      return std::make_shared<T>(rpc::from_value<T>(value, "the value an RRef holds", ctx));
    };
    type.to = [](const std::shared_ptr<void>& object, const rpc::CallContext& ctx) {
      return rpc::to_value(*static_cast<const T*>(object.get()), ctx);
    };
  }
  return type;
}

template <typename R>
R convert_result(const rpc::Value& value, const std::string& what, rpc::RpcAgent& agent,
                 const rpc::WorkerInfo& from) {
  if constexpr (std::is_void_v<R>) {
    (void)value, (void)what, (void)agent, (void)from;
  } else {
    const rpc::CallContext received(&agent, from, 0, rpc::CallContext::Clock::time_point::max());
    return rpc::from_value<R>(value, what, received);
  }
}

// Future<Value> -> Future<R>, converted on the thread that completes it.
template <typename R>
Future<R> typed(Reply reply, std::string what, rpc::RpcAgent& agent, rpc::WorkerInfo from) {
  Future<R> result;
  gradwire::detail::on_complete_inline(
      reply.value, [result, keep = std::move(reply.keep), what = std::move(what), agent = &agent,
                    from = std::move(from)](const Future<rpc::Value>& done) mutable {
        if (done.has_error()) {
          result.try_set_error(done.error());
          return;
        }
        try {
          if constexpr (std::is_void_v<R>) {
            (void)agent;
            result.try_set_value();
          } else {
            result.try_set_value(convert_result<R>(done.value(), what, *agent, from));
          }
        } catch (...) {
          result.try_set_error(std::current_exception());
        }
      });
  return result;
}

template <typename... Args>
std::vector<rpc::Value> to_values(rpc::RpcAgent& agent, Args&&... args) {
  const rpc::CallContext ctx = sending_context(agent);
  std::vector<rpc::Value> values;
  values.reserve(sizeof...(Args));
  try {
    (values.push_back(rpc::to_value(std::forward<Args>(args), ctx)), ...);
  } catch (...) {
    // A later argument failed: the forks the earlier ones minted are given back.
    rpc::Request unsent;
    unsent.args = std::move(values);
    agent.release_unsent(unsent);
    throw;
  }
  return values;
}

}  // namespace detail

// A typed reference to a T owned by some worker (see the file comment).
template <typename T>
class RRef {
 public:
  // An empty reference; every operation throws Error.
  RRef() = default;
  explicit RRef(std::shared_ptr<detail::RRefCore> core) : core_(std::move(core)) {}

  bool valid() const { return core_ != nullptr; }
  rpc::WorkerInfo owner() const { return core().owner(); }
  bool is_owner() const { return core().is_owner(); }
  // True once the owner knows of this reference (always on the owner).
  bool confirmed_by_owner() const { return core().confirmed_by_owner(); }
  // Completes when the owner holds the value (the creating call has run: a RemoteError if
  // it threw), or, for a reference received from another worker, once the owner has
  // confirmed it.
  Future<void> creation() const { return core().creation(); }

  // A copy of the value, fetched from the owner (on the owner: converted locally). A class
  // object is copied only when its class is registered .copyable(). TimeoutError past
  // `timeout` (0: the agent's rpc_timeout).
  T to_here(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    Future<T> pending = to_here_async(timeout);
    return detail::await(std::move(pending), pending.default_timeout(),
                         "to_here of " + core().describe());
  }
  Future<T> to_here_async(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    static_assert(detail::HasValueConverter<T>,
                  "to_here() copies the value to the caller: T needs a ValueConverter (and a "
                  "class must be registered .copyable())");
    detail::RRefCore& c = core();
    const rpc::CallOptions options{timeout};
    Future<T> result =
        detail::typed<T>(c.fetch(options), "the value of " + c.describe(), c.agent(), c.owner());
    result.set_default_timeout(detail::wait_bound(c.agent(), options));
    return result;
  }

  // The value itself, on the owner: the object for a class; for a value type, a T
  // converted from the held value once and then held as is (later to_here calls copy it).
  // InvalidArgument on a user reference or for a T other than the one held. Waits for a
  // value still being created, at most `timeout` (0: the agent's rpc_timeout).
  std::shared_ptr<T> local_value(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    detail::RRefCore& c = core();
    return std::static_pointer_cast<T>(
        c.local_object(detail::local_type<T>(c.agent().registry()), timeout));
  }

  // Calls method `method` of the owner's object (see the file comment).
  template <typename R, typename... Args>
  Future<R> rpc_async(std::string method, rpc::CallOptions options, Args&&... args) const {
    detail::RRefCore& c = core();
    rpc::RpcAgent& agent = c.agent();
    std::string what = "the result of " + c.type_name() + "." + method + " on " + c.describe();
    std::vector<rpc::Value> values = detail::to_values(agent, std::forward<Args>(args)...);
    Future<R> result = detail::typed<R>(c.call(std::move(method), std::move(values), options),
                                        std::move(what), agent, c.owner());
    result.set_default_timeout(detail::wait_bound(agent, options));
    return result;
  }
  template <typename R, typename... Args>
  Future<R> rpc_async(std::string method, Args&&... args) const {
    return rpc_async<R>(std::move(method), rpc::CallOptions{}, std::forward<Args>(args)...);
  }
  template <typename R, typename... Args>
  R rpc_sync(std::string method, rpc::CallOptions options, Args&&... args) const {
    std::string what = "call '" + method + "' on " + core().describe();
    Future<R> pending = rpc_async<R>(std::move(method), options, std::forward<Args>(args)...);
    return detail::await(std::move(pending), pending.default_timeout(), what);
  }
  template <typename R, typename... Args>
  R rpc_sync(std::string method, Args&&... args) const {
    return rpc_sync<R>(std::move(method), rpc::CallOptions{}, std::forward<Args>(args)...);
  }
  // Runs method `method` on the owner and keeps its result there.
  template <typename R, typename... Args>
  RRef<R> remote(std::string method, rpc::CallOptions options, Args&&... args) const {
    detail::RRefCore& c = core();
    rpc::RpcAgent& agent = c.agent();
    std::vector<rpc::Value> values = detail::to_values(agent, std::forward<Args>(args)...);
    return RRef<R>(c.remote(std::move(method), detail::type_name_in<R>(agent.registry()),
                            std::move(values), options));
  }
  template <typename R, typename... Args>
  RRef<R> remote(std::string method, Args&&... args) const {
    return remote<R>(std::move(method), rpc::CallOptions{}, std::forward<Args>(args)...);
  }

  // "RRef 0:3 (Counter) owned by 'w0' (rank 0)".
  std::string describe() const { return core().describe(); }
  const std::shared_ptr<detail::RRefCore>& core_ptr() const { return core_; }

 private:
  detail::RRefCore& core() const {
    if (core_ == nullptr) detail::throw_empty();
    return *core_;
  }
  std::shared_ptr<detail::RRefCore> core_;
};

// Creates a T on worker `to` through `agent` (see the file comment).
template <typename T, typename... Args>
RRef<T> remote(rpc::RpcAgent& agent, const rpc::Destination& to, std::string name,
               rpc::CallOptions options, Args&&... args) {
  std::vector<rpc::Value> values = detail::to_values(agent, std::forward<Args>(args)...);
  return RRef<T>(detail::create(agent, to, std::move(name),
                                detail::type_name_in<T>(agent.registry()), std::move(values),
                                options));
}
template <typename T, typename... Args>
RRef<T> remote(rpc::RpcAgent& agent, const rpc::Destination& to, std::string name, Args&&... args) {
  return remote<T>(agent, to, std::move(name), rpc::CallOptions{}, std::forward<Args>(args)...);
}
// The same through the default agent (init_rpc).
template <typename T, typename... Args>
RRef<T> remote(const rpc::Destination& to, std::string name, Args&&... args) {
  return remote<T>(*rpc::default_agent(), to, std::move(name), std::forward<Args>(args)...);
}

// An owner reference to `value`, which this worker already holds (PyTorch's RRef(value)):
// for a class registered with def_class, the object itself (pass a shared_ptr; it is held,
// not copied); for a value type, the value (tensors share storage, so a parameter stays the
// parameter). Hand it to other workers in calls; it lives while any reference does.
template <typename T>
RRef<T> make_local(rpc::RpcAgent& agent, std::shared_ptr<T> object) {
  if (object == nullptr) throw InvalidArgument("rref::make_local: a null object");
  std::string cls = agent.registry().template class_name_of<T>();
  if (cls.empty()) {
    if constexpr (detail::HasValueConverter<T>) {
      return make_local<T>(agent, T(*object));
    } else {
      detail::throw_unnamed_type(detail::demangle(typeid(T).name()));
    }
  }
  return RRef<T>(detail::own_object(agent, std::move(cls), std::static_pointer_cast<void>(object)));
}
template <typename T>
requires(!std::is_pointer_v<T>) RRef<T> make_local(rpc::RpcAgent& agent, const T& value) {
  static_assert(detail::HasValueConverter<T>,
                "make_local(agent, value) holds a value type: pass a shared_ptr for an object");
  return RRef<T>(detail::own_value(agent, detail::type_name_in<T>(agent.registry()),
                                   rpc::to_value(value, detail::sending_context(agent))));
}

// This worker's reference bookkeeping. Error when rref/ is not installed on `agent`.
RRefMetrics metrics(rpc::RpcAgent& agent);
// What this worker's bookkeeping still held when its agent closed (and dropped then): after
// a graceful shutdown, nothing but the handles the program itself still keeps
// (user_references). All zero while the agent runs.
RRefMetrics metrics_at_close(rpc::RpcAgent& agent);
// Waits until this worker has no protocol message in flight and no reference it sent that
// the owner has not yet accepted: after it, every reference this worker released is gone
// from its owner's count. TimeoutError naming what is left.
void wait_idle(rpc::RpcAgent& agent, std::chrono::milliseconds timeout);
// Waits until this worker owns at most `count` values (a server waiting for its clients
// to let go). False at the timeout.
bool wait_owned_values(rpc::RpcAgent& agent, int64_t count, std::chrono::milliseconds timeout);

}  // namespace gradwire::rref

namespace gradwire::rpc {

// RRef<T> in messages: a kRRef Value naming the owner, the reference and the fork; it
// converts only inside a call (it must find the agent's reference bookkeeping).
template <typename T>
struct ValueConverter<rref::RRef<T>> {
  static Value to(const rref::RRef<T>& ref, const CallContext& ctx) {
    if (!ref.valid()) rref::detail::throw_empty();
    return ref.core_ptr()->to_value(ctx);
  }
  static rref::RRef<T> from(const Value& value, const Where& where, const CallContext& ctx) {
    std::string expected =
        ctx.agent() != nullptr ? rref::detail::type_name_in<T>(ctx.agent()->registry()) : name();
    return rref::RRef<T>(rref::detail::receive(value, where, ctx, expected));
  }
  static std::string name() { return "RRef<" + rref::detail::static_type_name<T>() + ">"; }
};

}  // namespace gradwire::rpc

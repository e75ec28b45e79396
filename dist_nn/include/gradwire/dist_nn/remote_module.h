// RemoteModule<M>: an nn::Module that lives on another worker (its owner) and is used from
// here as if it were local — PyTorch's torch.distributed.nn.RemoteModule, in C++.
//
//   // On every worker, before its agent starts (the registry is by name, as def_class):
//   dist_nn::register_remote_module<nn::Linear>(rpc::registry(), "Linear").ctor<int64_t,
//   int64_t>();
//   // On a trainer:
//   dist_nn::RemoteModule<nn::Linear> fc(*agent, "ps0", "Linear", int64_t{4}, int64_t{2});
//   dist_optim::DistributedOptimizer opt(*agent, optim::SGDOptions{.lr = 0.1},
//                                        fc.remote_parameters());
//   {
//     dist_autograd::Context ctx(*agent);
//     Tensor loss = sum(fc.forward(x));          // runs on ps0, recorded for backward
//     dist_autograd::backward(*agent, ctx.id(), {loss});
//     opt.step(ctx.id());                        // ps0 updates the Linear's parameters
//   }
//
// Registration. register_remote_module<M, Forward>(registry, "Name") registers a class
// "Name" (a ModuleHost<M>, which holds the M) with the methods a RemoteModule calls:
// forward, parameter_rrefs, train, is_training, state_dict, load_state_dict, save, load.
// `Forward` is the forward's signature, Tensor(const Tensor&) by default; a module whose
// forward takes other arguments names its own (EmbeddingBag: Tensor(const Tensor&, const
// Tensor&)). The constructor is .ctor<Args...>() (M(Args...)) or .ctor<Args...>(make) (any
// callable Args... -> std::shared_ptr<M>, for modules built from an options struct); any
// module type with such a constructor can be made remotely, with no server class written.
//
// Parameters and concurrent updates. Forwards from many trainers run concurrently on the
// owner while a DistributedOptimizer updates the parameters in place. An update between a
// forward and its backward would change what the backward needs (autograd refuses a saved
// tensor modified in place). ForwardParameters says how the owner prevents that:
// - kSnapshot (the default): each forward computes with a copy of the parameters and
//   buffers taken at its start, in a replica of the module (a second M built with the same
//   constructor arguments, reused once the graph of the forward that used it is gone); the
//   gradients reach the module's own parameters, so each trainer's gradient is the one at
//   the values its forward used (the asynchronous parameter server's staleness; a copy
//   taken while an update runs may mix old and new values, as Hogwild training accepts). A
//   buffer the forward updates is updated in the replica only.
// - kShared: forward runs on the module itself, with no copy. For modules whose backward
//   does not keep their parameters: nn::Embedding and nn::EmbeddingBag copy only the rows
//   a lookup uses (index_select), so a table of millions of rows is never copied. They
//   default to kShared (DefaultForwardParameters below); .forward_parameters() overrides.
// A kSnapshot forward must use its parameters through the module's own tensors (or views
// made during the forward), and return a tensor computed from them.
//
// Creation. The constructor of RemoteModule waits until the owner has built the module
// (at most the agent's rpc_timeout), so every mistake surfaces there as a typed error.
// RemoteModule is a cheap handle: copies share one remote module, which lives while any
// handle or reference to it is left (module_rref() may be passed to other workers, and
// RemoteModule(ref) wraps a received one).
//
// Thread-safety: every method may be called from any thread, concurrently. On the owner,
// forwards run concurrently; train, load_state_dict and load wait for running forwards'
// snapshots (kSnapshot) or forwards (kShared) and hold new ones off while they run.
//
// Errors (constructor):
// - an unknown worker: InvalidArgument naming the worker and the module;
// - M not registered here, or registered under another name: InvalidArgument naming both;
// - a name the owner has not registered, constructor arguments of the wrong count or types,
//   a constructor that throws: the owner's error (InvalidArgument, or RemoteError carrying
//   the constructor's message), its message prefixed with the module and the worker.
// forward: the owner's InvalidArgument for arguments that do not match the registered
// signature (naming expected and received types); RemoteError for what forward throws;
// NetworkError when the owner is gone; TimeoutError past the call's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/error.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"

namespace gradwire::dist_nn {

// How a remote module's forward uses its parameters (see the file comment).
enum class ForwardParameters {
  kSnapshot,  // a copy taken at the forward's start, in a replica; gradients reach the module
  kShared,    // the module's own tensors; for modules whose backward does not keep them
};

// The default for a module type: kShared for the lookup tables, kSnapshot otherwise.
// Specialise it for a module type of your own whose backward keeps no parameter.
template <typename M>
inline constexpr ForwardParameters DefaultForwardParameters = ForwardParameters::kSnapshot;
template <>
inline constexpr ForwardParameters DefaultForwardParameters<nn::Embedding> =
    ForwardParameters::kShared;
template <>
inline constexpr ForwardParameters DefaultForwardParameters<nn::EmbeddingBag> =
    ForwardParameters::kShared;

namespace detail {

// Sends the gradients that the graph of `output` gives the leaves `from` (a replica's
// parameters) to the leaves `to` instead (the module's, one for one), and keeps `keep`
// alive as long as that graph. Only nodes numbered `first` or later are rewired: those the
// forward made (the input's own history is older).
void reroute(const Tensor& output, uint64_t first, const std::vector<Tensor>& from,
             const std::vector<Tensor>& to, std::shared_ptr<void> keep);
// The sequence number the next autograd node made will have at least.
uint64_t next_node_number();
// Copies `from`'s values into `to` (the same parameters and buffers, in order), not
// recorded. InvalidArgument naming `type` when the lists differ.
void copy_state(const nn::Module& from, nn::Module& to, const std::string& type);
// Rethrows the current exception as the same kind with `prefix` in front of its message.
[[noreturn]] void rethrow_with(const std::string& prefix);

}  // namespace detail

// The object a remote module's owner holds: the module, its replicas, and the methods a
// RemoteModule calls. Thread-safe (see the file comment).
template <typename M>
class ModuleHost {
 public:
  using Factory = std::function<std::shared_ptr<M>()>;

  ModuleHost(Factory factory, ForwardParameters mode)
      : factory_(std::move(factory)),
        mode_(mode),
        module_(factory_()),
        pool_(std::make_shared<Pool>()) {
    if (module_ == nullptr)
      throw InvalidArgument("RemoteModule: the module's factory returned null");
  }

  // The module itself (on the owner).
  const std::shared_ptr<M>& module() const { return module_; }
  ForwardParameters forward_parameters() const { return mode_; }
  // How many replicas kSnapshot forwards have built (each reused once free).
  size_t replicas() const {
    MutexLock lock(pool_->mutex);
    return pool_->made;
  }
  // How many of them a forward's graph still holds.
  size_t replicas_in_use() const {
    MutexLock lock(pool_->mutex);
    return pool_->made - pool_->free.size();
  }

  template <typename... Args>
  Tensor forward(const Args&... args) {
    if (mode_ == ForwardParameters::kShared) {
      std::shared_lock lock(state_mutex_);
      return module_->forward(args...);
    }
    std::shared_ptr<M> replica = acquire();
    // Back to the pool once nothing uses it: at the end of this call, or when the graph
    // the forward made is gone.
    std::shared_ptr<void> lease(replica.get(), [pool = pool_, replica](void*) mutable {
      MutexLock lock(pool->mutex);
      pool->free.push_back(std::move(replica));
    });
    {
      std::shared_lock lock(state_mutex_);
      detail::copy_state(*module_, *replica, module_->type_name());
      replica->train(module_->is_training());
    }
    const uint64_t first = detail::next_node_number();
    Tensor out = replica->forward(args...);
    detail::reroute(out, first, replica->parameters(), module_->parameters(), std::move(lease));
    return out;
  }

  // References to the module's parameters (what a DistributedOptimizer takes).
  std::vector<rref::RRef<Tensor>> parameter_rrefs(const rpc::CallContext& ctx) {
    std::vector<rref::RRef<Tensor>> refs;
    for (const Tensor& p : module_->parameters())
      refs.push_back(rref::make_local(*ctx.agent(), p));
    return refs;
  }
  void train(bool on) {
    std::unique_lock lock(state_mutex_);
    module_->train(on);
  }
  bool is_training() const {
    std::shared_lock lock(state_mutex_);
    return module_->is_training();
  }
  StateDict state_dict() const {
    std::shared_lock lock(state_mutex_);
    return module_->state_dict();
  }
  void load_state_dict(const StateDict& state, bool strict) {
    std::unique_lock lock(state_mutex_);
    module_->load_state_dict(state, strict);
  }
  // The module's state to and from a file on the owner (nn::save / nn::load).
  void save(const std::string& path) const {
    std::shared_lock lock(state_mutex_);
    nn::save(*module_, path);
  }
  void load(const std::string& path) {
    std::unique_lock lock(state_mutex_);
    nn::load(*module_, path);
  }

 private:
  struct Pool {
    mutable Mutex mutex;
    std::vector<std::shared_ptr<M>> free GRADWIRE_GUARDED_BY(mutex);
    size_t made GRADWIRE_GUARDED_BY(mutex) = 0;
  };

  std::shared_ptr<M> acquire() {
    {
      MutexLock lock(pool_->mutex);
      if (!pool_->free.empty()) {
        std::shared_ptr<M> replica = std::move(pool_->free.back());
        pool_->free.pop_back();
        return replica;
      }
      ++pool_->made;
    }
    std::shared_ptr<M> replica = factory_();
    if (replica == nullptr)
      throw InvalidArgument("RemoteModule: the module's factory returned null");
    return replica;
  }

  Factory factory_;
  ForwardParameters mode_;
  std::shared_ptr<M> module_;
  std::shared_ptr<Pool> pool_;
  // Shared by forwards (their snapshot, or all of a kShared forward); exclusive for train,
  // load_state_dict and load.
  mutable std::shared_mutex state_mutex_;
};

// What register_remote_module returns: sets the constructor and the forward's mode.
template <typename M>
class RemoteModuleBuilder {
 public:
  RemoteModuleBuilder(rpc::Registry& registry, std::string name,
                      std::shared_ptr<ForwardParameters> mode)
      : registry_(registry), name_(std::move(name)), mode_(std::move(mode)) {}

  // The constructor M(Args...).
  template <typename... Args>
  RemoteModuleBuilder& ctor() {
    return ctor<Args...>(
        [](const std::decay_t<Args>&... args) { return std::make_shared<M>(args...); });
  }
  // A constructor from any callable (const Args&...) -> std::shared_ptr<M>; it is called
  // again, with the same arguments, for each replica.
  template <typename... Args, typename Make>
  RemoteModuleBuilder& ctor(Make make) {
    rpc::Signature sig = rpc::detail::make_signature<void, Args...>(name_);
    sig.result = name_;
    rpc::Signature captured = sig;
    registry_.add_constructor(
        name_, std::move(sig),
        [sig = std::move(captured), make = std::move(make), mode = mode_](
            const rpc::CallContext& ctx, const std::vector<rpc::Value>& args) {
          auto converted = rpc::detail::convert_all<Args...>(args, sig, ctx);
          typename ModuleHost<M>::Factory factory = [make, converted]() {
            return std::apply(
                [&make](const auto&... xs) { return std::shared_ptr<M>(make(xs...)); }, converted);
          };
          return std::static_pointer_cast<void>(
              std::make_shared<ModuleHost<M>>(std::move(factory), *mode));
        });
    return *this;
  }
  // How forward uses the parameters (default: DefaultForwardParameters<M>).
  RemoteModuleBuilder& forward_parameters(ForwardParameters mode) {
    *mode_ = mode;
    return *this;
  }

 private:
  rpc::Registry& registry_;
  std::string name_;
  std::shared_ptr<ForwardParameters> mode_;
};

namespace detail {

template <typename Signature>
struct ForwardSignature;
template <typename... Args>
struct ForwardSignature<Tensor(Args...)> {
  template <typename M>
  static void define(rpc::ClassBuilder<ModuleHost<M>>& cls) {
    cls.method("forward", [](ModuleHost<M>& host, std::decay_t<Args>... args) {
      return host.forward(args...);
    });
  }
};

}  // namespace detail

// Registers M as the remote module class `name` on `registry` (see the file comment); call
// .ctor<Args...>() on the result. Do the same on every worker that creates or owns one.
// InvalidArgument when `name` is taken.
template <typename M, typename Forward = Tensor(const Tensor&)>
RemoteModuleBuilder<M> register_remote_module(rpc::Registry& registry, std::string name) {
  static_assert(std::is_base_of_v<nn::Module, M>, "a remote module is an nn::Module");
  auto cls = registry.def_class<ModuleHost<M>>(name);
  detail::ForwardSignature<Forward>::template define<M>(cls);
  cls.method("parameter_rrefs", &ModuleHost<M>::parameter_rrefs)
      .method("train", &ModuleHost<M>::train)
      .method("is_training", &ModuleHost<M>::is_training)
      .method("state_dict", &ModuleHost<M>::state_dict)
      .method("load_state_dict", &ModuleHost<M>::load_state_dict)
      .method("save", &ModuleHost<M>::save)
      .method("load", &ModuleHost<M>::load);
  return RemoteModuleBuilder<M>(registry, std::move(name),
                                std::make_shared<ForwardParameters>(DefaultForwardParameters<M>));
}

// A handle to a module of type M on its owner (see the file comment).
template <typename M>
class RemoteModule {
 public:
  using Host = ModuleHost<M>;

  // Creates an M on worker `on` through the class `name` registered with
  // register_remote_module<M>, from `args` (the registered constructor's arguments), and
  // waits until the owner has built it.
  template <typename... Args>
  RemoteModule(rpc::RpcAgent& agent, const std::string& on, const std::string& name,
               Args&&... args) {
    const std::string what = "RemoteModule '" + name + "' on '" + on + "'";
    const std::string registered = agent.registry().template class_name_of<Host>();
    if (registered.empty()) {
      throw InvalidArgument(what + ": " + rref::detail::demangle(typeid(M).name()) +
                            " is not registered here as a remote module "
                            "(dist_nn::register_remote_module<M>(registry, \"" +
                            name + "\") on every worker)");
    }
    if (registered != name) {
      throw InvalidArgument(what + ": this module type is registered here as '" + registered +
                            "', not '" + name + "'");
    }
    try {
      ref_ = rref::remote<Host>(agent, on, name, std::forward<Args>(args)...);
      rref::detail::await(ref_.creation(), rref::detail::wait_bound(agent, {}),
                          "the creation of " + what);
    } catch (...) {
      detail::rethrow_with(what + ": ");
    }
  }
  // A handle to an existing remote module (module_rref() received from another worker).
  explicit RemoteModule(rref::RRef<Host> ref) : ref_(std::move(ref)) {
    if (!ref_.valid()) throw InvalidArgument("RemoteModule: an empty module reference");
  }

  // forward(args...) on the owner; recorded for dist_autograd inside a context.
  template <typename... Args>
  Future<Tensor> forward_async(Args&&... args) const {
    return ref_.template rpc_async<Tensor>("forward", std::forward<Args>(args)...);
  }
  template <typename... Args>
  Tensor forward(Args&&... args) const {
    return ref_.template rpc_sync<Tensor>("forward", std::forward<Args>(args)...);
  }
  template <typename... Args>
  Tensor operator()(Args&&... args) const {
    return forward(std::forward<Args>(args)...);
  }

  // References to the module's parameters, in parameters() order, for a
  // DistributedOptimizer (its updates go to the module itself).
  std::vector<rref::RRef<Tensor>> remote_parameters() const {
    return ref_.template rpc_sync<std::vector<rref::RRef<Tensor>>>("parameter_rrefs");
  }
  // The reference to the owner's ModuleHost<M> (module_rref().local_value()->module() is
  // the module, on the owner).
  const rref::RRef<Host>& module_rref() const { return ref_; }
  rpc::WorkerInfo owner() const { return ref_.owner(); }

  void train(bool on = true) const { ref_.template rpc_sync<void>("train", on); }
  void eval() const { train(false); }
  bool is_training() const { return ref_.template rpc_sync<bool>("is_training"); }
  // A copy of the module's state (on the owner itself, the state shares its storage).
  StateDict state_dict() const { return ref_.template rpc_sync<StateDict>("state_dict"); }
  void load_state_dict(const StateDict& state, bool strict = true) const {
    ref_.template rpc_sync<void>("load_state_dict", state, strict);
  }
  // The module's state to and from a file on the owner's file system.
  void save(const std::string& path) const { ref_.template rpc_sync<void>("save", path); }
  void load(const std::string& path) const { ref_.template rpc_sync<void>("load", path); }

 private:
  rref::RRef<Host> ref_;
};

}  // namespace gradwire::dist_nn

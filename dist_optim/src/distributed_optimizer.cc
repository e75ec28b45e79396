#include "gradwire/dist_optim/distributed_optimizer.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/tensor/factory.h"
#include "step_lock.h"
#include "trainer_group.h"

namespace gradwire::dist_optim {

using rref::RRef;

namespace {

constexpr const char* kShardClass = "gradwire.dist_optim.Shard";

using detail::StepLock;

void install(const std::shared_ptr<rpc::RpcAgent>& agent) {
  auto lock = std::make_shared<StepLock>();
  lock->agent = agent;
  agent->set_attachment(lock);
  detail::install_groups(agent);
  rpc::Registry& registry = agent->registry();
  if (registry.has_class(kShardClass)) return;
  try {
    registry.def_class<detail::Shard>(kShardClass)
        .ctor<StateDict, std::vector<RRef<Tensor>>>()
        .method("step", &detail::Shard::step)
        .method("step_after", &detail::Shard::step_after)
        .method("group_step_after", &detail::Shard::group_step_after)
        .method("state_dict", &detail::Shard::state_dict)
        .method("load_state_dict", &detail::Shard::load_state_dict)
        .method("set_lr", &detail::Shard::set_lr)
        .method("group_step", &detail::Shard::group_step)
        .method("leave_group", &detail::Shard::leave_group);
    // Which incarnation of its rank this worker is (ServerFailover's probe: a replacement
    // answers with a higher one than its lost predecessor).
    registry.def(detail::kIncarnationFunction,
                 [](const rpc::CallContext& ctx) -> int64_t { return ctx.agent()->incarnation(); });
  } catch (const InvalidArgument&) {
    // Another agent sharing this registry registered it first.
  }
}

// Context `context_id`'s gradient of each of `params` on this worker, undefined for a
// parameter it has none for (skipped by the step, state included).
std::vector<Tensor> gradients_of(rpc::RpcAgent& agent, uint64_t context_id,
                                 const std::vector<Tensor>& params) {
  const dist_autograd::Gradients grads = dist_autograd::get_gradients(agent, context_id);
  std::vector<Tensor> matched;
  matched.reserve(params.size());
  for (const Tensor& p : params)
    matched.push_back(grads.contains(p) ? grads.at(p) : Tensor());
  return matched;
}

// A gradient laid out as the transpose of a dense matrix: what a weight used as
// W.transpose(0, 1) in a matmul gets (the backward makes the product's gradient contiguous
// and hands W its transposed view). True when `grad` is such a view with `param`'s shape and
// `param` is contiguous, both CPU tensors of one floating dtype.
bool transposed_layout(const Tensor& param, const Tensor& grad) {
  if (!param.defined() || !grad.defined() || grad.is_sparse() || grad.dim() != 2 ||
      grad.is_contiguous() || !param.is_contiguous() || grad.sizes() != param.sizes() ||
      grad.dtype() != param.dtype() || !grad.device().is_cpu() || !param.device().is_cpu()) {
    return false;
  }
  if (grad.dtype() != kFloat32 && grad.dtype() != kFloat64) return false;
  return grad.stride(0) == 1 && grad.stride(1) == grad.size(0);
}

// dst[i * cols + j] = src[j * rows + i], in tiles that stay in cache.
template <typename T>
void transpose_tile(const T* src, T* dst, int64_t rows, int64_t cols, int64_t i0, int64_t i1,
                    int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t i = i0; i < i1; ++i)
      dst[i * cols + j] = src[j * rows + i];
  }
}

template <typename T>
void transpose_into(const T* src, T* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
    const int64_t j1 = std::min(cols, j0 + kTile);
    for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile);
      int64_t j = j0;
#if defined(__SSE__)
      if constexpr (std::is_same_v<T, float>) {
        // 4x4 blocks through registers: four loads, a register transpose, four stores.
        for (; j + 4 <= j1; j += 4) {
          int64_t i = i0;
          for (; i + 4 <= i1; i += 4) {
            __m128 r0 = _mm_loadu_ps(src + (j + 0) * rows + i);
            __m128 r1 = _mm_loadu_ps(src + (j + 1) * rows + i);
            __m128 r2 = _mm_loadu_ps(src + (j + 2) * rows + i);
            __m128 r3 = _mm_loadu_ps(src + (j + 3) * rows + i);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            _mm_storeu_ps(dst + (i + 0) * cols + j, r0);
            _mm_storeu_ps(dst + (i + 1) * cols + j, r1);
            _mm_storeu_ps(dst + (i + 2) * cols + j, r2);
            _mm_storeu_ps(dst + (i + 3) * cols + j, r3);
          }
          transpose_tile(src, dst, rows, cols, i, i1, j, j + 4);
        }
      }
#endif
      transpose_tile(src, dst, rows, cols, i0, i1, j, j1);
    }
  }
}

// `grad` in `param`'s (contiguous) layout: a transposed gradient (transposed_layout) is
// copied into `scratch` (made like `param` the first time, reused after), anything else is
// returned as it is. The optimizers' fused updates need both contiguous; over transposed
// strides they take the element-wise path, several times slower than this copy and the
// fused update together.
Tensor in_parameter_layout(const Tensor& param, const Tensor& grad, Tensor& scratch) {
  if (!transposed_layout(param, grad)) return grad;
  if (!scratch.defined() || scratch.sizes() != param.sizes() || scratch.dtype() != param.dtype())
    scratch = empty_like(param);
  const int64_t rows = grad.size(0), cols = grad.size(1);
  if (grad.dtype() == kFloat32) {
    transpose_into(static_cast<const float*>(grad.data_ptr()),
                   static_cast<float*>(scratch.data_ptr()), rows, cols);
  } else {
    transpose_into(static_cast<const double*>(grad.data_ptr()),
                   static_cast<double*>(scratch.data_ptr()), rows, cols);
  }
  return scratch;
}

}  // namespace

namespace detail {

Shard::Shard(const StateDict& spec, const std::vector<RRef<Tensor>>& params)
    : state_(std::make_shared<State>()), spec_(spec) {
  for (const auto& p : params) {
    if (!p.is_owner()) {
      throw InvalidArgument("dist_optim: a shard was given " + p.describe() +
                            ", which its worker does not own");
    }
    state_->params.push_back(*p.local_value());
  }
  MutexLock lock(state_->mutex);
  state_->scratch.resize(state_->params.size());
  state_->optimizer = optim::make_functional_optimizer(spec, state_->params);
}

int64_t Shard::State::step(rpc::RpcAgent& agent, int caller, uint64_t request_id,
                           uint64_t context_id) {
  trace::Span span("dist_optim.owner_step", "dist_optim", trace::Arg("context_id", context_id),
                   trace::Arg("caller", caller), trace::Arg("request_id", request_id),
                   trace::Arg("params", static_cast<uint64_t>(params.size())));
  std::vector<Tensor> matched = gradients_of(agent, context_id, params);
  int64_t found = 0;
  for (const Tensor& g : matched)
    found += g.defined() ? 1 : 0;
  span.arg(trace::Arg("with_grad", found));
  update(agent, std::move(matched), 1.0, context_id);
  return found;
}

void Shard::State::update(rpc::RpcAgent& agent, std::vector<Tensor> matched, double lr_factor,
                          uint64_t context_id) {
  std::shared_ptr<StepLock> lock = agent.attachment<StepLock>();
  std::optional<trace::Span> waiting;
  if (trace::enabled()) {
    waiting.emplace("dist_optim.wait_lock", "dist_optim", trace::Arg("context_id", context_id));
  }
  MutexLock serialised(lock->mutex);
  MutexLock mine(mutex);
  waiting.reset();
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i)
    matched[i] = in_parameter_layout(params[i], matched[i], scratch[i]);
  if (lr_factor == 1.0) {
    optimizer->step(params, matched);
    ++lock->updates;
    return;
  }
  // This update's rate only (a trainer group's scaling); the set rate is restored even when
  // the step throws.
  const double base = optimizer->lr();
  optimizer->set_lr(base * lr_factor);
  try {
    optimizer->step(params, matched);
  } catch (...) {
    optimizer->set_lr(base);
    throw;
  }
  optimizer->set_lr(base);
  ++lock->updates;
}

void Shard::apply(rpc::RpcAgent& agent, std::vector<Tensor> grads, double lr_factor) {
  GRADWIRE_CHECK(grads.size() == state_->params.size())
      << "dist_optim: " << grads.size() << " gradients for " << state_->params.size()
      << " parameters";
  state_->update(agent, std::move(grads), lr_factor, 0);
}

std::shared_ptr<TrainerGroupState> Shard::group(const char* op) const {
  std::shared_ptr<TrainerGroupState> g = group_.lock();
  if (g == nullptr) {
    throw InvalidArgument(std::string("dist_optim: ") + op + " on an optimizer that is " +
                          (grouped_ ? "no longer in its trainer group (its agent is closing)"
                                    : "in no trainer group"));
  }
  return g;
}

Future<int64_t> Shard::group_step(const rpc::CallContext& ctx, uint64_t context_id) {
  const std::shared_ptr<TrainerGroupState> g = group("group_step");
  // The owner's part of this context's step (its update may be the group's later one:
  // dist_optim.group_update).
  trace::Span span("dist_optim.owner_step", "dist_optim", trace::Arg("context_id", context_id),
                   trace::Arg("caller", ctx.caller().id),
                   trace::Arg("request_id", ctx.request_id()),
                   trace::Arg("params", static_cast<uint64_t>(state_->params.size())));
  return g->step(*ctx.agent(), ctx.caller().id,
                 gradients_of(*ctx.agent(), context_id, state_->params));
}

Future<int64_t> Shard::group_step_after(const rpc::CallContext& ctx, uint64_t context_id,
                                        uint64_t pass_id) {
  // Held weakly while the part runs, as the shard holds it.
  const std::weak_ptr<TrainerGroupState> weak_group = group("group_step_after");
  // Refused at once unless the caller started the pass and this worker takes part in it.
  Future<void> part = dist_autograd::part_done(ctx, context_id, pass_id);
  std::weak_ptr<rpc::RpcAgent> weak_agent = ctx.agent()->attachment<StepLock>()->agent;
  return part.then(ctx.agent()->executor(),
                   [state = state_, weak_group, weak_agent, caller = ctx.caller().id,
                    context_id](const Future<void>& ended) -> Future<int64_t> {
                     ended.value();  // the part's failure: nothing moves
                     std::shared_ptr<rpc::RpcAgent> agent = weak_agent.lock();
                     std::shared_ptr<TrainerGroupState> group = weak_group.lock();
                     if (agent == nullptr || group == nullptr) {
                       throw Error("dist_optim: the agent stopped before the step in context " +
                                   std::to_string(context_id));
                     }
                     return group->step(*agent, caller,
                                        gradients_of(*agent, context_id, state->params));
                   });
}

void Shard::leave_group(const rpc::CallContext& ctx) {
  if (std::shared_ptr<TrainerGroupState> g = group_.lock()) g->leave(ctx.caller().id);
}

int64_t Shard::step(const rpc::CallContext& ctx, uint64_t context_id) {
  return state_->step(*ctx.agent(), ctx.caller().id, ctx.request_id(), context_id);
}

Future<int64_t> Shard::step_after(const rpc::CallContext& ctx, uint64_t context_id,
                                  uint64_t pass_id) {
  // Refused at once unless the caller started the pass and this worker takes part in it.
  Future<void> part = dist_autograd::part_done(ctx, context_id, pass_id);
  std::shared_ptr<StepLock> lock = ctx.agent()->attachment<StepLock>();
  std::weak_ptr<rpc::RpcAgent> weak_agent = lock->agent;
  // How long the request waited for the part (dist_optim.wait_part, on the owner).
  const int64_t arrived_ns = trace::enabled() ? trace::now_ns() : 0;
  auto step_once_over = [state = state_, weak_agent, caller = ctx.caller().id,
                         request_id = ctx.request_id(), context_id, pass_id,
                         arrived_ns](const Future<void>& ended) -> int64_t {
    if (arrived_ns != 0) {
      trace::complete(
          "dist_optim.wait_part", "dist_optim", arrived_ns, trace::now_ns(),
          {trace::Arg("context_id", context_id), trace::Arg("pass_id", pass_id),
           trace::Arg("caller", caller), trace::Arg("error", ended.has_error() ? 1 : 0)});
    }
    ended.value();  // the part's failure: nothing moves
    std::shared_ptr<rpc::RpcAgent> agent = weak_agent.lock();
    if (agent == nullptr) {
      throw Error("dist_optim: the agent stopped before the step in context " +
                  std::to_string(context_id));
    }
    return state->step(*agent, caller, request_id, context_id);
  };
  // The step runs on a pool thread that already has the part's end in hand, rather than be
  // posted to the pool (a worker woken for it while this one goes idle): here when the part
  // is over already (the request came after it ended), else on the worker that ends it (the
  // last node's), or, when another thread ends it (an abort, a release), on the pool.
  return gradwire::detail::map_here_or_on<int64_t>(part, ctx.agent()->executor(),
                                                   std::move(step_once_over));
}

StateDict Shard::state_dict() {
  MutexLock lock(state_->mutex);
  StateDict copy;
  for (const auto& [key, t] : state_->optimizer->state_dict())
    copy.emplace_back(key, t.clone());
  return copy;
}

void Shard::load_state_dict(const StateDict& state) {
  MutexLock lock(state_->mutex);
  state_->optimizer->load_state_dict(state, state_->params);
}

void Shard::set_lr(double lr) {
  MutexLock lock(state_->mutex);
  state_->optimizer->set_lr(lr);
}

std::shared_ptr<StepLock> step_lock(const rpc::RpcAgent& agent) {
  std::shared_ptr<StepLock> lock = agent.attachment<StepLock>();
  if (lock == nullptr) {
    throw Error("dist_optim: worker " + agent.worker_info().describe() +
                " has no step lock (dist_optim's agent extension was not installed on it)");
  }
  return lock;
}

bool ensure_registered() {
  static const bool registered = [] {
    rpc::register_agent_extension("dist_optim", &install);
    return true;
  }();
  return registered;
}

namespace {
const bool kRegisteredHere = ensure_registered();
}  // namespace

}  // namespace detail

namespace {

// The learning rate a spec (or an owner's saved state) holds as "hyper.lr", if it is a
// one-element float64 tensor.
std::optional<double> lr_entry(const StateDict& state, const std::string& key) {
  for (const auto& [k, t] : state) {
    if (k == key && t.defined() && t.dtype() == kFloat64 && t.numel() == 1) return t.item<double>();
  }
  return std::nullopt;
}

double spec_lr(const StateDict& spec) {
  const std::optional<double> lr = lr_entry(spec, "hyper.lr");
  // The owners made their optimizers from this spec, which they check: it has one.
  GRADWIRE_CHECK(lr.has_value()) << "dist_optim: the spec has no 'hyper.lr'";
  return *lr;
}

using ByOwner = std::map<int, std::pair<rpc::WorkerInfo, std::vector<RRef<Tensor>>>>;

// The parameters by owner (worker id), each owner's in the order given.
ByOwner group_by_owner(const std::vector<RRef<Tensor>>& params) {
  if (params.empty()) throw InvalidArgument("dist_optim: DistributedOptimizer without parameters");
  ByOwner by_owner;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].valid()) {
      throw InvalidArgument("dist_optim: parameter " + std::to_string(i) + " is an empty RRef");
    }
    auto& entry = by_owner[params[i].owner().id];
    entry.first = params[i].owner();
    entry.second.push_back(params[i]);
  }
  return by_owner;
}

// Waits for every future (a round of requests to the owners); the first error once all
// have ended, or null.
template <typename T>
std::exception_ptr first_error(std::vector<Future<T>>& futures) {
  std::exception_ptr first;
  for (Future<T>& f : futures) {
    try {
      f.get();
    } catch (...) {
      if (first == nullptr) first = std::current_exception();
    }
  }
  return first;
}

void check_lr(const char* op, double lr) {
  if (!(lr >= 0.0)) {
    std::ostringstream os;
    os << "dist_optim: " << op << ": lr must be >= 0, got " << lr;
    throw InvalidArgument(os.str());
  }
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(rpc::RpcAgent& agent, const StateDict& spec,
                                           std::vector<RRef<Tensor>> params)
    : agent_(&agent) {
  ByOwner by_owner = group_by_owner(params);
  for (auto& [id, entry] : by_owner) {
    owners_.push_back(entry.first);
    shards_.push_back(
        rref::remote<detail::Shard>(agent, entry.first, kShardClass, spec, entry.second));
  }
  // Wait for every shard, so a bad spec or parameter fails here, naming its owner.
  for (size_t i = 0; i < shards_.size(); ++i) {
    Future<void> made = shards_[i].creation();
    if (!made.wait(agent.options().rpc_timeout)) {
      throw TimeoutError("dist_optim: the optimizer on worker " + owners_[i].describe() +
                         " was not created in time");
    }
    made.value();
  }
  // Every shard was made from the spec: its rate is the spec's.
  MutexLock lock(lr_->mutex);
  lr_->value = spec_lr(spec);
}

DistributedOptimizer::DistributedOptimizer(rpc::RpcAgent& agent, const StateDict& spec,
                                           std::vector<RRef<Tensor>> params,
                                           const TrainerGroup& group)
    : agent_(&agent), group_(group) {
  group.validate();
  ByOwner by_owner = group_by_owner(params);
  // Every owner is asked at once; the first member to reach one makes the group there.
  std::vector<Future<RRef<detail::Shard>>> joins;
  for (auto& [id, entry] : by_owner) {
    owners_.push_back(entry.first);
    joins.push_back(agent.rpc_async<RRef<detail::Shard>>(
        entry.first.name, "gradwire.dist_optim.join_group", group.name, spec, entry.second,
        int64_t{group.trainers}, int64_t{group.max_staleness}, int64_t{group.aggregate},
        static_cast<int64_t>(group.lr_scaling)));
  }
  if (std::exception_ptr failed = first_error(joins)) std::rethrow_exception(failed);
  for (Future<RRef<detail::Shard>>& join : joins)
    shards_.push_back(join.get());
  MutexLock lock(lr_->mutex);
  lr_->value = spec_lr(spec);
}

DistributedOptimizer::~DistributedOptimizer() {
  if (group_.name.empty() || left_) return;
  try {
    leave();
  } catch (const NetworkError& e) {
    // An owner that was lost has no group to leave (ServerFailover drops such optimizers).
    GRADWIRE_LOG(kDebug) << "dist_optim: not leaving trainer group '" << group_.name
                         << "' on a lost owner: " << e.what();
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "dist_optim: leaving trainer group '" << group_.name
                           << "' failed: " << e.what();
  }
}

void DistributedOptimizer::leave() {
  if (group_.name.empty() || left_) return;
  left_ = true;
  std::vector<Future<void>> leaves;
  for (auto& shard : shards_)
    leaves.push_back(shard.rpc_async<void>("leave_group"));
  if (std::exception_ptr failed = first_error(leaves)) std::rethrow_exception(failed);
}

namespace {

// Collects the owners' step futures and throws the first error once all have ended; the
// outcome goes into `span`'s "error" argument.
void wait_all(std::vector<Future<int64_t>>& steps, trace::Span& span) {
  const std::exception_ptr first = first_error(steps);
  span.arg(trace::Arg("error", first != nullptr ? 1 : 0));
  if (first != nullptr) std::rethrow_exception(first);
}

// The step sent early, to the owner whose part ends last; `closed` once backward() has
// returned, so that a late call of the hook sends nothing (that owner steps with the rest).
struct Early {
  Mutex mutex;
  bool closed GRADWIRE_GUARDED_BY(mutex) = false;
  size_t owner GRADWIRE_GUARDED_BY(mutex) = 0;
  std::optional<Future<int64_t>> step GRADWIRE_GUARDED_BY(mutex);
};

using LastPartHook = std::function<void(uint64_t, const rpc::WorkerInfo&)>;
using ShardsByWorker = std::map<int, std::pair<size_t, RRef<detail::Shard>>>;

// `hook` run on `pool` instead of where it is called; what it throws is logged.
LastPartHook on_pool(std::shared_ptr<Executor> pool, LastPartHook hook) {
  return [pool = std::move(pool), hook = std::move(hook)](uint64_t pass_id,
                                                          const rpc::WorkerInfo& last) {
    // What this throws (a pool shut down with its agent) dist_autograd logs.
    pool->execute([hook, pass_id, last] {
      try {
        hook(pass_id, last);
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kWarning) << "dist_optim: BackwardOptions::on_last_part for pass " << pass_id
                               << " threw: " << e.what();
      }
    });
  };
}

// The on_last_part hook that sends the step early to the owner whose part is left (unless
// backward() has returned), then calls the caller's own hook.
LastPartHook send_early_step(std::shared_ptr<Early> early,
                             std::shared_ptr<ShardsByWorker> by_worker, uint64_t context_id,
                             std::chrono::milliseconds early_timeout, LastPartHook theirs,
                             const char* method) {
  return [early = std::move(early), by_worker = std::move(by_worker), context_id, early_timeout,
          method, theirs = std::move(theirs)](uint64_t pass_id, const rpc::WorkerInfo& last) {
    auto it = by_worker->find(last.id);
    if (it != by_worker->end()) {  // else the part left is not an owner's
      MutexLock lock(early->mutex);
      if (!early->closed) {
        early->owner = it->second.first;
        early->step = it->second.second.rpc_async<int64_t>(
            method, rpc::CallOptions{.timeout = early_timeout}, context_id, pass_id);
      }
    }
    if (theirs) theirs(pass_id, last);
  };
}

}  // namespace

void DistributedOptimizer::step(uint64_t context_id) {
  trace::Span span("dist_optim.step", "dist_optim", trace::Arg("context_id", context_id),
                   trace::Arg("owners", static_cast<uint64_t>(shards_.size())));
  const bool grouped = !group_.name.empty();
  if (grouped && left_) {
    throw InvalidArgument("dist_optim: step after leaving trainer group '" + group_.name + "'");
  }
  std::vector<Future<int64_t>> steps;
  for (auto& shard : shards_)
    steps.push_back(shard.rpc_async<int64_t>(grouped ? "group_step" : "step", context_id));
  wait_all(steps, span);
}

void DistributedOptimizer::backward_and_step(uint64_t context_id, const std::vector<Tensor>& roots,
                                             dist_autograd::BackwardOptions options) {
  trace::Span span("dist_optim.backward_and_step", "dist_optim",
                   trace::Arg("context_id", context_id),
                   trace::Arg("owners", static_cast<uint64_t>(shards_.size())));
  const bool grouped = !group_.name.empty();
  if (grouped && left_) {
    throw InvalidArgument("dist_optim: step after leaving trainer group '" + group_.name + "'");
  }
  auto early = std::make_shared<Early>();
  // The early step waits on its owner for the owner's part, which may take as long as the
  // pass (bounded by its own deadline, not by rpc_timeout), and then for the step itself.
  const std::chrono::milliseconds pass = options.timeout, call = agent_->options().rpc_timeout;
  const std::chrono::milliseconds early_timeout =
      pass == kNoTimeout || call == kNoTimeout || pass > kNoTimeout - call ? kNoTimeout
                                                                           : pass + call;
  auto by_worker = std::make_shared<ShardsByWorker>();
  for (size_t i = 0; i < shards_.size(); ++i)
    by_worker->emplace(owners_[i].id, std::make_pair(i, shards_[i]));
  // The hook only sends (rpc_async), so it runs where the last part but one ends; a hook of
  // the caller's own runs where the caller asked (on the pool unless it said inline).
  LastPartHook theirs = std::move(options.on_last_part);
  if (theirs && !options.on_last_part_inline)
    theirs = on_pool(agent_->executor(), std::move(theirs));
  options.on_last_part_inline = true;
  options.on_last_part =
      send_early_step(early, by_worker, context_id, early_timeout, std::move(theirs),
                      grouped ? "group_step_after" : "step_after");
  std::exception_ptr failed;
  try {
    dist_autograd::backward(*agent_, context_id, roots, options);
  } catch (...) {
    failed = std::current_exception();
  }
  std::optional<Future<int64_t>> early_step;
  size_t early_owner = 0;
  {
    MutexLock lock(early->mutex);
    early->closed = true;
    early_step = early->step;
    early_owner = early->owner;
  }
  span.arg(trace::Arg("early", early_step.has_value() ? 1 : 0));
  if (failed != nullptr) {
    span.arg(trace::Arg("error", 1));
    // The early step fails with its owner's part, which the pass's abort ends; waited for so
    // that nothing of this call goes on after it.
    if (early_step && early_step->wait(agent_->options().rpc_timeout) && !early_step->has_error()) {
      // Only a pass that failed at its deadline, after that owner's part had ended.
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        throw Error("dist_optim: backward_and_step in context " + std::to_string(context_id) +
                    " failed, but worker " + owners_[early_owner].describe() +
                    " had finished its part and stepped its parameters: " + e.what());
      }
    }
    std::rethrow_exception(failed);
  }
  std::vector<Future<int64_t>> steps;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (early_step && i == early_owner) {
      steps.push_back(*early_step);
    } else {
      steps.push_back(shards_[i].rpc_async<int64_t>(grouped ? "group_step" : "step", context_id));
    }
  }
  wait_all(steps, span);
}

StateDict DistributedOptimizer::state_dict() {
  StateDict all;
  for (size_t i = 0; i < shards_.size(); ++i) {
    for (auto& [key, t] : shards_[i].rpc_sync<StateDict>("state_dict"))
      all.emplace_back(owners_[i].name + "/" + key, std::move(t));
  }
  return all;
}

void DistributedOptimizer::load_state_dict(const StateDict& state) {
  std::vector<StateDict> parts;
  std::optional<double> lr;
  std::string lr_from;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const std::string prefix = owners_[i].name + "/";
    StateDict part;
    for (const auto& [key, t] : state) {
      if (key.compare(0, prefix.size(), prefix) == 0)
        part.emplace_back(key.substr(prefix.size()), t);
    }
    if (part.empty()) {
      throw InvalidArgument("dist_optim: the state holds nothing for worker " +
                            owners_[i].describe() + " (keys start with '<owner name>/')");
    }
    // A missing or malformed rate is the owner's to report, with the rest of its part.
    if (const std::optional<double> mine = lr_entry(part, "hyper.lr")) {
      if (lr.has_value() && *lr != *mine) {
        std::ostringstream os;
        os << "dist_optim: load_state_dict: the owners' learning rates differ ('" << lr_from
           << "hyper.lr' is " << *lr << ", '" << prefix << "hyper.lr' " << *mine
           << "); a DistributedOptimizer has one";
        throw InvalidArgument(os.str());
      }
      lr = mine;
      lr_from = prefix;
    }
    parts.push_back(std::move(part));
  }
  // Not beside a set_lr round: the owners end with one rate either way.
  MutexLock lock(lr_->mutex);
  for (size_t i = 0; i < shards_.size(); ++i)
    shards_[i].rpc_sync<void>("load_state_dict", parts[i]);
  if (lr.has_value()) lr_->value = *lr;
}

double DistributedOptimizer::lr() const {
  MutexLock lock(lr_->mutex);
  return lr_->value;
}

void DistributedOptimizer::set_lr(double lr) {
  check_lr("set_lr", lr);
  trace::Span span("dist_optim.set_lr", "dist_optim",
                   trace::Arg("owners", static_cast<uint64_t>(shards_.size())));
  MutexLock lock(lr_->mutex);
  // One round: every request is sent before any answer is awaited.
  std::vector<Future<void>> sets;
  for (auto& shard : shards_)
    sets.push_back(shard.rpc_async<void>("set_lr", lr));
  const std::exception_ptr first = first_error(sets);
  span.arg(trace::Arg("error", first != nullptr ? 1 : 0));
  if (first != nullptr) std::rethrow_exception(first);
  lr_->value = lr;
}

double DistributedOptimizer::group_lr(size_t group) const {
  if (group != 0) {
    throw InvalidArgument("dist_optim: no learning-rate group " + std::to_string(group) +
                          " (a DistributedOptimizer has one)");
  }
  return lr();
}

void DistributedOptimizer::set_group_lrs(const std::vector<double>& lrs) {
  if (lrs.size() != 1) {
    throw InvalidArgument("dist_optim: " + std::to_string(lrs.size()) +
                          " learning rates for 1 group (a DistributedOptimizer has one)");
  }
  set_lr(lrs[0]);
}

}  // namespace gradwire::dist_optim

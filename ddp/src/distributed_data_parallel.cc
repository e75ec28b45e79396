#include "gradwire/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/c10d/verify_params.h"
#include "gradwire/core/error.h"
#include "gradwire/nn/embedding.h"

namespace gradwire::ddp {
namespace {

size_t mebibytes(double mb) {
  return static_cast<size_t>(std::llround(mb * 1024.0 * 1024.0));
}

// Adds the parameter's name to verify_params_across_ranks' "tensors[i]" message.
[[noreturn]] void rethrow_named(const InvalidArgument& e, const std::vector<std::string>& names) {
  std::string what = e.what();
  const std::string tag = "tensors[";
  const size_t at = what.find(tag);
  std::string named;
  if (at != std::string::npos) {
    const size_t index = std::stoul(what.substr(at + tag.size()));
    if (index < names.size())
      named = " (tensors[" + std::to_string(index) + "] is parameter '" + names[index] +
              "' on this rank)";
  }
  throw InvalidArgument("DistributedDataParallel: the replicas' parameters differ across ranks" +
                        named + ": " + what);
}

// The weights whose gradients are sparse-rows: those of every nn::Embedding and
// nn::EmbeddingBag with `sparse = true` in `module` (itself included), with the module's
// name, by the identity of the weight.
std::vector<std::pair<const void*, std::string>> sparse_weights(nn::Module& module) {
  std::vector<std::pair<std::string, nn::Module*>> all{{"", &module}};
  for (const auto& [name, m] : module.named_modules())
    all.emplace_back(name, m.get());
  std::vector<std::pair<const void*, std::string>> out;
  for (const auto& [name, m] : all) {
    const std::string what = name.empty() ? "the module" : "submodule '" + name + "'";
    if (auto* e = dynamic_cast<nn::Embedding*>(m); e != nullptr && e->options().sparse) {
      out.emplace_back(e->weight().impl_ptr().get(), "the weight of nn::Embedding " + what);
    } else if (auto* b = dynamic_cast<nn::EmbeddingBag*>(m); b != nullptr && b->options().sparse) {
      out.emplace_back(b->weight().impl_ptr().get(), "the weight of nn::EmbeddingBag " + what);
    }
  }
  return out;
}

}  // namespace

void DdpOptions::validate() const {
  if (!(bucket_cap_mb > 0) || !std::isfinite(bucket_cap_mb))
    throw InvalidArgument("DdpOptions: bucket_cap_mb must be > 0, got " +
                          std::to_string(bucket_cap_mb));
  if (!(first_bucket_mb > 0) || !std::isfinite(first_bucket_mb))
    throw InvalidArgument("DdpOptions: first_bucket_mb must be > 0, got " +
                          std::to_string(first_bucket_mb));
  if (timeout.count() < 0) throw InvalidArgument("DdpOptions: timeout must not be negative");
}

NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->require_sync()) {
  ddp_.reducer_->set_require_sync(false);
}

NoSyncGuard::~NoSyncGuard() {
  ddp_.reducer_->set_require_sync(previous_);
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<c10d::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  options_.validate();
  if (!module_) throw InvalidArgument("DistributedDataParallel: the module is null");
  if (!group_) throw InvalidArgument("DistributedDataParallel: the process group is null");
  // Every parameter, frozen ones (requires_grad = false) included, is checked and
  // broadcast, as in PyTorch; only those that require grad are reduced.
  // Ignored parameters and buffers are left out of everything below (params_to_ignore).
  const nn::StateDict named_params = module_->named_parameters();
  const nn::StateDict named_buffers = module_->named_buffers();
  const std::set<std::string> ignored(options_.params_to_ignore.begin(),
                                      options_.params_to_ignore.end());
  for (const std::string& name : ignored) {
    auto named = [&name](const auto& entry) { return entry.first == name; };
    if (std::none_of(named_params.begin(), named_params.end(), named) &&
        std::none_of(named_buffers.begin(), named_buffers.end(), named)) {
      throw InvalidArgument("DistributedDataParallel: params_to_ignore names '" + name +
                            "', which is neither a parameter nor a buffer of the module (" +
                            module_->type_name() + ")");
    }
  }
  // Parameters whose gradients would be sparse rows cannot be all-reduced: refused unless
  // excluded, before any collective (every rank refuses alike).
  const std::vector<std::pair<const void*, std::string>> sparse = sparse_weights(*module_);
  std::vector<std::string> all_names;
  std::vector<std::string> names;
  for (const auto& [name, tensor] : named_params) {
    if (ignored.count(name) != 0) continue;
    all_names.push_back(name);
    all_params_.push_back(tensor);
    if (!tensor.requires_grad()) continue;
    for (const auto& [weight, what] : sparse) {
      if (weight != tensor.impl_ptr().get()) continue;
      throw InvalidArgument(
          "DistributedDataParallel: parameter '" + name + "' (" + what +
          ", sparse = true) has sparse-rows gradients, which DDP cannot all-reduce; exclude it "
          "with DdpOptions::params_to_ignore = {\"" +
          name +
          "\"} (and keep it in step another way, e.g. on a parameter server over rpc), freeze "
          "it (requires_grad = false), or make the embedding dense (sparse = false)");
    }
    names.push_back(name);
    params_.push_back(tensor);
  }
  if (params_.empty())
    throw InvalidArgument(
        "DistributedDataParallel: the module has no parameter that requires grad" +
        std::string(ignored.empty() ? "" : " and is not in params_to_ignore"));
  for (const auto& [name, tensor] : named_buffers) {
    if (ignored.count(name) == 0) buffers_.push_back(tensor);
  }
  try {
    c10d::verify_params_across_ranks(*group_, all_params_, options_.timeout);
  } catch (const InvalidArgument& e) {
    rethrow_named(e, all_names);
  }
  {
    autograd::NoGradGuard no_grad;
    std::vector<Tensor> state;
    for (const Tensor& p : all_params_)
      state.push_back(p.detach());
    for (const Tensor& b : buffers_)
      state.push_back(b.detach());
    group_->broadcast_coalesced(state, {.root = 0, .timeout = options_.timeout})
        .wait(wait_timeout());
  }
  ReducerOptions ro;
  ro.bucket_bytes = mebibytes(options_.bucket_cap_mb);
  ro.first_bucket_bytes = mebibytes(options_.first_bucket_mb);
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.static_graph = options_.static_graph;
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ro.timeout = options_.timeout;
  reducer_ = std::make_unique<Reducer>(params_, std::move(names), group_, ro);
}

DistributedDataParallel::~DistributedDataParallel() = default;

std::chrono::milliseconds DistributedDataParallel::wait_timeout() const {
  return (options_.timeout.count() > 0 ? options_.timeout : group_->timeout()) +
         c10d::kFailureReportGrace;
}

void DistributedDataParallel::broadcast_buffers(int root) {
  if (!options_.broadcast_buffers || buffers_.empty() || group_->size() == 1) return;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> state;
  for (const Tensor& b : buffers_)
    state.push_back(b.detach());
  group_->broadcast_coalesced(state, {.root = root, .timeout = options_.timeout})
      .wait(wait_timeout());
}

int DistributedDataParallel::join_divisor(int participants) const {
  return join_ != nullptr && join_->options().divide_by_initial_world_size ? group_->size()
                                                                           : participants;
}

void DistributedDataParallel::before_forward() {
  int root = 0;
  if (join_ != nullptr) {
    const JoinStep step = join_->announce(reducer_->require_sync());
    root = step.root;
    reducer_->set_divisor(join_divisor(step.participants));
  } else {
    reducer_->set_divisor(group_->size());
  }
  reducer_->prepare_for_forward(root);
  broadcast_buffers(root);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  auto* unary = dynamic_cast<nn::UnaryModule*>(module_.get());
  if (unary == nullptr)
    throw InvalidArgument("DistributedDataParallel::forward: the module (" + module_->type_name() +
                          ") is not an nn::UnaryModule; call forward_with instead");
  before_forward();
  Tensor out = unary->forward(input);
  reducer_->prepare_for_backward({out});
  return out;
}

std::vector<Tensor> DistributedDataParallel::forward_with(
    const std::function<std::vector<Tensor>(nn::Module&)>& fn) {
  before_forward();
  std::vector<Tensor> outs = fn(*module_);
  reducer_->prepare_for_backward(outs);
  return outs;
}

void DistributedDataParallel::set_join(Join* join) {
  if (join != nullptr && join_ != nullptr && join_ != join)
    throw InvalidArgument("DistributedDataParallel: already under another Join");
  join_ = join;
  if (join == nullptr) reducer_->set_divisor(group_->size());
}

void DistributedDataParallel::join_shadow_step(int participants, int root, bool sync) {
  reducer_->set_divisor(join_divisor(participants));
  reducer_->prepare_for_forward(root);
  broadcast_buffers(root);
  if (sync) reducer_->shadow_iteration();
}

void DistributedDataParallel::join_finish(int root) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> state;
  for (const Tensor& p : all_params_)
    state.push_back(p.detach());
  for (const Tensor& b : buffers_)
    state.push_back(b.detach());
  group_->broadcast_coalesced(state, {.root = root, .timeout = options_.timeout})
      .wait(wait_timeout());
}

}  // namespace gradwire::ddp

#include "gradwire/torch/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/c10d/verify_params.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/torch/collectives.h"
#include "gradwire/torch/convert.h"

namespace gradwire::torch {
namespace {

using TorchNode = ::torch::autograd::Node;

size_t mebibytes(double mb) {
  return static_cast<size_t>(std::llround(mb * 1024.0 * 1024.0));
}

// A gradwire node that is never run: its edges lead to the stand-ins of the parameters a
// forward reached, so that the Reducer's walk from it (prepare_for_backward) finds them.
class ReachedParameters final : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&&) override {
    throw InvalidArgument("DistributedDataParallel: the reached-parameters node is not run");
  }
  std::string name() const override { return "TorchReachedParameters"; }
};

std::string join_names(const std::vector<std::string>& names, const std::vector<size_t>& idx) {
  std::string out;
  for (size_t i = 0; i < idx.size(); ++i)
    out += (i ? ", '" : "'") + names[idx[i]] + "'";
  return out;
}

}  // namespace

// What one wrapper holds. Only its training loop touches it: forwards on the loop's thread,
// the LibTorch hooks and end-of-pass callback on the thread running that loop's backward
// (one pass at a time, after the forward that armed it), so it needs no lock.
struct DistributedDataParallel::State {
  std::shared_ptr<c10d::ProcessGroup> group;
  DdpOptions options;
  std::vector<at::Tensor> params;  // reduced: require grad
  std::vector<std::string> names;
  std::vector<at::Tensor> all_params;  // checked and broadcast
  std::vector<std::string> all_names;
  std::vector<at::Tensor> buffers;
  std::vector<Tensor> shadows;        // gradwire leaves viewing params[i]
  std::vector<autograd::Edge> edges;  // the shadows' gradwire AccumulateGrad edges
  std::vector<std::shared_ptr<TorchNode>> accumulators;  // params' torch AccumulateGrad
  std::vector<uintptr_t> hook_keys;
  std::unique_ptr<ddp::Reducer> reducer;
  // The last synchronised forward: whether backward passes are reduced, and which
  // parameters its outputs reach (a pass expects a gradient from each of them).
  bool armed{false};
  std::vector<char> reached;
  // The pass in progress (null between passes) and which parameters it has heard of.
  std::shared_ptr<autograd::GraphTask> task;
  std::vector<char> fed;

  std::chrono::milliseconds wait_timeout() const {
    return (options.timeout.count() > 0 ? options.timeout : group->timeout()) +
           c10d::kFailureReportGrace;
  }
  void collect(::torch::nn::Module& module);
  void check_and_broadcast();
  void make_reducer();
  void install_hooks();
  void broadcast_buffers();
  std::vector<char> reached_from(const std::vector<at::Tensor>& outputs) const;
  Tensor reached_stand_in() const;
  void on_gradient(size_t index, const at::Tensor& incoming);
  void start_pass();
  void finish_pass();
  void end_of_torch_pass();
  void abandon_pass();
};

void DistributedDataParallel::State::collect(::torch::nn::Module& module) {
  // Ignored parameters and buffers are left out of everything (params_to_ignore); a name
  // that is neither is a mistake, named.
  const std::set<std::string> ignored(options.params_to_ignore.begin(),
                                      options.params_to_ignore.end());
  for (const std::string& name : ignored) {
    if (module.named_parameters(true).find(name) == nullptr &&
        module.named_buffers(true).find(name) == nullptr)
      throw InvalidArgument("gradwire::torch::DistributedDataParallel: params_to_ignore names '" +
                            name + "', which is no parameter or buffer of the module");
  }
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (ignored.count(item.key()) != 0) continue;
    const at::Tensor& p = item.value();
    all_names.push_back(item.key());
    all_params.push_back(p);
    if (!p.requires_grad()) continue;
    if (!p.is_leaf() || !p.is_contiguous())
      throw InvalidArgument("gradwire::torch::DistributedDataParallel: parameter '" + item.key() +
                            "' must be a contiguous leaf");
    names.push_back(item.key());
    params.push_back(p);
  }
  if (params.empty())
    throw InvalidArgument(
        "gradwire::torch::DistributedDataParallel: the module has no parameter that requires "
        "grad");
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (ignored.count(item.key()) == 0) buffers.push_back(item.value());
}

void DistributedDataParallel::State::check_and_broadcast() {
  std::vector<Tensor> mine;
  for (size_t i = 0; i < all_params.size(); ++i) {
    try {
      mine.push_back(from_torch(all_params[i].detach()));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("gradwire::torch::DistributedDataParallel: parameter '" + all_names[i] +
                            "': " + e.what());
    }
  }
  try {
    c10d::verify_params_across_ranks(*group, mine, options.timeout);
  } catch (const InvalidArgument& e) {
    // verify_params names the tensor by its index ("tensors[3] ..."): say which parameter.
    std::string what = e.what();
    std::string named;
    const std::string tag = "tensors[";
    if (const size_t at = what.find(tag); at != std::string::npos) {
      const size_t index = std::stoul(what.substr(at + tag.size()));
      if (index < all_names.size()) named = " at parameter '" + all_names[index] + "'";
    }
    throw InvalidArgument(
        "gradwire::torch::DistributedDataParallel: the replicas' parameters differ across "
        "ranks" +
        named + ": " + what);
  }
  std::vector<at::Tensor> state;
  for (const at::Tensor& p : all_params)
    state.push_back(p.detach());
  for (const at::Tensor& b : buffers)
    state.push_back(b.detach());
  broadcast_coalesced(*group, state, {.root = 0, .timeout = options.timeout}).wait(wait_timeout());
}

void DistributedDataParallel::State::make_reducer() {
  for (const at::Tensor& p : params) {
    Tensor shadow = from_torch(p.detach());
    shadow.set_requires_grad(true);
    edges.push_back(autograd::gradient_edge(shadow));
    shadows.push_back(std::move(shadow));
  }
  ddp::ReducerOptions ro;
  ro.bucket_bytes = mebibytes(options.bucket_cap_mb);
  ro.first_bucket_bytes = mebibytes(options.first_bucket_mb);
  ro.find_unused_parameters = options.find_unused_parameters;
  ro.static_graph = options.static_graph;
  ro.timeout = options.timeout;
  reducer = std::make_unique<ddp::Reducer>(shadows, names, group, ro);
  reached.assign(params.size(), 0);
  fed.assign(params.size(), 0);
}

void DistributedDataParallel::State::install_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    std::shared_ptr<TorchNode> acc = ::torch::autograd::impl::grad_accumulator(params[i]);
    hook_keys.push_back(
        acc->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [this, i](const ::torch::autograd::variable_list& outputs,
                      const ::torch::autograd::variable_list& inputs) {
              on_gradient(i, inputs.empty() ? at::Tensor() : inputs[0]);
              return outputs;
            })));
    accumulators.push_back(std::move(acc));
  }
}

void DistributedDataParallel::State::broadcast_buffers() {
  if (!options.broadcast_buffers || buffers.empty() || group->size() == 1) return;
  std::vector<at::Tensor> state;
  for (const at::Tensor& b : buffers)
    state.push_back(b.detach());
  broadcast_coalesced(*group, state, {.root = 0, .timeout = options.timeout}).wait(wait_timeout());
}

// Which parameters LibTorch's graph from `outputs` reaches (their accumulators).
std::vector<char> DistributedDataParallel::State::reached_from(
    const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<const TorchNode*> seen;
  std::vector<std::shared_ptr<TorchNode>> stack;
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    ::torch::autograd::Edge e = ::torch::autograd::impl::gradient_edge(t);
    if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function);
  }
  while (!stack.empty()) {
    std::shared_ptr<TorchNode> node = std::move(stack.back());
    stack.pop_back();
    for (const ::torch::autograd::Edge& e : node->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function);
  }
  std::vector<char> out(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    out[i] = seen.count(accumulators[i].get()) ? 1 : 0;
  return out;
}

// A gradwire tensor whose graph reaches the stand-ins of the reached parameters, for the
// Reducer's walk for unused parameters.
Tensor DistributedDataParallel::State::reached_stand_in() const {
  auto node = std::make_shared<ReachedParameters>();
  for (size_t i = 0; i < params.size(); ++i)
    if (reached[i]) node->add_next_edge(edges[i]);
  Tensor out = zeros({1}, kFloat64);
  autograd::set_history(out, node);
  return out;
}

void DistributedDataParallel::State::start_pass() {
  task = std::make_shared<autograd::GraphTask>();
  std::fill(fed.begin(), fed.end(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    if (reached[i]) task->expect(edges[i]);
  // Runs once LibTorch's pass is over: the safety net for reached parameters it never
  // visited (an output the loss left out).
  ::torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_torch_pass(); });
}

void DistributedDataParallel::State::on_gradient(size_t index, const at::Tensor& incoming) {
  if (!armed) return;
  if (!reached[index])
    throw InvalidArgument(
        "gradwire::torch::DistributedDataParallel: parameter '" + names[index] +
        "' received a gradient in a backward pass, but the forward's outputs do not reach "
        "it; return every tensor the loss is computed from (forward_with)");
  if (!task) start_pass();
  if (fed[index])
    throw InvalidArgument("gradwire::torch::DistributedDataParallel: parameter '" + names[index] +
                          "' was reached twice in one backward pass (two passes at once?)");
  fed[index] = 1;
  const at::Tensor accumulated = params[index].grad();
  try {
    if (accumulated.defined() && accumulated.layout() != at::kStrided) {
      std::ostringstream layout;
      layout << accumulated.layout();
      throw InvalidArgument("gradwire::torch::DistributedDataParallel: parameter '" + names[index] +
                            "' has a " + layout.str() +
                            " gradient, which DDP cannot all-reduce (a torch::nn::Embedding "
                            "with sparse(true)?); make the gradient dense or freeze the "
                            "parameter");
    }
    if (incoming.defined()) {
      // The accumulated grad() becomes the stand-in's gradient (the same memory).
      shadows[index].set_grad(Tensor());
      task->add_gradient(edges[index], from_torch(accumulated));
    } else {
      // Nothing produced this pass: the Reducer reads what grad() holds already.
      shadows[index].set_grad(accumulated.defined() ? from_torch(accumulated) : Tensor());
      task->add_gradient(edges[index], Tensor());
    }
    task->run_ready();
  } catch (...) {
    abandon_pass();
    throw;
  }
  if (task->completed()) finish_pass();
}

// The Reducer's averages are in the stand-ins' gradients: make them the torch grad().
void DistributedDataParallel::State::finish_pass() {
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = shadows[i].grad();
    if (!g.defined()) continue;
    at::Tensor t = params[i].grad();
    if (!t.defined()) {
      params[i].mutable_grad() = to_torch(g);
    } else if (t.data_ptr() != g.data_ptr()) {
      t.copy_(to_torch(g));
    }
    shadows[i].set_grad(Tensor());
  }
  task.reset();
}

void DistributedDataParallel::State::end_of_torch_pass() {
  if (!task) return;
  std::vector<size_t> missing;
  for (size_t i = 0; i < params.size(); ++i)
    if (reached[i] && !fed[i]) missing.push_back(i);
  abandon_pass();
  throw Error("gradwire::torch::DistributedDataParallel (rank " + std::to_string(group->rank()) +
              "): LibTorch's backward pass ended before every gradient bucket was reduced; "
              "parameters that the forward's outputs reach but that received no gradient: [" +
              join_names(names, missing) +
              "]. Compute the loss from every output forward_with returns, or return only "
              "those it is computed from");
}

void DistributedDataParallel::State::abandon_pass() {
  if (task) task->release();
  task.reset();
  for (Tensor& s : shadows)
    s.set_grad(Tensor());
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<::torch::nn::Module> module,
                                                 std::shared_ptr<c10d::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), options_(options), state_(std::make_unique<State>()) {
  options_.validate();
  if (options_.gradient_as_bucket_view)
    throw InvalidArgument(
        "gradwire::torch::DistributedDataParallel: gradient_as_bucket_view is not offered for a "
        "LibTorch module (LibTorch owns each grad(), so a bucket view saves no copy); leave it "
        "false");
  if (!module_)
    throw InvalidArgument("gradwire::torch::DistributedDataParallel: the module is null");
  if (!group)
    throw InvalidArgument("gradwire::torch::DistributedDataParallel: the process group is null");
  state_->group = std::move(group);
  state_->options = options_;
  state_->collect(*module_);
  state_->check_and_broadcast();
  state_->make_reducer();
  state_->install_hooks();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < state_->hook_keys.size(); ++i)
    state_->accumulators[i]->del_post_hook(state_->hook_keys[i]);
}

void DistributedDataParallel::register_comm_hook(ddp::CommHook hook) {
  state_->reducer->register_comm_hook(std::move(hook));
}

const ddp::Reducer& DistributedDataParallel::reducer() const {
  return *state_->reducer;
}

const std::vector<std::string>& DistributedDataParallel::parameter_names() const {
  return state_->names;
}

at::Tensor DistributedDataParallel::forward(const at::Tensor& input) {
  if (!unary_)
    throw InvalidArgument("gradwire::torch::DistributedDataParallel::forward: the module (" +
                          module_->name() +
                          ") has no forward taking one tensor known here; call forward_with");
  return forward_with([this, &input](::torch::nn::Module&) {
           return std::vector<at::Tensor>{unary_(input)};
         })
      .front();
}

std::vector<at::Tensor> DistributedDataParallel::forward_with(const ForwardFn& fn) {
  State& s = *state_;
  s.abandon_pass();
  s.reducer->prepare_for_forward(0);
  s.broadcast_buffers();
  std::vector<at::Tensor> outs = fn(*module_);
  s.armed = s.reducer->require_sync();
  // A static graph reaches the parameters the first synchronised pass reached.
  const bool learnt = options_.static_graph && s.reducer->iterations() > 0;
  if (s.armed && !learnt) s.reached = s.reached_from(outs);
  std::vector<Tensor> stand_in;
  if (s.armed && !learnt && (options_.find_unused_parameters || options_.static_graph))
    stand_in.push_back(s.reached_stand_in());
  s.reducer->prepare_for_backward(stand_in);
  return outs;
}

TorchNoSyncGuard::TorchNoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.state_->reducer->require_sync()) {
  ddp_.state_->reducer->set_require_sync(false);
}

TorchNoSyncGuard::~TorchNoSyncGuard() {
  ddp_.state_->reducer->set_require_sync(previous_);
}

}  // namespace gradwire::torch

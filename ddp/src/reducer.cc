#include "gradwire/ddp/reducer.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "all_reduce_average.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/core/trace.h"
#include "gradwire/ddp/comm_hooks.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::ddp {
namespace {

bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage().data() == b.storage().data() &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

std::string join_names(const std::vector<std::string>& names, const std::vector<size_t>& idx) {
  std::ostringstream out;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (i) out << ", ";
    out << "'" << names[idx[i]] << "'";
  }
  return out.str();
}

// A sparse-rows gradient (an embedding's with sparse = true) has no dense slot to average.
[[noreturn]] void refuse_sparse(const std::string& name, const Tensor& grad) {
  throw InvalidArgument("ddp: parameter '" + name + "' received a sparse-rows gradient (" +
                        std::to_string(grad.nnz()) + " rows of " + grad.shape_string() +
                        "), which DDP cannot all-reduce; exclude the parameter with "
                        "DdpOptions::params_to_ignore = {\"" +
                        name + "\"}, or produce a dense gradient");
}

uint64_t bucket_bytes(const Tensor& buffer) {
  return static_cast<uint64_t>(buffer.nbytes());
}

}  // namespace

void ReducerOptions::validate() const {
  if (bucket_bytes == 0) throw InvalidArgument("ddp: bucket_bytes (bucket_cap_mb) must be > 0");
  if (first_bucket_bytes == 0) throw InvalidArgument("ddp: first_bucket_bytes must be > 0");
  if (timeout.count() < 0) throw InvalidArgument("ddp: the timeout must not be negative");
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<c10d::ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options) {
  options_.validate();
  if (!group_) throw InvalidArgument("ddp::Reducer: the process group is null");
  if (names_.size() != params_.size())
    throw InvalidArgument("ddp::Reducer: " + std::to_string(names_.size()) + " names for " +
                          std::to_string(params_.size()) + " parameters");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.defined() || !p.requires_grad() || !p.is_leaf() || !p.is_contiguous())
      throw InvalidArgument("ddp::Reducer: parameter '" + names_[i] +
                            "' must be a defined, contiguous leaf that requires grad");
  }
  divisor_ = group_->size();
  executor_ = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "ddp"});
  comm_hook_ = allreduce_hook;
  in_place_group_ = group_->all_reduce_in_place();
  ready_.assign(params_.size(), 0);
  local_used_.assign(params_.size(), 0);
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = order.size() - 1 - i;
  build(assign(order));
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_handles_.push_back(autograd::register_leaf_gradient_hook(
        params_[i], [this, i](autograd::LeafGradient& g) { hook(i, g); }));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < hook_handles_.size(); ++i)
    params_[i].remove_hook(hook_handles_[i]);
}

void Reducer::register_comm_hook(CommHook hook) {
  if (!hook) throw InvalidArgument("ddp: register_comm_hook: the hook is empty");
  if (iterations_ > 0)
    throw InvalidArgument("ddp: register_comm_hook must be called before the first backward pass");
  comm_hook_ = std::move(hook);
  default_hook_ = false;
}

bool Reducer::averages_in_place() const {
  return default_hook_ && in_place_group_ && !options_.gradient_as_bucket_view &&
         divisor_ == group_->size();
}

void Reducer::set_divisor(int divisor) {
  if (divisor < 1) throw InvalidArgument("ddp: the divisor must be >= 1");
  divisor_ = divisor;
}

std::chrono::milliseconds Reducer::wait_timeout() const {
  return options_.timeout.count() > 0 ? options_.timeout
                                      : group_->timeout() + c10d::kFailureReportGrace;
}

// Greedy packing per (dtype, device), in `order`: the first bucket of a kind closes once it
// reaches first_bucket_bytes, later ones at bucket_bytes. Buckets are then ordered by
// where their first parameter sits in `order`.
std::vector<std::vector<size_t>> Reducer::assign(const std::vector<size_t>& order) const {
  struct Open {
    std::vector<size_t> params;
    size_t bytes{0};
    int closed{0};
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> out;
  for (size_t idx : order) {
    const Tensor& p = params_[idx];
    Open& o = open[{static_cast<int>(p.dtype()), p.device().str()}];
    o.params.push_back(idx);
    o.bytes += p.nbytes();
    const size_t limit = o.closed == 0 ? options_.first_bucket_bytes : options_.bucket_bytes;
    if (o.bytes >= limit) {
      out.push_back(std::move(o.params));
      o.params.clear();
      o.bytes = 0;
      ++o.closed;
    }
  }
  for (auto& [key, o] : open)
    if (!o.params.empty()) out.push_back(std::move(o.params));
  std::vector<size_t> position(params_.size());
  for (size_t i = 0; i < order.size(); ++i)
    position[order[i]] = i;
  std::sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return out;
}

void Reducer::build(const std::vector<std::vector<size_t>>& assignment) {
  autograd::NoGradGuard no_grad;
  std::vector<Bucket> buckets(assignment.size());
  locator_.assign(params_.size(), {0, 0});
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.params = assignment[b];
    int64_t total = 0;
    for (size_t idx : bucket.params)
      total += params_[idx].numel();
    const Tensor& first = params_[bucket.params.front()];
    bucket.buffer = zeros({total}, first.options());
    int64_t offset = 0;
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      const Tensor& p = params_[bucket.params[slot]];
      Tensor view = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      // Carry an existing gradient over (a rebuild after the first pass).
      Tensor grad = p.grad();
      if (grad.defined()) view.copy_(grad);
      if (options_.gradient_as_bucket_view && grad.defined()) p.set_grad(view);
      bucket.views.push_back(view);
      locator_[bucket.params[slot]] = {b, slot};
    }
    bucket.pending = bucket.params.size();
    bucket.direct.resize(bucket.params.size());
  }
  buckets_ = std::move(buckets);
  ++layout_;
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets_)
    out.push_back(b.params);
  return out;
}

void Reducer::prepare_for_forward(int root) {
  if (!rebuild_pending_) return;
  rebuild_pending_ = false;
  // Rank `root`'s arrival order decides; -1 in front means it has none (nothing rebuilt).
  const int64_t n = static_cast<int64_t>(params_.size());
  Tensor order = full({n}, Scalar(int64_t{-1}), kInt64);
  if (group_->rank() == root && arrival_.size() == params_.size()) {
    int64_t* d = order.data<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      d[i] = static_cast<int64_t>(arrival_[i]);
  }
  if (n > 0) group_->broadcast(order, {.root = root}).wait(wait_timeout());
  rebuilt_ = true;
  arrival_.clear();
  if (n == 0 || order.data<int64_t>()[0] < 0) return;
  std::vector<size_t> seq(params_.size());
  const int64_t* d = order.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    seq[i] = static_cast<size_t>(d[i]);
  build(assign(seq));
}

std::vector<size_t> Reducer::unused_from_graph(const std::vector<Tensor>& outputs) const {
  std::unordered_set<const autograd::Node*> seen;
  std::vector<std::shared_ptr<autograd::Node>> stack;
  for (const Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    autograd::Edge e = autograd::gradient_edge(t);
    if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function);
  }
  while (!stack.empty()) {
    auto node = std::move(stack.back());
    stack.pop_back();
    for (const autograd::Edge& e : node->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function);
  }
  std::vector<size_t> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = autograd::grad_accumulator(params_[i]);
    if (!seen.count(acc.get())) unused.push_back(i);
  }
  return unused;
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  reset_pass();
  if (!require_sync_) {
    expect_hooks_ = false;
    return;
  }
  expect_hooks_ = true;
  unused_.clear();
  if (options_.static_graph && iterations_ > 0) {
    unused_ = static_unused_;
  } else if (options_.find_unused_parameters || options_.static_graph) {
    unused_ = unused_from_graph(outputs);
  }
}

void Reducer::reset_pass() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(local_used_.begin(), local_used_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.result = Future<Tensor>();
    b.first_grad_ns = 0;
    b.launch_ns = 0;
    b.done_ns = nullptr;
    std::fill(b.direct.begin(), b.direct.end(), Tensor());
  }
  direct_ = false;
  next_bucket_ = 0;
  first_hook_seen_ = false;
  pass_start_ns_ = 0;
  sink_ = nullptr;
}

void Reducer::hook(size_t index, autograd::LeafGradient& g) {
  // Refused in no_sync passes too: accumulated there, it would reach the next synced pass.
  if (g.grad.defined() && g.grad.is_sparse()) {
    expect_hooks_ = false;
    refuse_sparse(names_[index], g.grad);
  }
  if (!expect_hooks_) return;
  autograd::NoGradGuard no_grad;
  if (!first_hook_seen_) {
    first_hook_seen_ = true;
    if (trace::enabled()) pass_start_ns_ = trace::now_ns();
    // Every leaf of one pass shares the pass's sink (or none).
    sink_ = g.sink;
    direct_ = averages_in_place();
    autograd::queue_callback([this] { finalize(); });
    for (size_t u : unused_)
      mark_ready(u, nullptr);
  } else if (g.sink != sink_) {
    expect_hooks_ = false;
    throw InvalidArgument("ddp: parameter '" + names_[index] +
                          "' was reached by a backward pass other than the one its peers are "
                          "in (two passes over one DDP model at once)");
  }
  mark_ready(index, &g);
}

Tensor Reducer::local_gradient(size_t index, autograd::LeafGradient* g, bool* fresh) const {
  if (fresh != nullptr) *fresh = false;
  if (sink_ == nullptr) {
    Tensor grad = g ? g->grad : params_[index].grad();
    if (grad.defined() && grad.is_sparse()) refuse_sparse(names_[index], grad);
    return grad;
  }
  // Under a sink: what earlier passes left in it (no_sync, a retained graph's first pass)
  // plus this pass's own gradient.
  Tensor held = sink_->gradient(params_[index]);
  if (held.defined() && held.is_sparse()) refuse_sparse(names_[index], held);
  Tensor now = g ? g->grad : Tensor();
  if (held.defined() && now.defined()) {
    if (fresh != nullptr) *fresh = true;
    return add(held, now);
  }
  return held.defined() ? held : now;
}

void Reducer::mark_ready(size_t index, autograd::LeafGradient* g) {
  if (ready_[index]) {
    expect_hooks_ = false;
    throw InvalidArgument(
        "ddp: parameter '" + names_[index] +
        "' was marked ready twice in one backward pass. Either it took part in the pass "
        "although find_unused_parameters found it unused in the forward's outputs (its "
        "gradient flowed through a tensor the forward did not return), or two backward "
        "passes over this model ran at once; return every tensor the loss is computed "
        "from, and run one pass at a time");
  }
  ready_[index] = 1;
  if (!rebuilt_) arrival_.push_back(index);
  auto [b, slot] = locator_[index];
  Bucket& bucket = buckets_[b];
  if (bucket.first_grad_ns == 0 && trace::enabled()) bucket.first_grad_ns = trace::now_ns();
  if (g && g->produced) local_used_[index] = 1;
  if (direct_) {
    bucket.direct[slot] = direct_tensor(index, g);
    // Withheld from the sink: finalize() writes the average back in its place.
    if (g != nullptr && sink_ != nullptr) g->grad = Tensor();
  } else {
    copy_into_bucket(bucket, slot, index, g);
  }
  if (--bucket.pending == 0) {
    if (bucket.first_grad_ns != 0) {
      trace::complete("ddp.bucket_ready", "ddp", bucket.first_grad_ns, trace::now_ns(),
                      {trace::Arg("bucket", static_cast<uint64_t>(b)),
                       trace::Arg("bytes", bucket_bytes(bucket.buffer)),
                       trace::Arg("params", static_cast<uint64_t>(bucket.params.size())),
                       trace::Arg("rank", group_->rank())});
    }
    launch_ready_buckets();
  }
}

void Reducer::copy_into_bucket(Bucket& bucket, size_t slot, size_t index,
                               autograd::LeafGradient* g) {
  Tensor& view = bucket.views[slot];
  Tensor grad = local_gradient(index, g);
  if (grad.defined()) {
    if (!same_view(grad, view)) view.copy_(grad);
  } else {
    view.zero_();
  }
  if (g != nullptr) {
    if (sink_ != nullptr) {
      // Withheld from the sink: finalize() writes the average back in its place.
      g->grad = Tensor();
    } else if (options_.gradient_as_bucket_view && grad.defined()) {
      g->grad = view;
    }
  }
}

Tensor Reducer::direct_tensor(size_t index, autograd::LeafGradient* g) const {
  const Tensor& p = params_[index];
  bool fresh = false;
  Tensor grad = local_gradient(index, g, &fresh);
  if (!grad.defined()) return zeros_like(p);
  const bool plain = grad.is_contiguous() && grad.dtype() == p.dtype() && grad.sizes() == p.sizes();
  // The accumulated .grad() itself when nothing else can be hurt by averaging it in place:
  // a hook's gradient with no sink is the parameter's own (accumulation keeps it private).
  // A sink's sum of what it held and this pass's gradient is a fresh tensor too; a sink's
  // lone gradient may be shared with other parts of the graph, and a gradient marked ready
  // without a hook is averaged only if some rank used the parameter.
  if (plain && fresh) return grad;
  if (plain && g != nullptr && sink_ == nullptr && grad.is_same(p.grad())) return grad;
  return grad.to(p.dtype()).contiguous().clone();
}

GradBucket Reducer::make_grad_bucket(size_t b, const Tensor& buffer,
                                     const std::vector<Tensor>& views) {
  GradBucket gb;
  gb.index = b;
  gb.buffer = buffer;
  gb.gradients = views;
  for (size_t idx : buckets_[b].params) {
    gb.parameters.push_back(params_[idx]);
    gb.parameter_names.push_back(names_[idx]);
  }
  gb.group = group_;
  gb.divisor = divisor_;
  gb.executor = executor_;
  gb.is_last = b + 1 == buckets_.size();
  gb.layout = layout_;
  return gb;
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    if (trace::enabled()) bucket.launch_ns = trace::now_ns();
    if (direct_) {
      bucket.result = detail::all_reduce_average(group_, bucket.direct, Tensor());
    } else {
      GradBucket gb = make_grad_bucket(next_bucket_, bucket.buffer, bucket.views);
      bucket.result = comm_hook_(gb);
    }
    bucket.launched = true;
    if (bucket.launch_ns != 0) {
      // The completion's time; finalize() records the span (so that it ends within the pass,
      // even when this continuation runs after finalize() woke up).
      bucket.done_ns = std::make_shared<std::atomic<int64_t>>(0);
      gradwire::detail::on_complete_inline(
          bucket.result, [done = bucket.done_ns](const Future<Tensor>&) {
            done->store(trace::now_ns(), std::memory_order_release);
          });
    }
    ++next_bucket_;
  }
}

void Reducer::finalize() {
  autograd::NoGradGuard no_grad;
  // The pass's reducer work, from its first gradient hook to the gradients written back
  // (recorded as the function returns or throws).
  struct PassSpan {
    int64_t start_ns;
    int rank;
    uint64_t buckets;
    ~PassSpan() {
      if (start_ns != 0) {
        trace::complete("ddp.backward", "ddp", start_ns, trace::now_ns(),
                        {trace::Arg("rank", rank), trace::Arg("buckets", buckets)});
      }
    }
  } pass_span{pass_start_ns_, group_->rank(), static_cast<uint64_t>(buckets_.size())};
  const trace::Span finalize_span("ddp.finalize", "ddp", trace::Arg("rank", group_->rank()));
  // Stays disarmed if the pass fails; a successful one re-arms for another pass over the
  // same forward (a retained graph).
  expect_hooks_ = false;
  throw_if_buckets_missing();
  const std::vector<char> used_somewhere = used_somewhere_this_pass();
  wait_for_buckets();
  write_gradients(used_somewhere);
  ++iterations_;
  if (!rebuilt_ && iterations_ == 1) rebuild_pending_ = true;
  reset_pass();
  // Another pass over the same forward's graph (retain_graph) is reduced too.
  expect_hooks_ = true;
}

// Throws (after resetting the pass) when the backward pass ended with a bucket never launched.
void Reducer::throw_if_buckets_missing() {
  if (next_bucket_ < buckets_.size()) {
    std::vector<size_t> missing;
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(i);
    reset_pass();
    throw Error("ddp (rank " + std::to_string(group_->rank()) +
                "): the backward pass ended before every gradient bucket was reduced; parameters "
                "that received no gradient: [" +
                join_names(names_, missing) +
                "]. This happens when the forward's outputs do not depend on some parameters. "
                "Construct DistributedDataParallel with find_unused_parameters = true, or make "
                "sure every parameter takes part in producing the loss (and the loss in the "
                "forward's outputs)");
  }
}

// Which parameters some rank used this pass: unused everywhere keep what they had.
std::vector<char> Reducer::used_somewhere_this_pass() {
  // With static_graph the flags of the first pass hold for every later one (no all-reduce).
  std::vector<char> used_somewhere(params_.size(), 1);
  if (options_.static_graph && iterations_ > 0) {
    used_somewhere = static_used_somewhere_;
  } else if (options_.find_unused_parameters || options_.static_graph) {
    used_somewhere = all_reduce_used_flags();
    if (options_.static_graph) {
      static_unused_.clear();
      for (size_t i = 0; i < params_.size(); ++i)
        if (!local_used_[i]) static_unused_.push_back(i);
      static_used_somewhere_ = used_somewhere;
    }
  }
  return used_somewhere;
}

// Waits for every bucket's all-reduce and copies a result that is not the bucket itself back
// into it; the first failure resets the pass and is thrown.
void Reducer::wait_for_buckets() {
  std::exception_ptr failure;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    try {
      Tensor result = bucket.result.get(wait_timeout());
      if (bucket.launch_ns != 0) {
        // Completed no later than now; earlier if its continuation has run already.
        const int64_t done = bucket.done_ns->load(std::memory_order_acquire);
        trace::complete(
            "ddp.allreduce", "ddp", bucket.launch_ns, done != 0 ? done : trace::now_ns(),
            {trace::Arg("bucket", static_cast<uint64_t>(b)),
             trace::Arg("bytes", bucket_bytes(bucket.buffer)), trace::Arg("rank", group_->rank())});
      }
      if (!direct_ && !result.is_same(bucket.buffer)) bucket.buffer.copy_(result.view({-1}));
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    reset_pass();
    std::rethrow_exception(failure);
  }
}

// Writes the averaged gradients where the pass puts them: the sink, or .grad.
void Reducer::write_gradients(const std::vector<char>& used_somewhere) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    auto [b, slot] = locator_[i];
    if (!used_somewhere[i]) {
      // Nobody used it: the sink (or .grad) keeps what it had. Under a sink that is the
      // gradient of earlier passes, which the hook did not withhold (nothing was produced).
      continue;
    }
    if (direct_) {
      // Averaged where it lies: .grad() itself, or a private tensor to put in its place.
      const Tensor& avg = buckets_[b].direct[slot];
      if (sink_ != nullptr) {
        sink_->set_gradient(p, avg);
        continue;
      }
      Tensor grad = p.grad();
      if (!grad.defined()) {
        p.set_grad(avg);
      } else if (!grad.is_same(avg)) {
        grad.copy_(avg);
      }
      continue;
    }
    const Tensor& view = buckets_[b].views[slot];
    if (sink_ != nullptr) {
      // The sink receives its own copy: the bucket is reused by the next pass of any
      // context, and .grad is left alone (contexts never mix in .grad).
      sink_->set_gradient(p, view.clone());
      continue;
    }
    Tensor grad = p.grad();
    if (options_.gradient_as_bucket_view) {
      if (!same_view(grad, view)) p.set_grad(view);
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      p.set_grad(view.clone());
    }
  }
}

std::vector<char> Reducer::all_reduce_used_flags() {
  std::vector<char> out(params_.size(), 1);
  if (params_.empty()) return out;
  Tensor used = zeros({static_cast<int64_t>(params_.size())}, kInt32);
  std::copy(local_used_.begin(), local_used_.end(), used.data<int32_t>());
  group_->all_reduce(used).wait(wait_timeout());
  ++used_flag_reductions_;
  const int32_t* u = used.data<int32_t>();
  for (size_t i = 0; i < params_.size(); ++i)
    out[i] = u[i] > 0;
  return out;
}

void Reducer::shadow_iteration() {
  autograd::NoGradGuard no_grad;
  std::vector<Future<Tensor>> results;
  const bool direct = averages_in_place();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Tensor zero = zeros_like(buckets_[b].buffer);
    std::vector<Tensor> views;
    int64_t offset = 0;
    for (size_t idx : buckets_[b].params) {
      views.push_back(zero.narrow(0, offset, params_[idx].numel()).view(params_[idx].sizes()));
      offset += params_[idx].numel();
    }
    // The same collective the ranks with data issue: a direct pass's tensor list, or the
    // hook's bucket.
    if (direct) {
      results.push_back(detail::all_reduce_average(group_, views, zero));
    } else {
      GradBucket gb = make_grad_bucket(b, zero, views);
      results.push_back(comm_hook_(gb));
    }
  }
  if ((options_.find_unused_parameters || options_.static_graph) &&
      !(options_.static_graph && iterations_ > 0) && !params_.empty()) {
    Tensor used = zeros({static_cast<int64_t>(params_.size())}, kInt32);
    group_->all_reduce(used).wait(wait_timeout());
    ++used_flag_reductions_;
    if (options_.static_graph) {
      // A rank that ran out of data before the first pass learns the flags with the others.
      const int32_t* u = used.data<int32_t>();
      static_used_somewhere_.assign(params_.size(), 1);
      for (size_t i = 0; i < params_.size(); ++i)
        static_used_somewhere_[i] = u[i] > 0;
    }
  }
  for (auto& r : results)
    r.get(wait_timeout());
  ++iterations_;
  // A rank that ran out of data still rebuilds with the others (rank `root`'s order).
  if (!rebuilt_ && iterations_ == 1) rebuild_pending_ = true;
}

}  // namespace gradwire::ddp

#include "gradwire/ddp/comm_hooks.h"

#include <cmath>
#include <string>
#include <utility>

#include "all_reduce_average.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::ddp {
namespace {

// All-reduces `wire` (a compressed copy of the bucket, already divided), then writes it
// back into the bucket's buffer.
Future<Tensor> all_reduce_cast(GradBucket& bucket, DType wire_dtype) {
  autograd::NoGradGuard no_grad;
  Tensor wire = div(bucket.buffer, Scalar(static_cast<double>(bucket.divisor))).to(wire_dtype);
  c10d::Work work = bucket.group->all_reduce(wire);
  Tensor out = bucket.buffer;
  return work.get_future().then(bucket.executor,
                                [wire, out](Future<std::vector<Tensor>> done) mutable {
                                  done.value();
                                  out.copy_(wire);
                                  return out;
                                });
}

// Orthonormalises the columns of the n x r matrix `p` in place (modified Gram-Schmidt).
// A column that is (nearly) a combination of earlier ones is divided by its norm plus a
// small epsilon rather than by zero, as the PowerSGD paper's implementation does.
void orthonormalise(Tensor& p) {
  Tensor work = p.to(kFloat64).contiguous().clone();
  const int64_t n = work.size(0);
  const int64_t r = work.size(1);
  double* d = work.data<double>();
  for (int64_t j = 0; j < r; ++j) {
    for (int64_t k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i)
        dot += d[i * r + k] * d[i * r + j];
      for (int64_t i = 0; i < n; ++i)
        d[i * r + j] -= dot * d[i * r + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i)
      norm += d[i * r + j] * d[i * r + j];
    norm = std::sqrt(norm);
    if (norm < 1e-8) norm += 1e-8;
    for (int64_t i = 0; i < n; ++i)
      d[i * r + j] /= norm;
  }
  p.copy_(work);
}

}  // namespace

namespace detail {

Future<Tensor> all_reduce_average(const std::shared_ptr<c10d::ProcessGroup>& group,
                                  std::vector<Tensor> tensors, Tensor value) {
  c10d::Work work = group->all_reduce(std::move(tensors), {.op = c10d::ReduceOp::kAvg});
  Future<Tensor> result;
  gradwire::detail::on_complete_inline(
      work.get_future(),
      [result, value = std::move(value)](const Future<std::vector<Tensor>>& done) mutable {
        if (done.has_error()) {
          result.try_set_error(done.error());
        } else {
          result.try_set_value(value);
        }
      });
  return result;
}

}  // namespace detail

Future<Tensor> allreduce_hook(GradBucket& bucket) {
  if (bucket.divisor == bucket.group->size()) {
    // The group averages (the shared-memory group divides each rank's slice as it reduces
    // it), and the bucket's future completes on the group's own thread.
    return detail::all_reduce_average(bucket.group, {bucket.buffer}, bucket.buffer);
  }
  c10d::Work work = bucket.group->all_reduce(bucket.buffer);
  Tensor out = bucket.buffer;
  const double divisor = bucket.divisor;
  return work.get_future().then(bucket.executor,
                                [out, divisor](Future<std::vector<Tensor>> done) mutable {
                                  done.value();
                                  autograd::NoGradGuard no_grad;
                                  if (divisor != 1) out.div_(Scalar(divisor));
                                  return out;
                                });
}

Future<Tensor> fp16_compress_hook(GradBucket& bucket) {
  return all_reduce_cast(bucket, kFloat16);
}

Future<Tensor> bf16_compress_hook(GradBucket& bucket) {
  return all_reduce_cast(bucket, kBFloat16);
}

void PowerSGDOptions::validate() const {
  if (rank < 1)
    throw InvalidArgument("PowerSGDOptions: rank must be >= 1, got " + std::to_string(rank));
  if (start_iteration < 0)
    throw InvalidArgument("PowerSGDOptions: start_iteration must be >= 0, got " +
                          std::to_string(start_iteration));
  if (!(min_compression_rate > 0) || !std::isfinite(min_compression_rate))
    throw InvalidArgument("PowerSGDOptions: min_compression_rate must be > 0, got " +
                          std::to_string(min_compression_rate));
}

PowerSGDState::PowerSGDState(PowerSGDOptions options)
    : options_((options.validate(), options)), generator_(options.seed) {}

int64_t PowerSGDState::iteration() const {
  MutexLock lock(mutex_);
  return iteration_;
}

PowerSGDState::Key PowerSGDState::key_of(const std::vector<Tensor>& parameters) {
  Key key;
  key.reserve(parameters.size());
  for (const Tensor& p : parameters)
    key.push_back(p.impl_ptr().get());
  return key;
}

Tensor PowerSGDState::error(size_t index) const {
  MutexLock lock(mutex_);
  auto k = keys_.find(index);
  if (k == keys_.end()) return Tensor();
  auto it = buckets_.find(k->second);
  return it == buckets_.end() || !it->second.error.defined() ? Tensor() : it->second.error.clone();
}

Tensor PowerSGDState::error(const std::vector<Tensor>& parameters) const {
  MutexLock lock(mutex_);
  auto it = buckets_.find(key_of(parameters));
  return it == buckets_.end() || !it->second.error.defined() ? Tensor() : it->second.error.clone();
}

bool PowerSGDState::plain_round(const GradBucket& bucket) {
  MutexLock lock(mutex_);
  const bool plain = iteration_ < options_.start_iteration;
  if (bucket.is_last) ++iteration_;
  return plain;
}

std::vector<Tensor> PowerSGDState::begin_bucket(const GradBucket& bucket, const Key& key,
                                                const std::vector<Tensor>& matrices,
                                                Tensor* local) {
  const PowerSGDOptions& o = options_;
  Tensor buffer = bucket.buffer;
  MutexLock lock(mutex_);
  if (bucket.layout != layout_) {
    layout_ = bucket.layout;
    buckets_.clear();
    keys_.clear();
  }
  keys_[bucket.index] = key;
  PerBucket& mine = buckets_[key];
  if (o.use_error_feedback) {
    if (mine.error.defined() && mine.error.numel() == buffer.numel() &&
        mine.error.dtype() == buffer.dtype()) {
      buffer.add_(mine.error);
    }
    *local = buffer.clone();
  }
  auto& kept = mine.qs;
  bool reuse = o.warm_start && kept.size() == matrices.size();
  for (size_t i = 0; reuse && i < matrices.size(); ++i)
    reuse = kept[i].size(0) == matrices[i].size(1) && kept[i].dtype() == buffer.dtype();
  if (!reuse) {
    kept.clear();
    for (const Tensor& m : matrices)
      kept.push_back(randn({m.size(1), o.rank}, &generator_, m.options()));
  }
  return kept;
}

void PowerSGDState::keep_error(uint64_t layout, const Key& key, Tensor error) {
  MutexLock lock(mutex_);
  if (layout_ == layout) buckets_[key].error = std::move(error);
}

namespace {

// Which gradients of `bucket` are compressed: matrices (views of the buffer, n x m) where
// the factors are smaller than the matrix; the rest travel flat.
void choose_compressed(const GradBucket& bucket, const PowerSGDOptions& o,
                       std::vector<Tensor>* matrices, std::vector<Tensor>* uncompressed) {
  for (const Tensor& g : bucket.gradients) {
    if (g.dim() >= 2) {
      const int64_t n = g.size(0);
      const int64_t m = g.numel() / n;
      if (static_cast<double>((n + m) * o.rank) * o.min_compression_rate <
          static_cast<double>(n * m)) {
        matrices->push_back(g.view({n, m}));
        continue;
      }
    }
    uncompressed->push_back(g.view({-1}));
  }
}

}  // namespace

Future<Tensor> powersgd_hook(const std::shared_ptr<PowerSGDState>& state, GradBucket& bucket) {
  autograd::NoGradGuard no_grad;
  if (state->plain_round(bucket)) return allreduce_hook(bucket);

  Tensor buffer = bucket.buffer;
  std::vector<Tensor> matrices;
  std::vector<Tensor> uncompressed;
  choose_compressed(bucket, state->options_, &matrices, &uncompressed);

  // Error feedback, the local input (for the next error), and the Qs: this bucket's, by the
  // parameters it holds.
  const PowerSGDState::Key key = PowerSGDState::key_of(bucket.parameters);
  Tensor local;
  std::vector<Tensor> qs = state->begin_bucket(bucket, key, matrices, &local);
  // Nothing to compress: one plain all-reduce; the error stays zero.
  if (matrices.empty()) return allreduce_hook(bucket);

  std::vector<Tensor> ps;
  for (size_t i = 0; i < matrices.size(); ++i)
    ps.push_back(mm(matrices[i], qs[i]));
  Tensor flat_p = flatten_dense_tensors(ps);
  bucket.group->all_reduce(flat_p).wait();
  ps = unflatten_dense_tensors(flat_p, ps);
  for (size_t i = 0; i < matrices.size(); ++i) {
    orthonormalise(ps[i]);
    qs[i].copy_(mm(matrices[i].t(), ps[i]));
  }
  // Keep the orthonormal Ps for the continuation.
  std::vector<Tensor> wire_parts = qs;
  for (const Tensor& u : uncompressed)
    wire_parts.push_back(u);
  Tensor wire = flatten_dense_tensors(wire_parts);
  c10d::Work work = bucket.group->all_reduce(wire);
  const double divisor = bucket.divisor;
  std::weak_ptr<PowerSGDState> weak = state;
  const uint64_t layout = bucket.layout;
  return work.get_future().then(bucket.executor, [=](Future<std::vector<Tensor>> done) mutable {
    done.value();
    autograd::NoGradGuard guard;
    wire.div_(Scalar(divisor));
    std::vector<Tensor> parts = unflatten_dense_tensors(wire, wire_parts);
    for (size_t i = 0; i < matrices.size(); ++i) {
      qs[i].copy_(parts[i]);
      matrices[i].copy_(mm(ps[i], qs[i].t()));
    }
    for (size_t i = 0; i < uncompressed.size(); ++i)
      uncompressed[i].copy_(parts[matrices.size() + i]);
    // Unless a new layout has started meanwhile.
    if (local.defined()) {
      if (auto s = weak.lock()) s->keep_error(layout, key, sub(local, buffer));
    }
    return buffer;
  });
}

CommHook make_powersgd_hook(std::shared_ptr<PowerSGDState> state) {
  if (!state) throw InvalidArgument("make_powersgd_hook: the state is null");
  return [state](GradBucket& bucket) { return powersgd_hook(state, bucket); };
}

}  // namespace gradwire::ddp

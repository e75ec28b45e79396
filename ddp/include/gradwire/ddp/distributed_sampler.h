// DistributedSampler: which dataset indices each rank reads in an epoch.
//
// The dataset's indices are (optionally) shuffled with a generator seeded by seed + epoch,
// the same permutation on every rank, then made a multiple of the world size: by padding
// with indices from the start of the permutation (drop_last = false, the default: every
// sample is seen, a few twice) or by dropping the tail (drop_last = true: none twice, a few
// not at all). Rank r then takes every world-th index starting at r, so the ranks' shares
// are disjoint (when not padded), equally long, and together cover the dataset. Call
// set_epoch(e) before each epoch for a new shuffle; without it every epoch repeats the same
// order, as in PyTorch.
//
// Thread-safety: a value; const methods may be called concurrently, set_epoch not.
// Errors: InvalidArgument for world_size < 1, a rank outside [0, world_size), or a negative
// dataset size.
//
// Example:
//   ddp::DistributedSampler sampler({.dataset_size = 50000, .world_size = world,
//                                    .rank = rank, .seed = 7});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (int64_t i : sampler.indices()) { ... }
//   }
#pragma once

#include <cstdint>
#include <vector>

namespace gradwire::ddp {

struct DistributedSamplerOptions {
  int64_t dataset_size{0};
  int world_size{1};
  int rank{0};
  bool shuffle{true};
  uint64_t seed{0};
  bool drop_last{false};
  void validate() const;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(DistributedSamplerOptions options);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  // How many indices each rank gets per epoch.
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * world_size.
  int64_t total_size() const { return num_samples_ * options_.world_size; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  DistributedSamplerOptions options_;
  int64_t epoch_{0};
  int64_t num_samples_{0};
};

}  // namespace gradwire::ddp

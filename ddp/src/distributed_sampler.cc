#include "gradwire/ddp/distributed_sampler.h"

#include <numeric>
#include <string>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::ddp {

void DistributedSamplerOptions::validate() const {
  if (dataset_size < 0)
    throw InvalidArgument("DistributedSampler: dataset_size must be >= 0, got " +
                          std::to_string(dataset_size));
  if (world_size < 1)
    throw InvalidArgument("DistributedSampler: world_size must be >= 1, got " +
                          std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(world_size) + ")");
}

DistributedSampler::DistributedSampler(DistributedSamplerOptions options) : options_(options) {
  options_.validate();
  const int64_t n = options_.dataset_size;
  const int64_t w = options_.world_size;
  num_samples_ = options_.drop_last ? n / w : (n + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t n = options_.dataset_size;
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (options_.shuffle && n > 0) {
    Generator gen(options_.seed + static_cast<uint64_t>(epoch_));
    order = randperm(n, &gen).to_vector<int64_t>();
  } else {
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size();
  // Pad by repeating the permutation from its start (more than once for tiny datasets).
  for (int64_t i = 0; static_cast<int64_t>(order.size()) < total && n > 0; ++i)
    order.push_back(order[static_cast<size_t>(i % n)]);
  order.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = options_.rank; i < total; i += options_.world_size)
    mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace gradwire::ddp

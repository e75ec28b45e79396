// Shared pieces of the checkpoint tests: bit-for-bit comparison, deterministic tensors, and
// a two-server state (a 10x4 table split 5/5 and a bias each server holds whole).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::checkpoint::test {

// Same dtype, same sizes and the same bytes (NaN payloads and signed zeros included).
inline ::testing::AssertionResult bits_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << a.dtype() << " " << a.shape_string() << " vs "
                                         << b.dtype() << " " << b.shape_string();
  }
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  if (std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) != 0)
    return ::testing::AssertionFailure() << "the bytes differ: " << a << " vs " << b;
  return ::testing::AssertionSuccess();
}

// Normal values of `dtype` drawn from a generator seeded with `seed`.
inline Tensor values(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  Generator gen(seed);
  return randn(shape, &gen, TensorOptions(dtype));
}

// Server `rank` of two: rows row_range(10, rank, 2) of the table, the whole bias, Adagrad-like
// optimizer state split like the table, a step count, counters and an rng string.
struct TwoServers {
  Tensor table = values({10, 4}, 1);
  Tensor table_sum = abs(values({10, 4}, 2));
  Tensor bias = values({4}, 3);
  Tensor bias_sum = abs(values({4}, 4));

  ShardState shard(int rank) const {
    const auto [first, last] = row_range(10, rank, 2);
    ShardState s;
    s.job_shards = {"ps0", "ps1"};
    s.params.push_back({"emb.weight", table.slice(0, first, last).clone(), {10, 4}, first});
    s.params.push_back({"bias", bias.clone()});
    s.optimizer.push_back(
        {"emb.weight/sum", table_sum.slice(0, first, last).clone(), {10, 4}, first});
    s.optimizer.push_back(
        {"emb.weight/step", scalar_tensor(int64_t{7 + rank}, TensorOptions(kInt64))});
    s.optimizer.push_back({"bias/sum", bias_sum.clone()});
    s.optimizer_kind = "Adagrad";
    s.optimizer_hyper = {{"hyper.lr", scalar_tensor(0.1, TensorOptions(kFloat64))}};
    s.counters = {{"step", 40 + rank}, {"epoch", 2}};
    s.rng = std::string("rng-of-") + std::to_string(rank) + std::string(1, '\0') + "x";
    return s;
  }
};

}  // namespace gradwire::checkpoint::test

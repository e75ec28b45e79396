#include "gradwire/nn/embedding.h"

#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/nn/init.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn {
namespace {

void validate_table(int64_t num, int64_t dim, DType dtype, const char* what) {
  GRADWIRE_CHECK_ARG(num > 0) << what << ": num_embeddings must be positive, got " << num;
  GRADWIRE_CHECK_ARG(dim > 0) << what << ": embedding_dim must be positive, got " << dim;
  GRADWIRE_CHECK_ARG(is_floating_point(dtype)) << what << ": dtype must be floating, got " << dtype;
}

// Flat int64 copy of `indices`, each checked against the table size.
Tensor checked_indices(const Tensor& indices, int64_t num, const char* what) {
  GRADWIRE_CHECK_ARG(indices.defined()) << what << ": undefined input";
  GRADWIRE_CHECK_ARG(indices.dtype() == kInt64 || indices.dtype() == kInt32)
      << what << ": indices must be int64 or int32, got " << indices.dtype();
  Tensor flat = indices.to(kInt64).contiguous().reshape({-1});
  const int64_t* p = flat.data<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    GRADWIRE_CHECK_ARG(p[i] >= 0 && p[i] < num) << what << ": index " << p[i] << " (position " << i
                                                << ") is out of range for " << num << " embeddings";
  }
  return flat;
}

}  // namespace

void EmbeddingOptions::validate() const {
  validate_table(num_embeddings, embedding_dim, dtype, "EmbeddingOptions");
}

Embedding::Embedding(const EmbeddingOptions& options)
    : UnaryModule("Embedding"), options_(options) {
  options_.validate();
  weight_ = register_parameter("weight", empty({options_.num_embeddings, options_.embedding_dim},
                                               TensorOptions(options_.dtype)));
  reset_parameters(options_.generator);
}

void Embedding::reset_parameters(Generator* gen) {
  init::normal_(weight_, 0.0, 1.0, gen);
}

Tensor Embedding::forward(const Tensor& indices) {
  Tensor flat = checked_indices(indices, options_.num_embeddings, "Embedding");
  Shape out_shape = indices.sizes();
  out_shape.push_back(options_.embedding_dim);
  return embedding_rows(weight_, flat, options_.sparse).view(out_shape);
}

void EmbeddingBagOptions::validate() const {
  validate_table(num_embeddings, embedding_dim, dtype, "EmbeddingBagOptions");
}

EmbeddingBag::EmbeddingBag(const EmbeddingBagOptions& options)
    : UnaryModule("EmbeddingBag"), options_(options) {
  options_.validate();
  weight_ = register_parameter("weight", empty({options_.num_embeddings, options_.embedding_dim},
                                               TensorOptions(options_.dtype)));
  reset_parameters(options_.generator);
}

void EmbeddingBag::reset_parameters(Generator* gen) {
  init::normal_(weight_, 0.0, 1.0, gen);
}

Tensor EmbeddingBag::forward(const Tensor& input) {
  GRADWIRE_CHECK_ARG(input.defined() && input.dim() == 2)
      << "EmbeddingBag: without offsets the input must be 2-d [bags, length], got "
      << (input.defined() ? input.shape_string() : std::string("undefined"));
  const int64_t bags = input.size(0), length = input.size(1);
  std::vector<int64_t> offsets(static_cast<size_t>(bags));
  for (int64_t b = 0; b < bags; ++b)
    offsets[static_cast<size_t>(b)] = b * length;
  return forward(input.reshape({-1}), tensor<int64_t>(offsets));
}

Tensor EmbeddingBag::forward(const Tensor& input, const Tensor& offsets) {
  GRADWIRE_CHECK_ARG(input.defined() && input.dim() == 1)
      << "EmbeddingBag: with offsets the input must be 1-d, got "
      << (input.defined() ? input.shape_string() : std::string("undefined"));
  GRADWIRE_CHECK_ARG(offsets.defined() && offsets.dim() == 1 &&
                     (offsets.dtype() == kInt64 || offsets.dtype() == kInt32))
      << "EmbeddingBag: offsets must be a 1-d int64 or int32 tensor";
  Tensor flat = checked_indices(input, options_.num_embeddings, "EmbeddingBag");
  const int64_t n = flat.numel();
  const int64_t bags = offsets.numel();
  Tensor off = offsets.to(kInt64).contiguous();
  const int64_t* o = off.data<int64_t>();
  GRADWIRE_CHECK_ARG(bags == 0 || o[0] == 0) << "EmbeddingBag: offsets[0] must be 0, got " << o[0];
  // bag_of[i]: the bag index i belongs to; count[b]: the bag's size (for the mean).
  std::vector<int64_t> bag_of(static_cast<size_t>(n));
  std::vector<double> count(static_cast<size_t>(bags));
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t begin = o[b];
    const int64_t end = b + 1 < bags ? o[b + 1] : n;
    GRADWIRE_CHECK_ARG(begin <= end && end <= n)
        << "EmbeddingBag: offsets must be non-decreasing and at most the input size (" << n
        << "); offsets[" << b << "] = " << begin << " is followed by " << end;
    for (int64_t i = begin; i < end; ++i)
      bag_of[static_cast<size_t>(i)] = b;
    count[static_cast<size_t>(b)] = double(end - begin);
  }
  GRADWIRE_CHECK_ARG(bags > 0 || n == 0) << "EmbeddingBag: indices given without any bag";
  const Tensor rows = embedding_rows(weight_, flat, options_.sparse);  // [n, dim]
  Tensor out = index_add(zeros({bags, options_.embedding_dim}, TensorOptions(weight_.dtype())), 0,
                         tensor<int64_t>(bag_of), rows);
  if (options_.mode == EmbeddingBagMode::kSum) return out;
  // Mean: divide by each bag's size; an empty bag stays zero.
  for (double& c : count)
    c = c > 0 ? 1.0 / c : 0.0;
  return out * tensor<double>(count).to(weight_.dtype()).view({bags, 1});
}

}  // namespace gradwire::nn

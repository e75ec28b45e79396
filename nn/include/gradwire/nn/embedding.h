// Embedding and EmbeddingBag: lookup tables of learned vectors (torch.nn.Embedding,
// torch.nn.EmbeddingBag).
//
// weight is [num_embeddings, embedding_dim], initialised N(0, 1) as PyTorch documents.
// Embedding maps int64 (or int32) indices of any shape to [..., embedding_dim]. Rows that
// were looked up several times receive the sum of their gradients. The weight gradient is
// dense (the table's size) by default; with `sparse = true` it is a sparse-rows tensor
// (tensor/sparse.h) holding only the rows the batch looked up, duplicates not yet summed
// (PyTorch's sparse=True): what a large table wants, since a step then costs the batch, not
// the table. SGD (without momentum or weight decay), Adagrad and SparseAdam take such
// gradients (optim/); DistributedDataParallel refuses them (docs/ddp.md).
//
// EmbeddingBag reduces each bag of looked-up rows to one vector, by sum or mean, without
// materialising [bag, length, dim]. Bags are given as
//   - a 1-d `input` of indices with 1-d `offsets`: bag i holds input[offsets[i] ..
//     offsets[i+1]) (the last runs to the end), offsets[0] == 0 and non-decreasing; or
//   - a 2-d `input` [B, L]: B bags of L indices each (offsets must be omitted).
// An empty bag gives a zero vector in both modes (as PyTorch).
//
// Errors: InvalidArgument for non-positive sizes, non-integral or out-of-range indices
// (naming the index and the table size), and malformed offsets (naming the position).
//
// Thread-safety: as Module.
//
// Example:
//   nn::Embedding emb(nn::EmbeddingOptions{.num_embeddings = 1000, .embedding_dim = 16});
//   Tensor v = emb(tensor<int64_t>({3, 1, 4}));                       // [3, 16]
//   nn::EmbeddingBag bag(nn::EmbeddingBagOptions{1000, 16, nn::EmbeddingBagMode::kMean});
//   Tensor b = bag.forward(tensor<int64_t>({3, 1, 4}), tensor<int64_t>({0, 2}));  // [2, 16]
//   nn::Embedding table(nn::EmbeddingOptions{.num_embeddings = 10'000'000, .embedding_dim = 64,
//                                            .sparse = true});  // gradients: batch rows only
#pragma once

#include <cstdint>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::nn {

struct EmbeddingOptions {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  DType dtype = kFloat32;
  Generator* generator = nullptr;
  bool sparse = false;  // the weight's gradient: sparse rows instead of a dense table
  void validate() const;
};

class Embedding : public UnaryModule {
 public:
  explicit Embedding(const EmbeddingOptions& options);

  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr);  // N(0, 1)

  const Tensor& weight() const { return weight_; }
  const EmbeddingOptions& options() const { return options_; }

 private:
  EmbeddingOptions options_;
  Tensor weight_;
};

enum class EmbeddingBagMode { kSum, kMean };

struct EmbeddingBagOptions {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  EmbeddingBagMode mode = EmbeddingBagMode::kMean;  // PyTorch's default
  DType dtype = kFloat32;
  Generator* generator = nullptr;
  bool sparse = false;  // the weight's gradient: sparse rows instead of a dense table
  void validate() const;
};

class EmbeddingBag : public UnaryModule {
 public:
  explicit EmbeddingBag(const EmbeddingBagOptions& options);

  // 2-d input [B, L]: B bags of L indices.
  Tensor forward(const Tensor& input) override;
  // 1-d input with 1-d offsets (see the header comment). Returns [offsets.numel(), dim].
  Tensor forward(const Tensor& input, const Tensor& offsets);
  void reset_parameters(Generator* gen = nullptr);  // N(0, 1)

  const Tensor& weight() const { return weight_; }
  const EmbeddingBagOptions& options() const { return options_; }

 private:
  EmbeddingBagOptions options_;
  Tensor weight_;
};

}  // namespace gradwire::nn

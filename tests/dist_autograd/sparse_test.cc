// Sparse-rows gradients in dist_autograd: an embedding table with a sparse gradient on one
// worker, looked up by another inside a context, receives in the context exactly the rows
// looked up (as sparse rows, never densified), equal to the dense table gradient of the
// same computation; passes in one context add their rows up; and a sparse gradient crosses
// the wire in a Propagate back to the worker that sent the table. Workers are threads of
// one process (rpc agents over loopback); float64 throughout.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "gradwire/autograd/variable.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "support/agents.h"

namespace gradwire {
namespace {

namespace da = dist_autograd;

constexpr int64_t kRows = 10;
constexpr int64_t kDim = 3;

// The table: row r holds r + 0.1, r + 0.2, r + 0.3.
Tensor make_table() {
  std::vector<double> v;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 1; c <= kDim; ++c)
      v.push_back(static_cast<double>(r) + 0.1 * static_cast<double>(c));
  Tensor w = tensor(v, Shape{kRows, kDim});
  w.set_requires_grad(true);
  return w;
}

// The loss of the looked-up rows: sum(rows * rows * k) with k[i][j] = i + 2j + 1, so every
// looked-up row gets a gradient of its own (2 * row * k).
Tensor loss_of(const Tensor& rows) {
  const int64_t n = rows.sizes()[0];
  std::vector<double> k;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kDim; ++j)
      k.push_back(static_cast<double>(i + 2 * j + 1));
  return sum(mul(mul(rows, rows), tensor(k, Shape{n, kDim})));
}

// The dense table gradient of loss_of(lookup(idx)) for each lookup, summed: the reference.
Tensor dense_gradient(const std::vector<Tensor>& lookups) {
  Tensor w = make_table();
  for (const Tensor& idx : lookups)
    loss_of(embedding_rows(w, idx, /*sparse_grad=*/false)).backward();
  return w.grad();
}

void expect_close(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const std::vector<double> a = got.contiguous().to_vector<double>();
  const std::vector<double> b = want.contiguous().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-12) << "element " << i;
}

class SparseDistAutograd : public ::testing::Test {
 protected:
  void SetUp() override {
    // The server's table, looked up by callers (an nn::Embedding with sparse = true).
    reg_.def("lookup", [this](const Tensor& idx) {
      return embedding_rows(table_, idx, /*sparse_grad=*/true);
    });
    // A table sent by the caller, looked up here: its sparse gradient goes back to the caller.
    reg_.def("lookup_in", [](const Tensor& table, const Tensor& idx) {
      return embedding_rows(table, idx, /*sparse_grad=*/true);
    });
    agents_ = test::start_agents(2, test::agent_options(reg_));
  }
  void TearDown() override { test::shutdown_agents(agents_); }

  rpc::RpcAgent& server() { return *agents_[0]; }
  rpc::RpcAgent& trainer() { return *agents_[1]; }

  rpc::Registry reg_;
  Tensor table_ = make_table();
  test::Agents agents_;
};

TEST_F(SparseDistAutograd, TheServersTableGetsTheLookedUpRowsAsSparseRows) {
  const Tensor idx = tensor<int64_t>({1, 7, 1, 4});  // row 1 twice
  da::Context ctx(trainer());
  const Tensor rows = trainer().rpc_sync<Tensor>("w0", "lookup", idx);
  ASSERT_TRUE(rows.requires_grad());
  da::backward(trainer(), ctx.id(), {loss_of(rows)});

  const da::Gradients grads = da::get_gradients(server(), ctx.id());
  ASSERT_TRUE(grads.contains(table_));
  const Tensor g = grads.at(table_);
  ASSERT_TRUE(g.is_sparse()) << "the context holds a " << layout_name(g.layout()) << " gradient";
  EXPECT_EQ(g.sizes(), (Shape{kRows, kDim}));
  // Exactly the rows looked up, duplicates kept until coalesced.
  EXPECT_EQ(g.nnz(), 4);
  EXPECT_EQ(g.coalesce().indices().to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
  expect_close(g.to_dense(), dense_gradient({idx}));
  // Nothing went to .grad(): the gradient lives in the context.
  EXPECT_FALSE(table_.grad().defined());
  // The trainer holds no leaf of the table.
  EXPECT_EQ(da::get_gradients(trainer(), ctx.id()).size(), 0u);
}

TEST_F(SparseDistAutograd, TwoPassesInOneContextAddTheirRowsWithoutDensifying) {
  const Tensor first = tensor<int64_t>({2, 5});
  const Tensor second = tensor<int64_t>({5, 9, 0});
  da::Context ctx(trainer());
  da::backward(trainer(), ctx.id(), {loss_of(trainer().rpc_sync<Tensor>("w0", "lookup", first))});
  const Tensor after_one = da::get_gradients(server(), ctx.id()).at(table_);
  ASSERT_TRUE(after_one.is_sparse());
  EXPECT_EQ(after_one.nnz(), 2);
  da::backward(trainer(), ctx.id(), {loss_of(trainer().rpc_sync<Tensor>("w0", "lookup", second))});
  const Tensor g = da::get_gradients(server(), ctx.id()).at(table_);
  ASSERT_TRUE(g.is_sparse());
  EXPECT_EQ(g.nnz(), 5);  // 2 + 3 rows: concatenated, row 5 twice
  EXPECT_EQ(g.coalesce().indices().to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 5, 9}));
  expect_close(g.to_dense(), dense_gradient({first, second}));
  // The first pass's gradient was not written into by the second.
  EXPECT_EQ(after_one.nnz(), 2);
}

TEST_F(SparseDistAutograd, ASparseGradientTravelsBackInAPropagate) {
  // The trainer owns the table and sends it; the server looks rows up in what it received,
  // so the table's gradient is sparse on the server and crosses the wire back (Propagate)
  // to the trainer's table, in the context.
  Tensor table = make_table();
  const Tensor idx = tensor<int64_t>({8, 3, 8});
  da::Context ctx(trainer());
  const Tensor rows = trainer().rpc_sync<Tensor>("w0", "lookup_in", table, idx);
  da::backward(trainer(), ctx.id(), {loss_of(rows)});

  const da::Gradients grads = da::get_gradients(trainer(), ctx.id());
  ASSERT_TRUE(grads.contains(table));
  const Tensor g = grads.at(table);
  ASSERT_TRUE(g.is_sparse()) << "arrived " << layout_name(g.layout());
  EXPECT_EQ(g.nnz(), 3);
  EXPECT_EQ(g.coalesce().indices().to_vector<int64_t>(), (std::vector<int64_t>{3, 8}));
  expect_close(g.to_dense(), dense_gradient({idx}));
  EXPECT_FALSE(table.grad().defined());

  // A second pass over a fresh lookup adds its rows to the same sparse gradient.
  const Tensor more = tensor<int64_t>({0});
  da::backward(trainer(), ctx.id(),
               {loss_of(trainer().rpc_sync<Tensor>("w0", "lookup_in", table, more))});
  const Tensor both = da::get_gradients(trainer(), ctx.id()).at(table);
  ASSERT_TRUE(both.is_sparse());
  EXPECT_EQ(both.nnz(), 4);
  expect_close(both.to_dense(), dense_gradient({idx, more}));
}

}  // namespace
}  // namespace gradwire

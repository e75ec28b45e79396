// gradwire::torch::DistributedDataParallel (torch/ddp.h) with 2 ranks as processes, over the
// shared-memory group and Gloo: parameters and gradients after steps of SGD on a float64
// torch MLP equal single-process LibTorch on the concatenated batch (1e-12) with several
// buckets launched while LibTorch's backward goes on; the broadcast from rank 0 at
// construction (a frozen parameter broadcast, not reduced); replicas whose parameter shapes
// differ refused naming the parameter; unused parameters with and without
// find_unused_parameters, with static_graph, and an output the loss leaves out; a sparse
// gradient refused; gradient accumulation under no_sync; a comm hook's result in grad().
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/ddp/comm_hooks.h"
#include "gradwire/torch/bridge.h"
#include "support/error_text.h"
#include "torch_bridge/torch_groups.h"

namespace gradwire::torch {
namespace {

using namespace std::chrono_literals;
using test::error_text;
namespace tnn = ::torch::nn;

constexpr int kWorld = 2;
constexpr int64_t kRowsPerRank = 4;
constexpr double kTol = 1e-12;

using Body = std::function<void(const std::shared_ptr<c10d::ProcessGroup>& group, int rank)>;

// Runs `body` on kWorld ranks as processes, each with a group of `backend`.
void run_ranks(const std::string& backend, const Body& body) {
  test_util::run_group_ranks("torch-ddp", backend, kWorld, body);
}

// A float64 MLP initialised from `seed`.
tnn::Sequential make_mlp(uint64_t seed, int64_t hidden = 5) {
  ::torch::manual_seed(seed);
  tnn::Sequential net(tnn::Linear(3, hidden), tnn::Tanh(), tnn::Linear(hidden, 4), tnn::Tanh(),
                      tnn::Linear(4, 2));
  net->to(at::kDouble);
  return net;
}

// Step `step`'s whole batch (every rank's rows, rank 0's first) and its targets.
std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::Generator gen = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(step));
  const int64_t rows = kRowsPerRank * kWorld;
  at::Tensor x = at::randn({rows, 3}, gen, at::TensorOptions().dtype(at::kDouble));
  at::Tensor y = at::randn({rows, 2}, gen, at::TensorOptions().dtype(at::kDouble));
  return {x, y};
}

at::Tensor rows_of(const at::Tensor& t, int rank) {
  return t.narrow(0, rank * kRowsPerRank, kRowsPerRank);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Each parameter and gradient of `a` equals `b`'s within kTol.
void expect_close(const tnn::Module& a, const tnn::Module& b, bool grads = true) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_LE(max_diff(pa[i].value(), pb[i].value()), kTol) << pa[i].key();
    if (!grads) continue;
    ASSERT_TRUE(pa[i].value().grad().defined()) << pa[i].key();
    EXPECT_LE(max_diff(pa[i].value().grad(), pb[i].value().grad()), kTol) << pa[i].key();
  }
}

class TorchDdp : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchDdp, StepsOfSgdEqualOneProcessOnTheWholeBatch) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    // Each rank starts from its own initialisation; the broadcast makes rank 0's everyone's.
    tnn::Sequential net = make_mlp(10 + static_cast<uint64_t>(rank));
    tnn::Sequential reference = make_mlp(10);
    // Tiny buckets: several of them, launched while backward goes on.
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 1e-4, .first_bucket_mb = 5e-5});
    EXPECT_GT(model.reducer().bucket_indices().size(), 1u);
    ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1));
    ::torch::optim::SGD ref_opt(reference->parameters(), ::torch::optim::SGDOptions(0.1));
    constexpr int kSteps = 5;
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(step);
      opt.zero_grad();
      ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
      ref_opt.zero_grad();
      ::torch::mse_loss(reference->forward(x), y).backward();
      expect_close(*net, *reference);
      opt.step();
      ref_opt.step();
    }
    expect_close(*net, *reference);
    EXPECT_EQ(model.reducer().iterations(), kSteps);
    EXPECT_TRUE(model.reducer().buckets_rebuilt());
  });
}

TEST_P(TorchDdp, ConstructionBroadcastsRankZerosParametersAndBuffers) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    ::torch::manual_seed(20 + static_cast<uint64_t>(rank));
    tnn::Linear linear(3, 4);
    tnn::BatchNorm1d bn(4);
    tnn::Sequential net(linear, bn);
    net->to(at::kDouble);
    // Rank-specific running statistics.
    bn->running_mean.fill_(static_cast<double>(rank + 1));
    ::torch::manual_seed(20);
    tnn::Sequential rank0(tnn::Linear(3, 4), tnn::BatchNorm1d(4));
    rank0->to(at::kDouble);
    // A frozen parameter is broadcast too, but not reduced.
    linear->bias.set_requires_grad(false);
    DistributedDataParallel model(net, group);
    expect_close(*net, *rank0, /*grads=*/false);
    EXPECT_TRUE(bn->running_mean.equal(at::ones({4}, at::kDouble)));
    EXPECT_EQ(model.parameter_names(),
              (std::vector<std::string>{"0.weight", "1.weight", "1.bias"}));
    // Given as a plain torch::nn::Module, the wrapper knows no one-tensor forward.
    DistributedDataParallel plain(std::static_pointer_cast<tnn::Module>(net.ptr()), group);
    const std::string what = error_text<InvalidArgument>([&] {
      plain.forward(at::ones({2, 3}, at::kDouble));
    });
    EXPECT_NE(what.find("call forward_with"), std::string::npos) << what;
  });
}

TEST_P(TorchDdp, ReplicasWithDifferentParameterShapesAreRefusedNamingTheParameter) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    tnn::Sequential net = make_mlp(1, rank == 0 ? 5 : 6);
    const std::string what =
        error_text<InvalidArgument>([&] { DistributedDataParallel model(net, group); });
    EXPECT_NE(what.find("parameters differ across ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("parameter '0.weight'"), std::string::npos) << what;
  });
}

// Three linear maps: `a` always used, `b` used on rank 0 only, `c` never.
struct Branches : tnn::Module {
  Branches() {
    ::torch::manual_seed(3);
    a = register_module("a", tnn::Linear(3, 2));
    b = register_module("b", tnn::Linear(3, 2));
    c = register_module("c", tnn::Linear(3, 2));
    to(at::kDouble);
  }
  at::Tensor run(const at::Tensor& x, bool use_b) {
    at::Tensor out = a(x);
    return use_b ? out + b(x) : out;
  }
  tnn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};

// The gradient of each of Branches' parameters on rank `rank`'s rows of step `step`
// (undefined for the parameters that rank does not use).
std::vector<at::Tensor> local_grads(int rank, int step, bool use_b) {
  auto net = std::make_shared<Branches>();
  auto [x, y] = batch(step);
  ::torch::mse_loss(net->run(rows_of(x, rank), use_b), rows_of(y, rank)).backward();
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : net->parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return out;
}

// b is used on the ranks where use_b(rank) holds.
void expect_branch_averages(const Branches& net, int step, const std::function<bool(int)>& use_b) {
  const std::vector<at::Tensor> g0 = local_grads(0, step, use_b(0));
  const std::vector<at::Tensor> g1 = local_grads(1, step, use_b(1));
  const auto params = net.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].key();
    const at::Tensor grad = params[i].value().grad();
    if (name.rfind("c.", 0) == 0) {
      EXPECT_FALSE(grad.defined()) << name << " is used on no rank";
      continue;
    }
    ASSERT_TRUE(grad.defined()) << name;
    at::Tensor sum = at::zeros_like(grad);
    if (g0[i].defined()) sum += g0[i];
    if (g1[i].defined()) sum += g1[i];
    EXPECT_LE(max_diff(grad, sum / kWorld), kTol) << name << " at step " << step;
  }
}

// One step of the branch model on `rank` (b used where use_b holds), its gradients checked
// against the ranks' averages.
void branch_step(DistributedDataParallel& model, Branches& net, int rank, int step,
                 const std::function<bool(int)>& use_b) {
  net.zero_grad();
  auto [x, y] = batch(step);
  auto outs = model.forward_with([&](tnn::Module&) {
    return std::vector<at::Tensor>{net.run(rows_of(x, rank), use_b(rank))};
  });
  ::torch::mse_loss(outs[0], rows_of(y, rank)).backward();
  expect_branch_averages(net, step, use_b);
}

TEST_P(TorchDdp, FindUnusedParametersAveragesWithZerosWhereUnused) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    auto net = std::make_shared<Branches>();
    DistributedDataParallel model(
        net, group,
        {.bucket_cap_mb = 1e-4, .first_bucket_mb = 5e-5, .find_unused_parameters = true});
    // Each step b is used on one rank, in turn (the buckets are rebuilt after the first).
    for (int step = 0; step < 3; ++step)
      branch_step(model, *net, rank, step, [step](int r) { return (r + step) % 2 == 0; });
    EXPECT_TRUE(model.reducer().buckets_rebuilt());
    EXPECT_EQ(model.reducer().used_flag_reductions(), 3);
  });
}

TEST_P(TorchDdp, StaticGraphLearnsTheUnusedParametersFromTheFirstPass) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    auto net = std::make_shared<Branches>();
    DistributedDataParallel model(net, group, {.static_graph = true});
    // b is used on rank 0 only, at every step.
    for (int step = 0; step < 3; ++step)
      branch_step(model, *net, rank, step, [](int r) { return r == 0; });
    EXPECT_EQ(model.reducer().used_flag_reductions(), 1);
    EXPECT_EQ(model.reducer().iterations(), 3);
  });
}

TEST_P(TorchDdp, AParameterNoRankUsesFailsBackwardNamingItWithoutFindUnused) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    auto net = std::make_shared<Branches>();
    DistributedDataParallel model(net, group);
    auto [x, y] = batch(0);
    auto outs = model.forward_with(
        [&](tnn::Module&) { return std::vector<at::Tensor>{net->run(rows_of(x, rank), true)}; });
    at::Tensor loss = ::torch::mse_loss(outs[0], rows_of(y, rank));
    // The Reducer's own error, out of LibTorch's backward with its type.
    const std::string what = error_text<Error>([&] { loss.backward(); });
    EXPECT_NE(what.find("'c.weight'"), std::string::npos) << what;
    EXPECT_NE(what.find("'c.bias'"), std::string::npos) << what;
    EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
  });
}

TEST_P(TorchDdp, AnOutputTheLossLeavesOutFailsBackwardNamingItsParameters) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    auto net = std::make_shared<Branches>();
    DistributedDataParallel model(net, group);
    auto [x, y] = batch(0);
    auto outs = model.forward_with([&](tnn::Module&) {
      return std::vector<at::Tensor>{net->run(rows_of(x, rank), true), net->c(x)};
    });
    at::Tensor loss = ::torch::mse_loss(outs[0], rows_of(y, rank));
    const std::string what = error_text<Error>([&] { loss.backward(); });
    EXPECT_NE(what.find("received no gradient: ['c.weight', 'c.bias']"), std::string::npos) << what;
    // The next step, with every output in the loss, is reduced.
    outs = model.forward_with([&](tnn::Module&) {
      return std::vector<at::Tensor>{net->run(rows_of(x, rank), true) + net->c(rows_of(x, rank))};
    });
    ::torch::mse_loss(outs[0], rows_of(y, rank)).backward();
    EXPECT_EQ(model.reducer().iterations(), 1);
  });
}

TEST_P(TorchDdp, BucketsAreLaunchedWhileLibTorchsBackwardGoesOn) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    tnn::Sequential net = make_mlp(9);
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 1e-4, .first_bucket_mb = 5e-5});
    const at::Tensor first_weight = net->parameters().front();
    // For each bucket, whether the first layer's weight had its gradient when it launched.
    auto seen = std::make_shared<std::vector<bool>>();
    model.register_comm_hook([seen, first_weight](ddp::GradBucket& bucket) {
      seen->push_back(first_weight.grad().defined());
      return ddp::allreduce_hook(bucket);
    });
    auto [x, y] = batch(0);
    ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
    ASSERT_GT(seen->size(), 1u);
    // The last layer's bucket went out before LibTorch reached the first layer.
    EXPECT_FALSE(seen->front());
    EXPECT_TRUE(seen->back());
    EXPECT_TRUE(first_weight.grad().defined());
  });
}

TEST_P(TorchDdp, ASparseGradientIsRefusedNamingTheParameter) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int) {
    ::torch::manual_seed(4);
    tnn::Embedding emb(tnn::EmbeddingOptions(6, 3).sparse(true));
    emb->to(at::kDouble);
    DistributedDataParallel model(emb, group);
    const at::Tensor ids = at::arange(3, at::kLong);
    at::Tensor loss = model.forward(ids).sum();
    const std::string what = error_text<InvalidArgument>([&] { loss.backward(); });
    EXPECT_NE(what.find("parameter 'weight' has a Sparse gradient"), std::string::npos) << what;
  });
}

TEST_P(TorchDdp, NoSyncAccumulatesLocallyAndTheNextSyncedPassAveragesTheSum) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    tnn::Sequential net = make_mlp(7);
    tnn::Sequential mine = make_mlp(7);   // this rank's micro-batches, locally
    tnn::Sequential other = make_mlp(7);  // the other rank's
    DistributedDataParallel model(net, group);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(step);
      if (step < 2) {
        TorchNoSyncGuard guard = model.no_sync();
        ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
      } else {
        ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
      }
      ::torch::mse_loss(mine->forward(rows_of(x, rank)), rows_of(y, rank)).backward();
      ::torch::mse_loss(other->forward(rows_of(x, 1 - rank)), rows_of(y, 1 - rank)).backward();
      if (step == 0) expect_close(*net, *mine);  // not averaged under no_sync
    }
    const auto p = net->parameters();
    const auto m = mine->parameters();
    const auto o = other->parameters();
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_LE(max_diff(p[i].grad(), (m[i].grad() + o[i].grad()) / kWorld), kTol) << i;
    EXPECT_EQ(model.reducer().iterations(), 1);
  });
}

TEST_P(TorchDdp, ACommHooksResultIsWhatGradHolds) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    tnn::Sequential net = make_mlp(8);
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 1e-4, .first_bucket_mb = 5e-5});
    // The element-wise maximum across ranks instead of the average.
    auto calls = std::make_shared<std::atomic<int>>(0);
    model.register_comm_hook([calls](ddp::GradBucket& bucket) {
      calls->fetch_add(1);
      c10d::Work work = bucket.group->all_reduce(bucket.buffer, {.op = c10d::ReduceOp::kMax});
      Tensor out = bucket.buffer;
      return work.get_future().then(bucket.executor, [out](Future<std::vector<Tensor>> f) {
        f.value();
        return out;
      });
    });
    auto [x, y] = batch(0);
    ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
    EXPECT_EQ(calls->load(), static_cast<int>(model.reducer().bucket_indices().size()));
    tnn::Sequential r0 = make_mlp(8);
    tnn::Sequential r1 = make_mlp(8);
    ::torch::mse_loss(r0->forward(rows_of(x, 0)), rows_of(y, 0)).backward();
    ::torch::mse_loss(r1->forward(rows_of(x, 1)), rows_of(y, 1)).backward();
    const auto p = net->parameters();
    const auto a = r0->parameters();
    const auto b = r1->parameters();
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_LE(max_diff(p[i].grad(), at::maximum(a[i].grad(), b[i].grad())), kTol) << i;
    // Every rank must use the same hook from the start.
    EXPECT_THROW(model.register_comm_hook(ddp::allreduce_hook), InvalidArgument);
  });
}

// params_to_ignore: an ignored parameter is neither broadcast nor reduced (each rank keeps
// its own value and its own gradient) while the others are; a name that is no parameter or
// buffer, and gradient_as_bucket_view, are refused by name.
TEST_P(TorchDdp, IgnoredParametersStayLocalAndBadOptionsAreNamed) {
  run_ranks(GetParam(), [](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) {
    tnn::Sequential net = make_mlp(11 + static_cast<uint64_t>(rank));
    const at::Tensor own_bias = net->named_parameters()["4.bias"].clone();
    const std::string unknown = error_text<InvalidArgument>([&] {
      DistributedDataParallel bad(net.ptr(), group, DdpOptions{.params_to_ignore = {"9.weight"}});
    });
    if (unknown.find("params_to_ignore names '9.weight'") == std::string::npos)
      throw std::runtime_error("unknown name: " + unknown);
    const std::string view = error_text<InvalidArgument>([&] {
      DistributedDataParallel bad(net.ptr(), group, DdpOptions{.gradient_as_bucket_view = true});
    });
    if (view.find("gradient_as_bucket_view") == std::string::npos)
      throw std::runtime_error("bucket view: " + view);

    DistributedDataParallel model(net.ptr(), group, DdpOptions{.params_to_ignore = {"4.bias"}});
    const auto [x, y] = batch(0);
    ::torch::mse_loss(model.forward(rows_of(x, rank)), rows_of(y, rank)).backward();
    // The ignored bias kept this rank's initial value, and its gradient is this rank's alone
    // (the mean residual of its rows): unlike the reduced weights, the ranks' differ.
    if (max_diff(net->named_parameters()["4.bias"], own_bias) != 0)
      throw std::runtime_error("the ignored bias was broadcast");
    // Each gradient as every rank holds it.
    auto everyone = [&](const at::Tensor& grad) {
      std::vector<at::Tensor> out = {at::empty_like(grad), at::empty_like(grad)};
      all_gather(*group, out, grad.contiguous()).wait();
      return max_diff(out[0], out[1]);
    };
    const double bias_gap = everyone(net->named_parameters()["4.bias"].grad());
    const double weight_gap = everyone(net->named_parameters()["4.weight"].grad());
    if (!(bias_gap > 1e-6)) throw std::runtime_error("the ignored bias's gradient was reduced");
    if (weight_gap != 0) throw std::runtime_error("the weights' gradients differ");
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, TorchDdp, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

TEST(TorchDdpOptions, BadOptionsAndNullArgumentsAreRefused) {
  EXPECT_THROW((DdpOptions{.bucket_cap_mb = 0}.validate()), InvalidArgument);
  EXPECT_THROW((DdpOptions{.first_bucket_mb = -1}.validate()), InvalidArgument);
  EXPECT_THROW((DdpOptions{.timeout = -1ms}.validate()), InvalidArgument);
  const std::string what = error_text<InvalidArgument>(
      [] { DistributedDataParallel model(std::shared_ptr<tnn::Module>(), nullptr); });
  EXPECT_NE(what.find("module is null"), std::string::npos) << what;
}

}  // namespace
}  // namespace gradwire::torch

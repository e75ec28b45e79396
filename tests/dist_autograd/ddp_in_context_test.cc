// DDP inside dist_autograd: two ranks (threads), each an rpc agent and a Gloo (or shm) rank,
// train one DistributedDataParallel model whose input comes back from a remote call; a distributed
// backward in a context must leave in the context the gradients averaged over the ranks,
// for every DDP parameter, whatever the DDP options, while non-DDP leaves keep their own
// local gradient and .grad() is never written. Expected values are closed forms worked out
// here in float64 with plain loops (the engine computes none of them).
//
// The model: y_n = W x_n + b (+ v on the ranks that use it), loss = 1/2 sum y^2, with
// x = z * z computed on the other worker (z a local leaf of the sender). So
//   dL/dW = sum_n y_n x_n^T,  dL/db = sum_n y_n,  dL/dv = sum_n y_n (where v is used),
//   dL/dz = 2 z * (Y W)   (elementwise; z is not a DDP parameter: never averaged).
// With unused parameters (find_unused_parameters / static_graph variants), v takes part on
// rank 0 only and a parameter "never" on no rank.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/nn/module.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
namespace da = dist_autograd;

constexpr int kWorld = 2;
constexpr int64_t kRows = 3;
constexpr int64_t kIn = 2;
constexpr int64_t kOut = 3;

const std::vector<double> kW{0.5, -0.3, 0.2, 0.8, -0.6, 0.4};  // kOut x kIn
const std::vector<double> kB{0.1, -0.2, 0.3};
const std::vector<double> kV{0.05, 0.1, -0.15};

class Net : public nn::Module {
 public:
  explicit Net(bool with_never) : Module("Net") {
    w = register_parameter("w", tensor(kW, Shape{kOut, kIn}));
    b = register_parameter("b", tensor(kB));
    v = register_parameter("v", tensor(kV));
    if (with_never) never = register_parameter("never", tensor(std::vector<double>{1.0, 2.0}));
  }
  Tensor forward(const Tensor& x, bool use_v) {
    Tensor y = add(matmul(x, w.t()), b);
    return use_v ? add(y, v) : y;
  }
  Tensor w, b, v, never;
};

// The leaf z of rank `rank`'s step `step`, pass `pass`: no zero, different everywhere.
std::vector<double> z_values(int rank, int step, int pass) {
  std::vector<double> z(kRows * kIn);
  for (int64_t n = 0; n < kRows; ++n)
    for (int64_t k = 0; k < kIn; ++k)
      z[static_cast<size_t>(n * kIn + k)] =
          0.1 * static_cast<double>(1 + n + 2 * k) * (rank == 0 ? 1.0 : -1.7) + 0.05 * step -
          0.03 * pass + 0.011 * static_cast<double>(n * k);
  return z;
}

// One forward's local gradients, in closed form.
struct Local {
  std::vector<double> w, b, v, z;
};

Local closed_form(const std::vector<double>& z, bool use_v) {
  Local g{std::vector<double>(kOut * kIn, 0.0), std::vector<double>(kOut, 0.0),
          std::vector<double>(kOut, 0.0), std::vector<double>(kRows * kIn, 0.0)};
  for (int64_t n = 0; n < kRows; ++n) {
    std::array<double, kIn> x{};
    for (int64_t k = 0; k < kIn; ++k)
      x[k] = z[n * kIn + k] * z[n * kIn + k];
    std::array<double, kOut> y{};
    for (int64_t o = 0; o < kOut; ++o) {
      y[o] = kB[o] + (use_v ? kV[o] : 0.0);
      for (int64_t k = 0; k < kIn; ++k)
        y[o] += kW[o * kIn + k] * x[k];
    }
    for (int64_t o = 0; o < kOut; ++o) {
      g.b[o] += y[o];
      if (use_v) g.v[o] += y[o];
      for (int64_t k = 0; k < kIn; ++k)
        g.w[o * kIn + k] += y[o] * x[k];
    }
    for (int64_t k = 0; k < kIn; ++k) {
      double yw = 0;
      for (int64_t o = 0; o < kOut; ++o)
        yw += y[o] * kW[o * kIn + k];
      g.z[n * kIn + k] = 2.0 * z[n * kIn + k] * yw;
    }
  }
  return g;
}

void add_to(std::vector<double>& acc, const std::vector<double>& x, double scale) {
  for (size_t i = 0; i < acc.size(); ++i)
    acc[i] += scale * x[i];
}

void expect_values(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  Tensor c = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(c.data<double>()[i], want[i], 1e-12) << what << " element " << i;
}

enum class Passes {
  kOne,             // forward, backward
  kNoSyncThenSync,  // forward+backward under no_sync, then forward+backward, one context
  kRetainTwice,     // forward, backward twice over the retained graph
};

struct Variant {
  std::string name;
  ddp::DdpOptions options;
  bool v_on_rank0_only;  // and a parameter "never" that no rank uses
  Passes passes;
  bool float64_hook;  // a comm hook returning a fresh tensor
  // Over the shared-memory group: the default hook's passes then skip the buckets and
  // average the tensors where they lie (the sink's gradients included).
  bool shm = false;
};

// What the context of rank `rank`'s step `step` must hold.
struct Expected {
  std::vector<double> w, b, v;
  bool v_present;
  std::vector<std::vector<double>> z;  // per forward of this rank
};

Expected expected_for(const Variant& variant, int rank, int step) {
  const int forwards = variant.passes == Passes::kNoSyncThenSync ? 2 : 1;
  const double repeat = variant.passes == Passes::kRetainTwice ? 2.0 : 1.0;
  Expected e{std::vector<double>(kOut * kIn, 0.0),
             std::vector<double>(kOut, 0.0),
             std::vector<double>(kOut, 0.0),
             false,
             {}};
  for (int r = 0; r < kWorld; ++r) {
    const bool use_v = !variant.v_on_rank0_only || r == 0;
    for (int p = 0; p < forwards; ++p) {
      Local g = closed_form(z_values(r, step, p), use_v);
      add_to(e.w, g.w, repeat / kWorld);
      add_to(e.b, g.b, repeat / kWorld);
      add_to(e.v, g.v, repeat / kWorld);
      if (r == rank) {
        std::vector<double> gz(g.z.size(), 0.0);
        add_to(gz, g.z, repeat);
        e.z.push_back(gz);
      }
    }
  }
  e.v_present = true;  // v is used on rank 0 in every variant: averaged on both ranks
  return e;
}

Future<Tensor> float64_hook(ddp::GradBucket& bucket) {
  Tensor wide = bucket.buffer.to(kFloat64).clone();
  c10d::Work work = bucket.group->all_reduce(wide);
  const double divisor = bucket.divisor;
  return work.get_future().then(bucket.executor,
                                [wide, divisor](Future<std::vector<Tensor>> done) mutable {
                                  done.value();
                                  autograd::NoGradGuard no_grad;
                                  return div(wide, Scalar(divisor));  // a fresh tensor
                                });
}

void run_variant(const Variant& variant) {
  rpc::Registry reg;
  reg.def("square", [](const Tensor& x) { return mul(x, x); });
  test::Agents agents = test::start_agents(kWorld, test::agent_options(reg));
  auto store = std::make_shared<c10d::HashStore>(20s);
  auto results = test::run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        rpc::RpcAgent& agent = *agents[static_cast<size_t>(rank)];
        const std::string peer = test::worker_name(1 - rank);
        const c10d::ProcessGroupOptions options{.timeout = 20s, .name = "ddp-in-context"};
        std::shared_ptr<c10d::ProcessGroup> group;
        if (variant.shm) {
          group = c10d::ProcessGroupShm::create(store, rank, kWorld, options,
                                                {.gloo = {.host = "127.0.0.1"}});
        } else {
          group =
              c10d::ProcessGroupGloo::create(store, rank, kWorld, options, {.host = "127.0.0.1"});
        }
        auto net = std::make_shared<Net>(variant.v_on_rank0_only);
        ddp::DistributedDataParallel model(net, group, variant.options);
        if (variant.float64_hook) model.register_comm_hook(float64_hook);
        const bool use_v = !variant.v_on_rank0_only || rank == 0;
        for (int step = 0; step < 3; ++step) {
          da::Context ctx(agent);
          std::vector<Tensor> zs;
          auto forward_backward = [&](int pass, bool retain) {
            Tensor z = tensor(z_values(rank, step, pass), Shape{kRows, kIn});
            z.set_requires_grad(true);
            zs.push_back(z);
            Tensor x = agent.rpc_sync<Tensor>(peer, "square", z);
            auto outs = model.forward_with(
                [&](nn::Module&) { return std::vector<Tensor>{net->forward(x, use_v)}; });
            Tensor loss = mul(sum(mul(outs[0], outs[0])), 0.5);
            da::backward(agent, ctx.id(), {loss}, retain);
            if (variant.passes == Passes::kRetainTwice) da::backward(agent, ctx.id(), {loss});
          };
          if (variant.passes == Passes::kNoSyncThenSync) {
            {
              auto guard = model.no_sync();
              forward_backward(0, false);
            }
            forward_backward(1, false);
          } else {
            forward_backward(0, variant.passes == Passes::kRetainTwice);
          }
          const Expected e = expected_for(variant, rank, step);
          const da::Gradients grads = da::get_gradients(agent, ctx.id());
          const std::string at =
              variant.name + ", rank " + std::to_string(rank) + ", step " + std::to_string(step);
          expect_values(grads.at(net->w), e.w, "w (" + at + ")");
          expect_values(grads.at(net->b), e.b, "b (" + at + ")");
          ASSERT_TRUE(grads.contains(net->v)) << at;
          expect_values(grads.at(net->v), e.v, "v (" + at + ")");
          if (net->never.defined()) {
            EXPECT_FALSE(grads.contains(net->never)) << "no rank used it (" << at << ")";
          }
          ASSERT_EQ(zs.size(), e.z.size());
          for (size_t i = 0; i < zs.size(); ++i)
            expect_values(grads.at(zs[i]), e.z[i], "z (local, " + at + ")");
          for (const Tensor& p : net->parameters())
            EXPECT_FALSE(p.grad().defined()) << "DDP wrote .grad() under a context (" << at << ")";
        }
      },
      60s);
  test::shutdown_agents(agents);
  EXPECT_ALL_RANKS_OK(results) << variant.name;
}

class DdpInContext : public ::testing::TestWithParam<Variant> {};

TEST_P(DdpInContext, TheContextHoldsTheAveragedGradientsOfEveryParameter) {
  run_variant(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Options, DdpInContext,
    ::testing::Values(
        Variant{"defaults", {}, false, Passes::kOne, false},
        Variant{"bucket_view", {.gradient_as_bucket_view = true}, false, Passes::kOne, false},
        Variant{"find_unused", {.find_unused_parameters = true}, true, Passes::kOne, false},
        Variant{"find_unused_bucket_view",
                {.find_unused_parameters = true, .gradient_as_bucket_view = true},
                true,
                Passes::kOne,
                false},
        Variant{"static_graph", {.static_graph = true}, true, Passes::kOne, false},
        Variant{"static_graph_bucket_view",
                {.static_graph = true, .gradient_as_bucket_view = true},
                true,
                Passes::kOne,
                false},
        Variant{"no_sync_then_sync", {}, false, Passes::kNoSyncThenSync, false},
        Variant{"no_sync_then_sync_find_unused_bucket_view",
                {.find_unused_parameters = true, .gradient_as_bucket_view = true},
                true,
                Passes::kNoSyncThenSync,
                false},
        Variant{"retain_graph_two_passes", {}, false, Passes::kRetainTwice, false},
        Variant{"retain_graph_two_passes_find_unused_bucket_view",
                {.find_unused_parameters = true, .gradient_as_bucket_view = true},
                true,
                Passes::kRetainTwice,
                false},
        Variant{"comm_hook", {}, false, Passes::kOne, true},
        Variant{
            "comm_hook_find_unused", {.find_unused_parameters = true}, true, Passes::kOne, true},
        Variant{"defaults_shm", {}, false, Passes::kOne, false, true},
        Variant{
            "find_unused_shm", {.find_unused_parameters = true}, true, Passes::kOne, false, true},
        Variant{"static_graph_shm", {.static_graph = true}, true, Passes::kOne, false, true},
        Variant{"no_sync_then_sync_find_unused_shm",
                {.find_unused_parameters = true},
                true,
                Passes::kNoSyncThenSync,
                false,
                true},
        Variant{"retain_graph_two_passes_find_unused_shm",
                {.find_unused_parameters = true},
                true,
                Passes::kRetainTwice,
                false,
                true}),
    [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace
}  // namespace gradwire

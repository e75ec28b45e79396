// A context's gradients with many leaves: one pass over 20,000 leaves accumulates each
// leaf's gradient into the context, and each is then looked up. Both go by the leaf's
// identity (a hash), so the whole costs about as much as the backward pass itself (a scan
// per leaf was quadratic). The gradients are checked against the closed form
// d/dx_i sum_i c_i x_i^2 = 2 c_i x_i; the time taken is printed, not asserted (timings
// belong to gradwire-bench).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"

namespace gradwire {
namespace {

namespace da = dist_autograd;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(DistAutogradCost, TwentyThousandLeavesAccumulateAndAreLookedUpByIdentity) {
  constexpr int64_t kLeaves = 20000;
  rpc::Registry reg;
  test::Agents agents = test::start_agents(1, test::agent_options(reg));
  rpc::RpcAgent& agent = *agents[0];
  {
    std::vector<Tensor> leaves;
    leaves.reserve(kLeaves);
    for (int64_t i = 0; i < kLeaves; ++i) {
      Tensor x = full({1}, Scalar(0.001 * static_cast<double>(i % 997) - 0.4), kFloat64);
      x.set_requires_grad(true);
      leaves.push_back(x);
    }
    std::vector<double> c(kLeaves);
    for (int64_t i = 0; i < kLeaves; ++i)
      c[static_cast<size_t>(i)] = 1.0 + static_cast<double>(i % 13);
    const Tensor weights = tensor(c);

    da::Context ctx(agent);
    const Tensor all = cat(leaves);
    const Tensor loss = sum(mul(mul(all, all), weights));
    const auto backward_start = Clock::now();
    da::backward(agent, ctx.id(), {loss});
    const double backward_s = seconds_since(backward_start);

    const auto lookup_start = Clock::now();
    const da::Gradients grads = da::get_gradients(agent, ctx.id());
    ASSERT_EQ(grads.size(), static_cast<size_t>(kLeaves));
    double worst = 0;
    for (int64_t i = 0; i < kLeaves; ++i) {
      const Tensor& x = leaves[static_cast<size_t>(i)];
      const double want = 2.0 * c[static_cast<size_t>(i)] * x.item<double>();
      const double got = grads.at(x).item<double>();
      worst = std::max(worst, std::abs(got - want));
    }
    const double lookup_s = seconds_since(lookup_start);
    EXPECT_LT(worst, 1e-12);
    std::printf("backward %.3f s, get_gradients and lookups %.3f s\n", backward_s, lookup_s);
  }
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire

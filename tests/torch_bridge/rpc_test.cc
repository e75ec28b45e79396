// torch tensors through rpc (ValueConverter<at::Tensor>): as arguments and results, inside
// containers, with requires_grad, in RRefs, next to gradwire tensors on the other side,
// between two agents in one process and between two processes; the receiver's torch tensor
// is the received memory itself; refusals name what and where.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/torch/value_convert.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "torch_bridge/torch_test_util.h"

namespace gradwire::torch {
namespace {

using namespace std::chrono_literals;
using test::error_text;
using test_util::iota;
using test_util::values;

at::TensorOptions of(c10::ScalarType type) {
  return at::TensorOptions().dtype(type);
}

// What the peers serve: torch functions, and gradwire ones for the mixed cases.
void define(rpc::Registry& reg) {
  reg.def("scale", [](const at::Tensor& x, double k) { return x * k; });
  reg.def("describe", [](const at::Tensor& x) {
    return std::string(c10::toString(x.scalar_type())) + " " + std::to_string(x.dim()) + "d " +
           (x.is_contiguous() ? "contiguous" : "strided");
  });
  reg.def("sum_all", [](const std::vector<at::Tensor>& xs) {
    at::Tensor total = at::zeros({}, of(at::kDouble));
    for (const at::Tensor& x : xs)
      total += x.sum().to(at::kDouble);
    return total;
  });
  reg.def("split", [](const at::Tensor& x) {
    return std::make_tuple(x.narrow(0, 0, 1), x.size(0), x.narrow(0, 1, x.size(0) - 1));
  });
  reg.def("keys_times", [](const std::map<std::string, at::Tensor>& m) {
    std::map<std::string, at::Tensor> out;
    for (const auto& [k, v] : m)
      out[k + "2"] = v * 2;
    return out;
  });
  reg.def("maybe_neg", [](const std::optional<at::Tensor>& x) -> std::optional<at::Tensor> {
    if (!x) return std::nullopt;
    return -*x;
  });
  reg.def("grad_state",
          [](const at::Tensor& x) { return std::make_tuple(x.requires_grad(), x.is_leaf()); });
  // The sum of x * x, kept differentiable: its result requires grad.
  reg.def("square", [](const at::Tensor& x) { return x * x; });
  reg.def("make", [](int64_t n) { return at::arange(n, of(at::kFloat)) + 1; });
  // The gradwire tensor received and the torch tensor the converter makes of it: the same
  // memory (the converter adds no copy).
  reg.def("same_memory", [](const rpc::Value& v) {
    const at::Tensor t = rpc::from_value<at::Tensor>(v, "argument 1");
    return v.as_tensor().data_ptr() == t.data_ptr() &&
           v.as_tensor().storage().data() == t.storage().data();
  });
  reg.def("gw_add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  reg.def("gw_make", [](int64_t n) { return arange(0, n, 1, kInt64); });
}

class TorchRpc : public ::testing::Test {
 protected:
  void SetUp() override {
    define(reg_);
    agents_ = test::start_agents(2, test::agent_options(reg_));
  }
  void TearDown() override { test::shutdown_agents(agents_); }
  rpc::RpcAgent& w0() { return *agents_[0]; }

  rpc::Registry reg_;
  test::Agents agents_;
};

TEST_F(TorchRpc, TensorsOfEveryDtypeAreArgumentsAndResults) {
  for (c10::ScalarType type :
       {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kByte}) {
    SCOPED_TRACE(c10::toString(type));
    const at::Tensor x = at::arange(6, of(type)).reshape({2, 3});
    const at::Tensor y = w0().rpc_sync<at::Tensor>("w1", "scale", x, 2.0);
    // Torch's promotion: an integer tensor times a double gives float32.
    EXPECT_EQ(y.scalar_type(), at::isIntegralType(type, false) ? at::kFloat : type);
    EXPECT_EQ(y.sizes(), (c10::IntArrayRef{2, 3}));
    EXPECT_EQ(values(y), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  }
  const at::Tensor flags = at::tensor({1, 0, 1}).to(at::kBool);
  EXPECT_EQ(w0().rpc_sync<std::string>("w1", "describe", flags), "Bool 1d contiguous");
}

TEST_F(TorchRpc, ViewsTravelAsTheirElements) {
  const at::Tensor base = at::arange(24, of(at::kDouble)).reshape({4, 6});
  const at::Tensor view = base.t().slice(0, 1, 6, 2);  // 3x4, strided, offset 1
  const at::Tensor back = w0().rpc_sync<at::Tensor>("w1", "scale", view, 1.0);
  EXPECT_EQ(back.sizes(), (c10::IntArrayRef{3, 4}));
  EXPECT_EQ(values(back), values(view));
  EXPECT_EQ(w0().rpc_sync<std::string>("w1", "describe", view), "Double 2d contiguous");
  const at::Tensor expanded = at::arange(3, of(at::kFloat)).unsqueeze(0).expand({5, 3});
  EXPECT_EQ(values(w0().rpc_sync<at::Tensor>("w1", "scale", expanded, 1.0)),
            values(expanded.contiguous()));
}

TEST_F(TorchRpc, ContainersOfTorchTensorsTravel) {
  const std::vector<at::Tensor> list = {at::ones({3}, of(at::kFloat)), at::arange(4, of(at::kLong)),
                                        at::full({2, 2}, 0.5, of(at::kDouble))};
  // 3 + (0+1+2+3) + 4 * 0.5
  EXPECT_EQ(w0().rpc_sync<at::Tensor>("w1", "sum_all", list).item<double>(), 11.0);

  const auto [head, n, tail] = w0().rpc_sync<std::tuple<at::Tensor, int64_t, at::Tensor>>(
      "w1", "split", at::arange(5, of(at::kInt)));
  EXPECT_EQ(values(head), (std::vector<double>{0}));
  EXPECT_EQ(n, 5);
  EXPECT_EQ(values(tail), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(tail.scalar_type(), at::kInt);

  const std::map<std::string, at::Tensor> in = {{"a", at::ones({2}, of(at::kFloat))},
                                                {"b", at::arange(3, of(at::kDouble))}};
  const auto out = w0().rpc_sync<std::map<std::string, at::Tensor>>("w1", "keys_times", in);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(values(out.at("a2")), (std::vector<double>{2, 2}));
  EXPECT_EQ(values(out.at("b2")), (std::vector<double>{0, 2, 4}));

  using Maybe = std::optional<at::Tensor>;
  EXPECT_FALSE(w0().rpc_sync<Maybe>("w1", "maybe_neg", Maybe()).has_value());
  const Maybe neg = w0().rpc_sync<Maybe>("w1", "maybe_neg", Maybe(at::ones({2})));
  ASSERT_TRUE(neg.has_value());
  EXPECT_EQ(values(*neg), (std::vector<double>{-1, -1}));
}

TEST_F(TorchRpc, RequiresGradArrivesAsAFreshLeafBothWays) {
  const at::Tensor x = at::arange(3, of(at::kDouble)).requires_grad_(true);
  EXPECT_EQ((w0().rpc_sync<std::tuple<bool, bool>>("w1", "grad_state", x)),
            std::make_tuple(true, true));
  EXPECT_EQ((w0().rpc_sync<std::tuple<bool, bool>>("w1", "grad_state", x.detach())),
            std::make_tuple(false, true));
  // x * x has history on w1; it comes back as a leaf of its own that requires grad.
  at::Tensor y = w0().rpc_sync<at::Tensor>("w1", "square", x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_EQ(values(y), (std::vector<double>{0, 1, 4}));
  (y * 3).sum().backward();
  EXPECT_EQ(values(y.grad()), (std::vector<double>{3, 3, 3}));
  EXPECT_FALSE(x.grad().defined());  // nothing recorded across the call
}

TEST_F(TorchRpc, TheReceivedTorchTensorIsTheReceivedMemory) {
  EXPECT_TRUE(w0().rpc_sync<bool>("w1", "same_memory", at::arange(1 << 16, of(at::kFloat))));
  EXPECT_TRUE(w0().rpc_sync<bool>("w1", "same_memory", at::ones({3}, of(at::kLong))));
}

TEST_F(TorchRpc, TorchAndGradwireTensorsMeetInOneCall) {
  // A gradwire function called with torch tensors, its result read as a torch tensor.
  const at::Tensor sum =
      w0().rpc_sync<at::Tensor>("w1", "gw_add", at::ones({2, 2}), at::full({2, 2}, 2.0));
  EXPECT_EQ(values(sum), std::vector<double>(4, 3.0));
  EXPECT_EQ(w0().rpc_sync<at::Tensor>("w1", "gw_make", int64_t{4}).scalar_type(), at::kLong);
  // A torch function called with gradwire tensors, its result read as a gradwire tensor.
  const Tensor scaled = w0().rpc_sync<Tensor>("w1", "scale", arange(0, 3, 1, kFloat32), 3.0);
  EXPECT_EQ(scaled.dtype(), kFloat32);
  EXPECT_EQ(values(scaled), (std::vector<double>{0, 3, 6}));
}

TEST_F(TorchRpc, RRefsHoldTorchTensors) {
  const rref::RRef<at::Tensor> remote_value = rref::remote<at::Tensor>(w0(), "w1", "make", 4);
  EXPECT_EQ(values(remote_value.to_here()), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(remote_value.owner().name, "w1");
  // The same value read as a gradwire tensor: both are "Tensor" on the wire.
  const rref::RRef<Tensor> as_gradwire = rref::remote<Tensor>(w0(), "w1", "make", 2);
  EXPECT_EQ(values(as_gradwire.to_here()), (std::vector<double>{1, 2}));
  const rref::RRef<at::Tensor> local = rref::remote<at::Tensor>(w0(), "w0", "make", 3);
  EXPECT_EQ(values(*local.local_value()), (std::vector<double>{1, 2, 3}));
}

TEST_F(TorchRpc, RefusalsNameWhatAndWhere) {
  const at::Tensor int8 = at::zeros({2}, of(at::kChar));
  std::string what =
      error_text<InvalidArgument>([&] { w0().rpc_sync<at::Tensor>("w1", "scale", int8, 1.0); });
  EXPECT_NE(what.find("torch.int8"), std::string::npos) << what;
  what = error_text<InvalidArgument>(
      [&] { w0().rpc_sync<at::Tensor>("w1", "scale", at::Tensor(), 1.0); });
  EXPECT_NE(what.find("undefined torch tensor"), std::string::npos) << what;
  // A string where w1's function takes a tensor: w1 refuses the call naming the argument,
  // the signature and the types.
  what = error_text<InvalidArgument>(
      [&] { w0().rpc_sync<at::Tensor>("w1", "scale", std::string("x"), 1.0); });
  EXPECT_NE(what.find("refused call 'scale'"), std::string::npos) << what;
  EXPECT_NE(what.find("argument 1 of scale(Tensor, double) -> Tensor: expected Tensor, got string"),
            std::string::npos)
      << what;
  // A result that is not a tensor, read as one.
  what = error_text<InvalidArgument>(
      [&] { w0().rpc_sync<at::Tensor>("w1", "describe", at::ones({1})); });
  EXPECT_NE(what.find("Tensor"), std::string::npos) << what;
  EXPECT_NE(what.find("string"), std::string::npos) << what;
}

// Two processes: torch tensors as arguments, results and in containers, and requires_grad.
TEST(TorchRpcProcesses, TwoProcessesExchangeTorchTensors) {
  rpc::Registry reg;
  define(reg);
  const test::RankResults results = test::run_agent_processes(
      "torch-rpc", 2, test::agent_options(reg),
      [](int rank, c10d::Store& store, rpc::RpcAgent& agent) {
        const std::string peer = test::worker_name(1 - rank);
        const at::Tensor x = at::arange(1 << 12, of(at::kFloat)) + rank;
        const at::Tensor y = agent.rpc_sync<at::Tensor>(peer, "scale", x, 0.5);
        EXPECT_EQ(values(y), values(x * 0.5));
        const std::vector<at::Tensor> list = {at::ones({2, 3}), at::arange(3, of(at::kLong))};
        EXPECT_EQ(agent.rpc_sync<at::Tensor>(peer, "sum_all", list).item<double>(), 9.0);
        at::Tensor sq =
            agent.rpc_sync<at::Tensor>(peer, "square", at::ones({2}).requires_grad_(true));
        EXPECT_TRUE(sq.requires_grad());
        EXPECT_TRUE(agent.rpc_sync<bool>(peer, "same_memory", at::arange(1 << 16)));
        const auto r = rref::remote<at::Tensor>(agent, peer, "make", 3);
        EXPECT_EQ(values(r.to_here()), iota(3, 1));
        c10d::barrier(store, "torch-rpc-done", 2, 20s);
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire::torch

// The TensorPipe agent (RpcAgent) and the tensors it carries: dtypes, shapes and strided,
// broadcast and empty tensors arrive as sent; large ones are lent and copied straight from
// the sender (between threads of one process and between processes); smaller ones between
// local peers go through the shared-memory rings; CUDA tensors land on the mapped device.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "agent_fixture.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/harness.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;

TEST(RpcAgent, TensorsKeepDtypeShapeAndValuesIncludingStridedAndEmpty) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, test_options(reg));
  RpcAgent& w0 = *agents[0];
  // A transposed (non-contiguous) view travels as its logical contents.
  Tensor m = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor back = w0.rpc_sync<Tensor>("w1", "echo", m.transpose(0, 1));
  EXPECT_EQ(back.sizes(), (Shape{3, 2}));
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor ints = tensor<int64_t>({-7, 1LL << 40}, {2, 1});
  Tensor ints_back = w0.rpc_sync<Tensor>("w1", "echo", ints);
  EXPECT_EQ(ints_back.dtype(), kInt64);
  EXPECT_EQ(ints_back.sizes(), (Shape{2, 1}));
  EXPECT_EQ(ints_back.to_vector<int64_t>(), (std::vector<int64_t>{-7, 1LL << 40}));
  Tensor none = zeros({0, 4});
  Tensor none_back = w0.rpc_sync<Tensor>("w1", "echo", none);
  EXPECT_EQ(none_back.sizes(), (Shape{0, 4}));
  // 4 MiB: the bytes arrive intact (sum of 0..n-1 computed here).
  const int64_t n = 1 << 20;
  Tensor big = arange(0, n, 1, kFloat64);
  Tensor big_back = w0.rpc_sync<Tensor>("w1", "echo", big);
  EXPECT_DOUBLE_EQ(sum(big_back).item<double>(), static_cast<double>(n) * (n - 1) / 2);
  expect_clean_shutdown(agents);
}

// A broadcast view (the gradient of a sum is one) travels as its compact data and arrives as
// the full, contiguous tensor: here 1 MiB of float32 that is one number, and a row repeated.
TEST(RpcAgent, BroadcastTensorsTravelCompactAndArriveWhole) {
  Registry reg;
  register_basics(reg);
  // What arrived: its sum, and whether it is a whole contiguous tensor of that shape.
  reg.def("arrived", [](const Tensor& t) {
    return std::vector<double>{sum(t).item<double>(), t.is_contiguous() ? 1.0 : 0.0,
                               static_cast<double>(t.numel())};
  });
  AgentOptions options = lending_options(reg);
  options.direct_copy_min_bytes = 256u << 10;
  Agents agents = start_agents(2, options);
  RpcAgent& w0 = *agents[0];
  const AgentMetrics before = w0.metrics();
  Tensor filled = full({}, Scalar(2.5), kFloat32).expand({512, 512});
  EXPECT_EQ(w0.rpc_sync<std::vector<double>>("w1", "arrived", filled),
            (std::vector<double>{2.5 * 512 * 512, 1.0, 512.0 * 512}));
  Tensor row = tensor<double>({1, 2, 3}, {1, 3}).expand({4, 3});
  Tensor rows = w0.rpc_sync<Tensor>("w1", "echo", row);
  EXPECT_EQ(rows.sizes(), (Shape{4, 3}));
  EXPECT_EQ(rows.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
  // The 1 MiB one was not lent: four bytes travelled. A whole tensor of that size is.
  EXPECT_EQ(w0.metrics().tensors_lent, before.tensors_lent);
  EXPECT_EQ(w0.rpc_sync<std::vector<double>>("w1", "arrived", filled.contiguous()),
            (std::vector<double>{2.5 * 512 * 512, 1.0, 512.0 * 512}));
  EXPECT_EQ(w0.metrics().tensors_lent, before.tensors_lent + 1);
  // A lent reply of 512 KiB (copied where it arrives) and one of 2 MiB (copied on the pool).
  for (int64_t n : {int64_t{128} << 10, int64_t{512} << 10}) {
    const uint64_t copied = w0.metrics().tensors_copied_in;
    Tensor big = w0.rpc_sync<Tensor>("w1", "echo", arange(0, n, 1, kFloat32));
    EXPECT_EQ(w0.metrics().tensors_copied_in, copied + 1) << n;
    EXPECT_DOUBLE_EQ(sum(big.to(kFloat64)).item<double>(), static_cast<double>(n) * (n - 1) / 2);
  }
  expect_clean_shutdown(agents);
}

// x[i] == i + offset exactly (float32 holds every integer below 2^24).
bool holds_arange(const Tensor& t, int64_t n, float scale, float offset) {
  if (t.dtype() != kFloat32 || t.sizes() != Shape{n}) return false;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != scale * static_cast<float>(i) + offset) return false;
  }
  return true;
}

// Large tensors between two agents that can read each other's memory are lent: the receiver
// copies them straight out of the sender (arguments and results alike), every loan is
// released, and the values arrive intact, including sizes that do not split evenly into
// copy pieces and several lent tensors in one message.
TEST(RpcAgent, LargeTensorsAreLentAndCopiedStraightFromTheSender) {
  Registry reg;
  register_basics(reg);
  Agents agents = start_agents(2, lending_options(reg));
  const int64_t n = 1'000'003;  // ~4 MB: several copy pieces, the last one short
  const Tensor a = arange(n, TensorOptions{kFloat32});
  const Tensor b = add(arange(n, TensorOptions{kFloat32}), 1.0);
  const Tensor sum = agents[0]->rpc_sync<Tensor>("w1", "add", a, b);
  EXPECT_TRUE(holds_arange(sum, n, 2.0f, 1.0f));
  // Below the threshold: sent through TensorPipe, not lent.
  const Tensor small = arange(1000, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", small), 1000, 1.0f, 0.0f));
  const AgentMetrics caller = agents[0]->metrics();
  EXPECT_EQ(caller.tensors_lent, 2u);  // a and b
  EXPECT_EQ(caller.bytes_lent, 2u * 4u * static_cast<uint64_t>(n));
  EXPECT_EQ(caller.tensors_copied_in, 1u);  // the result
  // The callee released a and b before it ran "add", so before its reply came.
  EXPECT_EQ(caller.loans_outstanding, 0);
  expect_clean_shutdown(agents);
  // Graceful shutdown waits for loans: the caller has released the result by now.
  EXPECT_EQ(agents[1]->metrics().loans_outstanding, 0);
  EXPECT_EQ(agents[1]->metrics().tensors_lent, 1u);
  EXPECT_EQ(agents[1]->metrics().tensors_copied_in, 2u);
}

// Tensors below direct_copy_min_bytes between workers that talk over the local transport go
// through its shared-memory rings (the "ring" channel), in both directions: one smaller than
// a ring (1 MiB) and one four times its size (written as the reader drains it). Without "ring"
// among the channels they take another one and arrive the same. (xth is left out: these agents
// share a process, and xth would carry everything.)
TEST(RpcAgent, TensorsBetweenLocalPeersGoThroughTheRings) {
  Registry reg;
  register_basics(reg);
  const int64_t small = 48 << 10;  // 192 KiB
  const int64_t large = 1 << 20;   // 4 MiB
  for (const bool ring : {true, false}) {
    AgentOptions o = test_options(reg);
    o.channels = ring ? std::vector<std::string>{"ring", "cma", "basic"}
                      : std::vector<std::string>{"cma", "basic"};
    o.direct_copy_min_bytes = 8u << 20;
    Agents agents = start_agents(2, o);
    const bool local = agents[0]->transport_to("w1") == "local";
    for (const int64_t n : {small, large}) {
      EXPECT_TRUE(holds_arange(
          agents[0]->rpc_sync<Tensor>("w1", "echo", arange(n, TensorOptions{kFloat32})), n, 1.0f,
          0.0f))
          << n << " floats, ring " << ring;
    }
    const uint64_t tensors = ring && local ? 2u : 0u;
    const uint64_t bytes = ring && local ? 4u * static_cast<uint64_t>(small + large) : 0u;
    for (const auto& agent : agents) {
      const AgentMetrics m = agent->metrics();
      EXPECT_EQ(m.tensors_through_rings, tensors) << agent->worker_info().name;
      EXPECT_EQ(m.bytes_through_rings, bytes) << agent->worker_info().name;
      EXPECT_EQ(m.tensors_lent, 0u);
    }
    expect_clean_shutdown(agents);
  }
}

// By default a tensor of exactly 1 MiB (512x512 float32) is not lent: between local peers it
// goes through the rings, where copying it costs less than setting up a loan
// (docs/perf-notes/2026-11-rings-1mib-not-lent.md). One element more and it is lent. Either way it
// arrives intact, in both directions.
TEST(RpcAgent, ByDefaultOnlyTensorsLargerThanOneMebibyteAreLent) {
  Registry reg;
  register_basics(reg);
  AgentOptions o = lending_options(reg);
  EXPECT_EQ(o.direct_copy_min_bytes, (size_t{1} << 20) + 1);
  o.channels = {"ring", "cma", "basic"};  // not xth: these agents share a process
  Agents agents = start_agents(2, o);
  const bool local = agents[0]->transport_to("w1") == "local";
  const int64_t mib = int64_t{1} << 18;  // float32 elements in 1 MiB
  const Tensor exact = arange(mib, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", exact), mib, 1.0f, 0.0f));
  for (const auto& agent : agents) {
    const AgentMetrics m = agent->metrics();
    EXPECT_EQ(m.tensors_lent, 0u) << agent->worker_info().name;
    EXPECT_EQ(m.tensors_through_rings, local ? 1u : 0u) << agent->worker_info().name;
  }
  const Tensor larger = arange(mib + 1, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", larger), mib + 1, 1.0f, 0.0f));
  EXPECT_EQ(agents[0]->metrics().tensors_lent, 1u);  // the argument
  EXPECT_EQ(agents[1]->metrics().tensors_lent, 1u);  // the echoed result
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, DirectCopiesCanBeTurnedOffOrRaisedAboveATensor) {
  Registry reg;
  register_basics(reg);
  const int64_t n = 300'000;  // 1.2 MB
  const Tensor a = arange(n, TensorOptions{kFloat32});
  for (int variant = 0; variant < 2; ++variant) {
    AgentOptions o = test_options(reg);
    if (variant == 0) {
      o.direct_copy_threads = 0;
    } else {
      o.direct_copy_min_bytes = 8u << 20;
    }
    Agents agents = start_agents(2, o);
    EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", a), n, 1.0f, 0.0f));
    EXPECT_EQ(agents[0]->metrics().tensors_lent, 0u);
    EXPECT_EQ(agents[1]->metrics().tensors_lent, 0u);
    expect_clean_shutdown(agents);
  }
  AgentOptions bad = test_options(reg);
  bad.direct_copy_threads = 65;
  EXPECT_NE(error_text<InvalidArgument>([&] {
              start_agents(1, bad);
            }).find("direct_copy_threads must be in [0, 64], got 65"),
            std::string::npos);
}

// Between processes: the sender's memory is another address space, read with
// process_vm_readv; the peer's result comes back the same way.
TEST(RpcAgent, LargeTensorsAreLentBetweenProcesses) {
  Registry reg;
  register_basics(reg);
  test::RankResults results = run_two_worker_processes(
      "lend", reg,
      [](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          const int64_t n = 2'000'001;
          const Tensor a = arange(n, TensorOptions{kFloat32});
          for (int i = 0; i < 3; ++i) {
            const Tensor r = agent.rpc_sync<Tensor>("w1", "scale", a, 3.0);
            EXPECT_TRUE(holds_arange(r, n, 3.0f, 0.0f));
          }
          const AgentMetrics m = agent.metrics();
          EXPECT_EQ(m.tensors_lent, 3u);
          EXPECT_EQ(m.tensors_copied_in, 3u);
          EXPECT_EQ(m.bytes_copied_in, 3u * 4u * static_cast<uint64_t>(n));
        }
        agent.shutdown();
        EXPECT_EQ(agent.metrics().loans_outstanding, 0);
      },
      lending_options);
  EXPECT_PRED_FORMAT1(test::AllRanksOk, results);
}

TEST(RpcAgent, OverTcpAloneNothingIsLentAndLargeTensorsStillArrive) {
  Registry reg;
  register_basics(reg);
  AgentOptions o = test_options(reg);
  o.transports = {"tcp"};
  Agents agents = start_agents(2, o);
  const int64_t n = 1'000'003;
  const Tensor a = arange(n, TensorOptions{kFloat32});
  EXPECT_TRUE(holds_arange(agents[0]->rpc_sync<Tensor>("w1", "echo", a), n, 1.0f, 0.0f));
  for (auto& agent : agents) {
    EXPECT_EQ(agent->metrics().tensors_lent, 0u) << agent->worker_info().name;
    EXPECT_EQ(agent->metrics().tensors_copied_in, 0u) << agent->worker_info().name;
  }
  expect_clean_shutdown(agents);
}

TEST(RpcAgent, CudaTensorsLandOnTheMappedDevice) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Registry reg;
  reg.def("where", [](const Tensor& t) { return t.device().str(); });
  reg.def("echo", [](const Tensor& t) { return t; });
  AgentOptions options = test_options(reg);
  options.device_maps["w1"] = {{Device::cuda(0), Device::cuda(0)}};
  Agents agents = start_agents(2, options);
  Tensor x = tensor<float>({1, 2, 3}, {3}).to(Device::cuda(0));
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w1", "where", x), "cuda:0");
  Tensor back = agents[0]->rpc_sync<Tensor>("w1", "echo", x);
  EXPECT_TRUE(back.is_cuda());
  EXPECT_EQ(back.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  // w1 has no map back to w0 for its own sends.
  const std::string unmapped =
      error_text<InvalidArgument>([&] { agents[1]->rpc_sync<std::string>("w0", "where", x); });
  EXPECT_NE(unmapped.find("has no entry for cuda:0"), std::string::npos) << unmapped;
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc

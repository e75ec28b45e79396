// rpc/ registry figure: what the registry adds to a call before and after the function
// runs — the lookup, converting the arguments from Values and the result to one, and
// wrapping it in a future — with no agent and no wire.
//   rpc.registry_invoke_ns  ns per call of a found entry's invoke() on "add" of two
//                           2-element float32 tensors (the agent's path: one find() per
//                           request, then invoke); baseline: calling the same lambda with
//                           the same tensors directly (params.direct_ns); params.by_name_ns
//                           is Registry::invoke by name (find and invoke in one)
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "bench.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::bench {
namespace {

constexpr int kCalls = 20000;  // per timed round
constexpr int kRounds = 7;

const Register registry_bench({"rpc.registry_invoke_ns"}, [](const auto& emit) {
  const auto fn = [](const Tensor& a, const Tensor& b) { return add(a, b); };
  rpc::Registry reg;
  reg.def("add", fn);
  // A synchronous function never touches the executor; it is there because invoke takes one.
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "bench"});
  const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
  const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
  const std::vector<rpc::Value> args{rpc::Value(a), rpc::Value(b)};
  const rpc::CallContext ctx;
  int64_t sink = 0;  // keeps the calls from being optimised away

  const auto found = [&] {
    const auto entry = reg.find("add");
    for (int i = 0; i < kCalls; ++i)
      sink += entry->invoke(ctx, args, pool).value().as_tensor().numel();
  };
  const auto by_name = [&] {
    for (int i = 0; i < kCalls; ++i)
      sink += reg.invoke(ctx, "add", args, pool).value().as_tensor().numel();
  };
  const auto direct = [&] {
    for (int i = 0; i < kCalls; ++i)
      sink += fn(a, b).numel();
  };
  const auto [found_s, direct_s] = time_interleaved(found, direct, kRounds);
  const auto [by_name_s, direct_again_s] = time_interleaved(by_name, direct, kRounds);
  // Every call returned a 2-element tensor: (2 warm-ups + 2 * kRounds rounds) * 2 sides.
  if (sink != int64_t{2} * kCalls * (2 + 2 * kRounds) * 2) {
    throw std::logic_error("rpc.registry_invoke_ns: a call returned the wrong result");
  }
  const double per_call = 1e9 / kCalls;
  const double direct_ns = per_call * (direct_s + direct_again_s) / 2;
  Figure f{"rpc.registry_invoke_ns",
           per_call * found_s,
           "ns",
           {{"direct_ns", direct_ns},
            {"overhead_ns", per_call * found_s - direct_ns},
            {"by_name_ns", per_call * by_name_s},
            {"calls", static_cast<double>(kCalls)}}};
  emit(f);
});

}  // namespace
}  // namespace gradwire::bench

// rref/ in an elastic group (rpc AgentOptions::elastic): a worker that leaves gives up the
// references it holds before it goes, so their owners free the values; references to the
// values it owned fail at once afterwards, naming it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/eventually.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using rref::RRef;

TEST(ElasticRRef, AWorkerThatLeavesGivesUpItsReferencesAndItsValuesGoWithIt) {
  rpc::Registry reg;
  reg.def("make", [](int64_t n) { return ones({4}) * static_cast<double>(n); });
  rpc::AgentOptions options = test::agent_options(reg);
  options.elastic = true;
  options.max_workers = 8;
  auto store = std::make_shared<c10d::HashStore>(20s);
  test::Agents agents = test::start_agents(2, options, store);
  rpc::AgentOptions joining = options;
  joining.join_running = true;
  auto late = rpc::make_tensorpipe_agent("late", 2, 1, store, joining);

  // The joiner holds a value of w0's; w1 holds one of the joiner's.
  RRef<Tensor> held = rref::remote<Tensor>(*late, "w0", "make", int64_t{3});
  ASSERT_TRUE(held.creation().wait(10s));
  EXPECT_DOUBLE_EQ(sum(held.to_here()).item<double>(), 12);
  RRef<Tensor> theirs = rref::remote<Tensor>(*agents[1], "late", "make", int64_t{2});
  EXPECT_DOUBLE_EQ(sum(theirs.to_here()).item<double>(), 8);
  EXPECT_EQ(rref::metrics(*agents[0]).owned_values, 1);

  // It leaves still holding its reference: the reference is given up first, so w0 frees the
  // value without waiting for anyone.
  late->leave();
  EXPECT_TRUE(eventually(
      [&] {
        const rref::RRefMetrics m = rref::metrics(*agents[0]);
        return m.owned_values == 0 && m.owned_forks == 0;
      },
      10s))
      << rref::metrics(*agents[0]).owned_values << " values still owned by w0";
  // w1's reference to the joiner's value fails at once, naming it.
  const auto begun = std::chrono::steady_clock::now();
  const std::string why = test::error_text<Error>([&] { theirs.to_here(); });
  EXPECT_NE(why.find("late"), std::string::npos) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - begun, 2s);
  theirs = RRef<Tensor>();
  held = RRef<Tensor>();
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire

// dist_nn/: RemoteModule<M> on a second worker — forward and forward_async run on the owner,
// training through dist_autograd and a DistributedOptimizer gives the values worked out by
// hand, a snapshot forward survives an update between forward and backward (a shared one
// does not, which is why snapshots are the default), replicas are reused, lookup tables are
// never copied, the module's state moves both ways, and every mistake is a typed error
// naming the worker and the module. Workers are threads of one process, or processes.
#include "gradwire/dist_nn/remote_module.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/nn/linear.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/eventually.h"
#include "support/harness.h"
#include "support/temp_dir.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using dist_nn::ForwardParameters;
using dist_nn::ModuleHost;
using dist_nn::RemoteModule;
using rpc::Registry;
using rpc::RpcAgent;
using rref::RRef;
using test::error_text;
namespace da = dist_autograd;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::shared_ptr<nn::Linear> make_linear(int64_t in, int64_t out) {
  return std::make_shared<nn::Linear>(
      nn::LinearOptions{.in_features = in, .out_features = out, .dtype = kFloat64});
}

// A Linear registered to run its forward on its own parameters (kShared).
class SharedLinear : public nn::Linear {
 public:
  SharedLinear(int64_t in, int64_t out)
      : Linear(nn::LinearOptions{.in_features = in, .out_features = out, .dtype = kFloat64}) {}
};

std::shared_ptr<nn::EmbeddingBag> make_bag(int64_t rows, int64_t dim) {
  auto bag =
      std::make_shared<nn::EmbeddingBag>(nn::EmbeddingBagOptions{.num_embeddings = rows,
                                                                 .embedding_dim = dim,
                                                                 .mode = nn::EmbeddingBagMode::kSum,
                                                                 .dtype = kFloat64});
  return bag;
}

// W = [[0.5, -0.25]], b = [0.1]: the start of the hand-worked training below.
StateDict start_state() {
  return {{"weight", tensor(std::vector<double>{0.5, -0.25}).reshape({1, 2})},
          {"bias", tensor(std::vector<double>{0.1})}};
}

// Everything the tests register, on every worker.
void define(Registry& reg) {
  dist_nn::register_remote_module<nn::Linear>(reg, "Linear").ctor<int64_t, int64_t>(&make_linear);
  dist_nn::register_remote_module<SharedLinear>(reg, "SharedLinear")
      .ctor<int64_t, int64_t>()
      .forward_parameters(ForwardParameters::kShared);
  dist_nn::register_remote_module<nn::EmbeddingBag, Tensor(const Tensor&, const Tensor&)>(
      reg, "EmbeddingBag")
      .ctor<int64_t, int64_t>(&make_bag);
  // What the owner alone can see: its replicas, a context's gradient of a parameter, and
  // an update made in place, as an optimizer step makes it.
  reg.def("linear_replicas", [](const RRef<ModuleHost<nn::Linear>>& m) {
    return static_cast<int64_t>(m.local_value()->replicas());
  });
  reg.def("linear_replicas_in_use", [](const RRef<ModuleHost<nn::Linear>>& m) {
    return static_cast<int64_t>(m.local_value()->replicas_in_use());
  });
  reg.def("bag_replicas", [](const RRef<ModuleHost<nn::EmbeddingBag>>& m) {
    return static_cast<int64_t>(m.local_value()->replicas());
  });
  reg.def("linear_weight_grad", [](const rpc::CallContext& ctx, int64_t context_id,
                                   const RRef<ModuleHost<nn::Linear>>& m) {
    return da::get_gradients(*ctx.agent(), static_cast<uint64_t>(context_id))
        .at(m.local_value()->module()->weight());
  });
  reg.def("bag_weight_grad", [](const rpc::CallContext& ctx, int64_t context_id,
                                const RRef<ModuleHost<nn::EmbeddingBag>>& m) {
    return da::get_gradients(*ctx.agent(), static_cast<uint64_t>(context_id))
        .at(m.local_value()->module()->weight());
  });
  reg.def("bump_linear", [](const RRef<ModuleHost<nn::Linear>>& m) {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : m.local_value()->module()->parameters())
      p.detach().add_(1.0);
  });
  reg.def("bump_shared_linear", [](const RRef<ModuleHost<SharedLinear>>& m) {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : m.local_value()->module()->parameters())
      p.detach().add_(1.0);
  });
  reg.def("bump_bag", [](const RRef<ModuleHost<nn::EmbeddingBag>>& m) {
    autograd::NoGradGuard no_grad;
    m.local_value()->module()->weight().detach().add_(1.0);
  });
}

class RemoteModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    define(reg_);
    agents_ = test::start_agents(3, test::agent_options(reg_));
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  // A Linear(2 -> 1) on w1 that starts from start_state().
  RemoteModule<nn::Linear> linear_on_w1() {
    RemoteModule<nn::Linear> fc(w(0), "w1", "Linear", int64_t{2}, int64_t{1});
    fc.load_state_dict(start_state());
    return fc;
  }

  Registry reg_;
  test::Agents agents_;
};

// x [2, 2] as float64.
Tensor inputs() {
  return tensor(std::vector<double>{1, 2, 3, -1}).reshape({2, 2});
}

TEST_F(RemoteModuleTest, ForwardAndForwardAsyncRunOnTheOwner) {
  RemoteModule<nn::Linear> fc = linear_on_w1();
  EXPECT_EQ(fc.owner().name, "w1");
  EXPECT_FALSE(fc.module_rref().is_owner());
  // y = x W^T + b: 0.5 - 0.5 + 0.1 and 1.5 + 0.25 + 0.1.
  const Tensor y = fc.forward(inputs());
  ASSERT_EQ(y.sizes(), (Shape{2, 1}));
  EXPECT_NEAR(y.at({0, 0}), 0.1, 1e-12);
  EXPECT_NEAR(y.at({1, 0}), 1.85, 1e-12);
  // Many calls in flight at once, from several threads.
  std::vector<Future<Tensor>> pending;
  for (int i = 0; i < 16; ++i)
    pending.push_back(fc.forward_async(mul(inputs(), static_cast<double>(i))));
  for (int i = 0; i < 16; ++i) {
    const Tensor got = pending[static_cast<size_t>(i)].get(10s);
    EXPECT_NEAR(got.at({1, 0}), 1.75 * i + 0.1, 1e-12) << i;
  }
  // A copy of the handle, and a handle made from the reference, reach the same module.
  RemoteModule<nn::Linear> again(fc.module_rref());
  EXPECT_NEAR(again(inputs()).at({1, 0}), 1.85, 1e-12);
  EXPECT_EQ(fc.remote_parameters().size(), 2u);
}

// SGD (lr 0.05) on loss = sum(y^2) for three steps, driven from w0 and applied on w1, equals
// the values worked out by hand: dL/dW = sum_i 2 y_i x_i, dL/db = sum_i 2 y_i. The workers
// are processes.
TEST(RemoteModuleProcesses, TrainingThroughDistributedOptimizerMatchesHandWorkedValues) {
  Registry reg;
  define(reg);
  // The same training by hand.
  double w0 = 0.5, w1 = -0.25, b = 0.1;
  const double x[2][2] = {{1, 2}, {3, -1}};
  std::vector<std::vector<double>> want;
  for (int step = 0; step < 3; ++step) {
    double gw0 = 0, gw1 = 0, gb = 0;
    for (const auto& row : x) {
      const double y = w0 * row[0] + w1 * row[1] + b;
      gw0 += 2 * y * row[0];
      gw1 += 2 * y * row[1];
      gb += 2 * y;
    }
    w0 -= 0.05 * gw0;
    w1 -= 0.05 * gw1;
    b -= 0.05 * gb;
    want.push_back({w0, w1, b});
  }
  test::RankResults results = test::run_agent_processes(
      "remote-module", 2, test::agent_options(reg), [&](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          RemoteModule<nn::Linear> fc(agent, "w1", "Linear", int64_t{2}, int64_t{1});
          fc.load_state_dict(start_state());
          dist_optim::DistributedOptimizer opt(agent, optim::SGDOptions{.lr = 0.05},
                                               fc.remote_parameters());
          for (size_t step = 0; step < want.size(); ++step) {
            // The last step's graph is gone from w1 once w1 has released its context.
            EXPECT_TRUE(testing::eventually(
                [&] {
                  return agent.rpc_sync<int64_t>("w1", "linear_replicas_in_use",
                                                 fc.module_rref()) == 0;
                },
                10s));
            da::Context ctx(agent);
            const Tensor y = fc.forward(inputs());
            da::backward(agent, ctx.id(), {sum(mul(y, y))});
            opt.step(ctx.id());
            const StateDict state = fc.state_dict();
            ASSERT_EQ(state.size(), 2u);
            const Tensor weight = state[0].second, bias = state[1].second;
            EXPECT_NEAR(weight.at({0, 0}), want[step][0], 1e-12) << "step " << step + 1;
            EXPECT_NEAR(weight.at({0, 1}), want[step][1], 1e-12) << "step " << step + 1;
            EXPECT_NEAR(bias.at({0}), want[step][2], 1e-12) << "step " << step + 1;
          }
          // One replica served every forward: each graph was gone before the next began.
          EXPECT_EQ(agent.rpc_sync<int64_t>("w1", "linear_replicas", fc.module_rref()), 1);
        }
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

// An update in place between a forward and its backward (another trainer's step): with a
// snapshot the backward succeeds and the gradient is the one at the values the forward
// used; forward on the module itself (kShared) cannot be differentiated any more.
TEST_F(RemoteModuleTest, ASnapshotForwardSurvivesAnUpdateBeforeItsBackward) {
  RemoteModule<nn::Linear> fc = linear_on_w1();
  {
    da::Context ctx(w(0));
    const Tensor y = fc.forward(inputs());
    w(0).rpc_sync<void>("w1", "bump_linear", fc.module_rref());
    da::backward(w(0), ctx.id(), {sum(mul(y, y))});
    // y = [0.1, 1.85]: dL/dW = [2 (0.1 + 5.55), 2 (0.2 - 1.85)] at the old values.
    const Tensor g = w(0).rpc_sync<Tensor>("w1", "linear_weight_grad",
                                           static_cast<int64_t>(ctx.id()), fc.module_rref());
    EXPECT_NEAR(g.at({0, 0}), 11.3, 1e-12);
    EXPECT_NEAR(g.at({0, 1}), -3.3, 1e-12);
  }
  RemoteModule<SharedLinear> shared(w(0), "w1", "SharedLinear", int64_t{2}, int64_t{1});
  da::Context ctx(w(0));
  const Tensor y = shared.forward(inputs());
  // The module's own parameters changed under the recorded graph.
  w(0).rpc_sync<void>("w1", "bump_shared_linear", shared.module_rref());
  EXPECT_TRUE(contains(error_text<Error>([&] { da::backward(w(0), ctx.id(), {sum(mul(y, y))}); }),
                       "modified by an inplace operation"));
}

// A replica is lent to each forward whose graph still lives (a context not yet released)
// and comes back when that graph goes; a forward recorded nowhere gives it back at once.
TEST_F(RemoteModuleTest, ReplicasAreLentPerLiveGraphAndReused) {
  RemoteModule<nn::Linear> fc = linear_on_w1();
  auto replicas = [&] { return w(0).rpc_sync<int64_t>("w1", "linear_replicas", fc.module_rref()); };
  // Until w1 has released the contexts that held them.
  auto none_in_use = [&] {
    return testing::eventually(
        [&] {
          return w(0).rpc_sync<int64_t>("w1", "linear_replicas_in_use", fc.module_rref()) == 0;
        },
        10s);
  };
  {
    autograd::NoGradGuard no_grad;  // (the owner records anyway: the call is not in a context)
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(none_in_use());
      (void)fc.forward(inputs());
    }
  }
  EXPECT_EQ(replicas(), 1);
  ASSERT_TRUE(none_in_use());
  {
    da::Context a(w(0));
    const Tensor ya = fc.forward(inputs());
    da::Context b(w(0));
    const Tensor yb = fc.forward(inputs());
    EXPECT_EQ(replicas(), 2);  // two graphs alive at once
    da::backward(w(0), b.id(), {sum(yb)});
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(none_in_use());
    da::Context ctx(w(0));
    da::backward(w(0), ctx.id(), {sum(fc.forward(inputs()))});
  }
  EXPECT_EQ(replicas(), 2);
}

// EmbeddingBag: a forward of two arguments (indices, offsets), run on the table itself
// (kShared by default, so no replica and no copy of the table); its backward does not need
// the table, so an update between forward and backward is harmless.
TEST_F(RemoteModuleTest, AnEmbeddingBagTakesOffsetsAndIsNeverCopied) {
  RemoteModule<nn::EmbeddingBag> bag(w(0), "w1", "EmbeddingBag", int64_t{10}, int64_t{3});
  const StateDict state = bag.state_dict();
  const Tensor table = state.at(0).second;
  const Tensor ids = tensor<int64_t>({1, 4, 4, 7}), offsets = tensor<int64_t>({0, 3});
  da::Context ctx(w(0));
  const Tensor y = bag.forward(ids, offsets);
  ASSERT_EQ(y.sizes(), (Shape{2, 3}));
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_NEAR(y.at({0, d}), table.at({1, d}) + 2 * table.at({4, d}), 1e-12);
    EXPECT_NEAR(y.at({1, d}), table.at({7, d}), 1e-12);
  }
  w(0).rpc_sync<void>("w1", "bump_bag", bag.module_rref());
  da::backward(w(0), ctx.id(), {sum(y)});
  const Tensor g = w(0).rpc_sync<Tensor>("w1", "bag_weight_grad", static_cast<int64_t>(ctx.id()),
                                         bag.module_rref());
  EXPECT_NEAR(g.at({4, 0}), 2.0, 1e-12);
  EXPECT_NEAR(g.at({7, 2}), 1.0, 1e-12);
  EXPECT_NEAR(g.at({0, 0}), 0.0, 1e-12);
  EXPECT_EQ(w(0).rpc_sync<int64_t>("w1", "bag_replicas", bag.module_rref()), 0);
  // The table moved by the update in place: forward reads the module's own weight.
  EXPECT_NEAR(bag.forward(tensor<int64_t>({7}), tensor<int64_t>({0})).at({0, 1}),
              table.at({7, 1}) + 1.0, 1e-12);
}

TEST_F(RemoteModuleTest, ModeAndStateMoveBothWays) {
  RemoteModule<nn::Linear> fc = linear_on_w1();
  EXPECT_TRUE(fc.is_training());
  fc.eval();
  EXPECT_FALSE(fc.is_training());
  fc.train();
  EXPECT_TRUE(fc.is_training());
  const StateDict state = fc.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "weight");
  EXPECT_EQ(state[1].first, "bias");
  EXPECT_NEAR(state[0].second.at({0, 1}), -0.25, 1e-12);
  // A strict load of a state with a wrong key: the owner's InvalidArgument names it.
  EXPECT_TRUE(contains(error_text<InvalidArgument>([&] {
                         fc.load_state_dict({{"weights", zeros({1, 2}, kFloat64)}});
                       }),
                       "weights"));
  // To a file on the owner and back.
  test::TempDir dir("gradwire-remote-module");
  const std::string path = (dir.path() / "fc.gw").string();
  fc.save(path);
  fc.load_state_dict({{"weight", zeros({1, 2}, kFloat64)}, {"bias", zeros({1}, kFloat64)}});
  EXPECT_NEAR(fc.forward(inputs()).at({1, 0}), 0.0, 1e-12);
  fc.load(path);
  EXPECT_NEAR(fc.forward(inputs()).at({1, 0}), 1.85, 1e-12);
}

TEST_F(RemoteModuleTest, CreationErrorsNameTheWorkerAndTheModule) {
  // An unknown worker.
  std::string text = error_text<InvalidArgument>(
      [&] { RemoteModule<nn::Linear>(w(0), "w9", "Linear", int64_t{2}, int64_t{1}); });
  EXPECT_TRUE(contains(text, "RemoteModule 'Linear' on 'w9'")) << text;
  EXPECT_TRUE(contains(text, "unknown worker 'w9'")) << text;
  // A module type not registered here.
  text = error_text<InvalidArgument>(
      [&] { RemoteModule<nn::Embedding>(w(0), "w1", "Embedding", int64_t{2}, int64_t{1}); });
  EXPECT_TRUE(contains(text, "is not registered here as a remote module")) << text;
  // A name that is not the one the type is registered under.
  text = error_text<InvalidArgument>(
      [&] { RemoteModule<nn::EmbeddingBag>(w(0), "w1", "Bag", int64_t{2}, int64_t{1}); });
  EXPECT_TRUE(contains(text, "registered here as 'EmbeddingBag', not 'Bag'")) << text;
  // Constructor arguments of the wrong types or count: the owner names what it expected.
  text = error_text<InvalidArgument>(
      [&] { RemoteModule<nn::Linear>(w(0), "w1", "Linear", std::string("two"), int64_t{1}); });
  EXPECT_TRUE(contains(text, "RemoteModule 'Linear' on 'w1'")) << text;
  EXPECT_TRUE(contains(text, "int")) << text;
  text = error_text<InvalidArgument>(
      [&] { RemoteModule<nn::Linear>(w(0), "w1", "Linear", int64_t{2}); });
  EXPECT_TRUE(contains(text, "RemoteModule 'Linear' on 'w1'")) << text;
  // A constructor that throws: its message, from the owner.
  try {
    RemoteModule<nn::Linear>(w(0), "w1", "Linear", int64_t{0}, int64_t{1});
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
    EXPECT_EQ(e.remote_type(), "InvalidArgument");
    EXPECT_TRUE(contains(e.what(), "RemoteModule 'Linear' on 'w1'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "in_features")) << e.what();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "RemoteModule 'Linear' on 'w1'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "in_features")) << e.what();
  }
}

TEST_F(RemoteModuleTest, AForwardWithWrongArgumentsNamesTheSignature) {
  RemoteModule<nn::Linear> fc = linear_on_w1();
  std::string text = error_text<InvalidArgument>([&] { (void)fc.forward(int64_t{3}); });
  EXPECT_TRUE(contains(text, "Linear.forward")) << text;
  EXPECT_TRUE(contains(text, "Tensor")) << text;
  text = error_text<InvalidArgument>([&] { (void)fc.forward(inputs(), inputs()); });
  EXPECT_TRUE(contains(text, "Linear.forward")) << text;
  // What forward itself throws (an input of the wrong width) comes back from the owner.
  try {
    (void)fc.forward(zeros({2, 5}, kFloat64));
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
  }
}

// A module class the owner has not registered: its error names the class, the module and
// the worker. The workers are processes whose registries differ: w0 registers one class
// more after the fork.
TEST(RemoteModuleProcesses, AClassTheOwnerHasNotRegisteredIsNamed) {
  Registry reg;
  define(reg);
  test::RankResults results = test::run_agent_processes(
      "remote-module-unregistered", 2, test::agent_options(reg),
      [&](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          dist_nn::register_remote_module<nn::Embedding>(reg, "OnlyHere")
              .ctor<int64_t, int64_t>([](int64_t n, int64_t d) {
                return std::make_shared<nn::Embedding>(
                    nn::EmbeddingOptions{.num_embeddings = n, .embedding_dim = d});
              });
          const std::string text = error_text<InvalidArgument>([&] {
            RemoteModule<nn::Embedding>(agent, "w1", "OnlyHere", int64_t{4}, int64_t{2});
          });
          EXPECT_TRUE(contains(text, "RemoteModule 'OnlyHere' on 'w1'")) << text;
          EXPECT_TRUE(contains(text, "OnlyHere")) << text;
          // Made on this worker itself, it works.
          RemoteModule<nn::Embedding> here(agent, "w0", "OnlyHere", int64_t{4}, int64_t{2});
          EXPECT_EQ(here.forward(tensor<int64_t>({1, 3})).sizes(), (Shape{2, 2}));
        }
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire

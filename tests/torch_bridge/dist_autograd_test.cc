// Distributed autograd over LibTorch's graph (gradwire/torch/dist_autograd.h): a
// torch::nn::Sequential held by a server, trained from a trainer through rpc, checked against
// PyTorch 1.13's own dist_autograd and DistributedOptimizer (fixtures/, written by
// make_fixtures.py): the server's gradients, its parameters after two steps of SGD, Adam,
// AdamW and Adagrad, a tensor sent in two calls, nested calls back to the trainer, and the
// graph where PyTorch's FAST mode waits for a gradient that never comes while gradwire's
// exact mode finishes with the right values. Between two agents in one process and between
// two processes; refusals and failures name what was wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/optim.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "gradwire/torch/dist_autograd.h"
#include "gradwire/torch/value_convert.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "torch_bridge/torch_test_util.h"

namespace gradwire::torch {
namespace {

using namespace std::chrono_literals;
using rref::RRef;
using test::error_text;
using test_util::values;
namespace tda = gradwire::torch::dist_autograd;

// ---- the model and data of make_fixtures.py

::torch::nn::Sequential make_model() {
  ::torch::nn::Sequential model(::torch::nn::Linear(4, 5), ::torch::nn::Tanh(),
                                ::torch::nn::Linear(5, 3));
  model->to(at::kDouble);
  ::torch::NoGradGuard no_grad;
  int i = 0;
  for (at::Tensor p : model->parameters()) {
    std::vector<double> flat(static_cast<size_t>(p.numel()));
    for (size_t k = 0; k < flat.size(); ++k)
      flat[k] = 0.25 * std::sin(0.9 * static_cast<double>(k) + i + 1);
    p.copy_(at::tensor(flat, at::kDouble).reshape(p.sizes()));
    ++i;
  }
  return model;
}

at::Tensor batch() {
  std::vector<double> x;
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c)
      x.push_back(0.5 * std::cos(4 * r + c));
  return at::tensor(x, at::kDouble).reshape({6, 4});
}

at::Tensor labels() {
  return at::tensor(std::vector<int64_t>{2, 0, 1, 1, 0, 2}, at::kLong);
}

at::Tensor trainer_leaf() {
  std::vector<double> v;
  for (int k = 0; k < 4; ++k)
    v.push_back(0.25 * std::sin(0.9 * k + 11));
  return at::tensor(v, at::kDouble).requires_grad_(true);
}

// A fixture file: each line's key (its leading words and integers) -> its values.
std::map<std::string, std::vector<double>> read_fixture(const std::string& name, int key_ints) {
  const std::filesystem::path path =
      std::filesystem::path(GRADWIRE_TEST_SOURCE_DIR) / "fixtures" / (name + ".txt");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    std::string key;
    row >> key;
    const int ints = (key == "grad" || key == "param") ? key_ints : 0;
    for (int i = 0; i < ints; ++i) {
      std::string n;
      row >> n;
      key += " " + n;
    }
    std::vector<double> v;
    double d = 0;
    while (row >> d)
      v.push_back(d);
    if (v.empty()) throw std::runtime_error(path.string() + ": bad line '" + line + "'");
    out[key] = v;
  }
  return out;
}

void expect_close(const at::Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(g[i], want[i], 1e-12) << what << ", element " << i;
}

// ---- what the workers serve ("w1" the server, "w0" the trainer)

struct World {
  ::torch::nn::Sequential model{nullptr};
  at::Tensor e;                  // the trainer's leaf for embed
  std::vector<at::Tensor> kept;  // what keep() was sent
};

void define(rpc::Registry& reg, World& world) {
  reg.def("reset", [&world] {
    world.model = make_model();
    return true;
  });
  reg.def("params", [&world](const rpc::CallContext& call) {
    return tda::parameter_rrefs(*call.agent(), *world.model);
  });
  reg.def("forward", [&world](const at::Tensor& x) { return world.model->forward(x); });
  reg.def("server_grads", [&world](const rpc::CallContext& call, int64_t ctx) {
    const tda::Gradients g = tda::get_gradients(*call.agent(), static_cast<uint64_t>(ctx));
    std::vector<std::optional<at::Tensor>> out;
    for (const at::Tensor& p : world.model->parameters())
      out.push_back(g.contains(p) ? std::optional<at::Tensor>(g.at(p)) : std::nullopt);
    return out;
  });
  reg.def("param_values", [&world] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : world.model->parameters())
      out.push_back(p.detach().clone());
    return out;
  });
  reg.def("has_torch_grads", [&world] {
    for (const at::Tensor& p : world.model->parameters())
      if (p.grad().defined()) return true;
    return false;
  });
  reg.def("relay", [&world](const rpc::CallContext& call, const at::Tensor& x) {
    return world.model->forward(call.agent()->rpc_sync<at::Tensor>("w0", "embed", x));
  });
  reg.def("embed", [&world](const at::Tensor& x) { return x * world.e; });
  reg.def("share_and_return", [&world](const rpc::CallContext& call, const at::Tensor& u) {
    at::Tensor h = world.model->forward(u);
    call.agent()->rpc_sync<bool>("w0", "keep", h);
    return h * 3.0;
  });
  reg.def("pair_up", [](const std::vector<at::Tensor>& xs) {
    return std::make_tuple(xs.at(0) * 2, xs.at(1) * xs.at(0));
  });
  reg.def("cube", [](const at::Tensor& x) { return x * x * x; });
  reg.def("keep", [&world](const at::Tensor& t) {
    world.kept.push_back(t);
    return true;
  });
}

// The server's gradients in context `ctx`, against the fixture's "grad [<step>] <param>".
void expect_server_grads(rpc::RpcAgent& trainer, uint64_t ctx,
                         const std::map<std::string, std::vector<double>>& fx,
                         const std::string& prefix) {
  const auto grads = trainer.rpc_sync<std::vector<std::optional<at::Tensor>>>(
      "w1", "server_grads", static_cast<int64_t>(ctx));
  ASSERT_EQ(grads.size(), 4u);
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string key = prefix + std::to_string(i);
    ASSERT_TRUE(grads[i].has_value()) << key;
    expect_close(*grads[i], fx.at(key), key);
  }
}

// make_fixtures.py's shared case, in the current context: h = tanh(x * v) sent in two calls
// to the server's forward; the loss sum(o1 * o2).
at::Tensor shared_loss(rpc::RpcAgent& trainer, const at::Tensor& v) {
  const at::Tensor h = at::tanh(batch() * v);
  const at::Tensor o1 = trainer.rpc_sync<at::Tensor>("w1", "forward", h);
  const at::Tensor o2 = trainer.rpc_sync<at::Tensor>("w1", "forward", h);
  return (o1 * o2).sum();
}

// Two steps of make_fixtures.py's ps case with `options`, checked against ps_<name>.txt.
template <typename Options>
void train_ps_and_check(rpc::RpcAgent& trainer, const std::string& name, const Options& options) {
  const auto fx = read_fixture("ps_" + name, 2);
  ASSERT_TRUE(trainer.rpc_sync<bool>("w1", "reset"));
  auto params = trainer.rpc_sync<std::vector<RRef<Tensor>>>("w1", "params");
  ASSERT_EQ(params.size(), 4u);
  dist_optim::DistributedOptimizer opt(trainer, options, params);
  for (int step = 1; step <= 2; ++step) {
    {
      gradwire::dist_autograd::Context ctx(trainer);
      const at::Tensor out = trainer.rpc_sync<at::Tensor>("w1", "forward", batch());
      ASSERT_TRUE(out.requires_grad());
      const at::Tensor loss = ::torch::nn::functional::cross_entropy(out, labels());
      tda::backward(trainer, ctx.id(), {loss});
      expect_server_grads(trainer, ctx.id(), fx, "grad " + std::to_string(step) + " ");
      opt.step(ctx.id());
    }
    const auto now = trainer.rpc_sync<std::vector<at::Tensor>>("w1", "param_values");
    ASSERT_EQ(now.size(), 4u);
    for (size_t i = 0; i < now.size(); ++i) {
      const std::string key = "param " + std::to_string(step) + " " + std::to_string(i);
      expect_close(now[i], fx.at(key), name + " " + key);
    }
  }
  EXPECT_FALSE(trainer.rpc_sync<bool>("w1", "has_torch_grads"))
      << "the context's gradients leaked into the server's .grad()";
}

class TorchDistAutograd : public ::testing::Test {
 protected:
  void SetUp() override {
    define(reg_, world_);
    agents_ = test::start_agents(2, test::agent_options(reg_));
    ASSERT_TRUE(trainer().rpc_sync<bool>("w1", "reset"));
  }
  void TearDown() override { test::shutdown_agents(agents_); }
  rpc::RpcAgent& trainer() { return *agents_[0]; }

  World world_;
  rpc::Registry reg_;
  test::Agents agents_;
};

TEST_F(TorchDistAutograd, SgdStepsTheServersTorchParametersAsPyTorchDoes) {
  train_ps_and_check(
      trainer(), "sgd",
      optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
}

TEST_F(TorchDistAutograd, AdamStepsTheServersTorchParametersAsPyTorchDoes) {
  train_ps_and_check(trainer(), "adam", optim::AdamOptions{.lr = 0.01});
}

TEST_F(TorchDistAutograd, AdamWStepsTheServersTorchParametersAsPyTorchDoes) {
  train_ps_and_check(trainer(), "adamw", optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
}

TEST_F(TorchDistAutograd, AdagradStepsTheServersTorchParametersAsPyTorchDoes) {
  train_ps_and_check(trainer(), "adagrad", optim::AdagradOptions{.lr = 0.1});
}

// h = tanh(x * v) on the trainer, sent in two calls: the mirrored TanhBackward is reached by
// both calls' gradients and runs once with their sum.
TEST_F(TorchDistAutograd, ATensorSentInTwoCallsGetsBothGradients) {
  const auto fx = read_fixture("shared", 1);
  const at::Tensor v = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  tda::backward(trainer(), ctx.id(), {shared_loss(trainer(), v)});
  const tda::Gradients g = tda::get_gradients(trainer(), ctx.id());
  ASSERT_EQ(g.size(), 1u);
  expect_close(g.at(v), fx.at("v"), "v");
  EXPECT_FALSE(v.grad().defined()) << "the gradient belongs to the context, not to .grad()";
  expect_server_grads(trainer(), ctx.id(), fx, "grad ");
}

// The server's relay calls back the trainer's embed (x * e) within the call: gradients flow
// trainer -> server -> trainer.
TEST_F(TorchDistAutograd, NestedCallsBackToTheTrainerCarryTheGradient) {
  const auto fx = read_fixture("chain", 1);
  world_.e = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor out = trainer().rpc_sync<at::Tensor>("w1", "relay", batch());
  tda::backward(trainer(), ctx.id(), {0.5 * (out * out).sum()});
  expect_close(tda::get_gradients(trainer(), ctx.id()).at(world_.e), fx.at("e"), "e");
  expect_server_grads(trainer(), ctx.id(), fx, "grad ");
}

// The graph where PyTorch's FAST mode and gradwire's exact mode differ: the server's h feeds
// two sends (a nested call to the trainer and the reply), and only the reply reaches the
// loss. PyTorch 1.13 waits for the other send's gradient until its rpc timeout (recorded in
// the fixture); the exact pass knows no gradient will come and finishes at once, with the
// values one PyTorch process computes.
TEST_F(TorchDistAutograd, ASendWhoseResultIsUnusedIsNotWaitedFor) {
  const auto fx = read_fixture("unused", 1);
  const at::Tensor v = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor out = trainer().rpc_sync<at::Tensor>("w1", "share_and_return", batch() * v);
  ASSERT_EQ(world_.kept.size(), 1u);
  EXPECT_TRUE(world_.kept[0].requires_grad());
  gradwire::dist_autograd::BackwardOptions options;
  options.timeout = 20s;
  const auto start = std::chrono::steady_clock::now();
  tda::backward(trainer(), ctx.id(), {(out * out).sum()}, options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  expect_close(tda::get_gradients(trainer(), ctx.id()).at(v), fx.at("v"), "v");
  expect_server_grads(trainer(), ctx.id(), fx, "grad ");
}

// A vector of tensors out, a tuple back: each element that requires grad is recorded.
TEST_F(TorchDistAutograd, ContainersAreRecordedElementByElement) {
  const at::Tensor a = at::tensor({1.0, -2.0}, at::kDouble).requires_grad_(true);
  const at::Tensor b = at::tensor({0.5, 3.0}, at::kDouble).requires_grad_(true);
  const at::Tensor c = at::tensor({4.0, 4.0}, at::kDouble);  // no grad: not recorded
  gradwire::dist_autograd::Context ctx(trainer());
  const auto [twice, product] = trainer().rpc_sync<std::tuple<at::Tensor, at::Tensor>>(
      "w1", "pair_up", std::vector<at::Tensor>{a * 1.0, b});
  const auto [twice_c, product_c] = trainer().rpc_sync<std::tuple<at::Tensor, at::Tensor>>(
      "w1", "pair_up", std::vector<at::Tensor>{c, b});
  tda::backward(trainer(), ctx.id(), {(twice + product + product_c).sum()});
  const tda::Gradients g = tda::get_gradients(trainer(), ctx.id());
  // d/da (2a + b a) = 2 + b; d/db (b a + b c) = a + c.
  expect_close(g.at(a), {2.5, 5.0}, "a");
  expect_close(g.at(b), {5.0, 2.0}, "b");
  EXPECT_FALSE(g.contains(c));
  EXPECT_FALSE(twice_c.requires_grad());
}

// rpc_async and an RRef proxy to a server object holding a LibTorch model: both recorded;
// the trainer's gradient equals LibTorch's own on the same function in this process.
TEST_F(TorchDistAutograd, AsyncCallsAndRRefProxiesAreRecorded) {
  struct TorchServer {
    ::torch::nn::Sequential model = make_model();
    at::Tensor forward(const at::Tensor& x) { return model->forward(x); }
  };
  reg_.def_class<TorchServer>("TorchServer").ctor<>().method("forward", &TorchServer::forward);
  rref::RRef<TorchServer> ps = rref::remote<TorchServer>(trainer(), "w1", "TorchServer");
  const at::Tensor v = trainer_leaf();
  {
    gradwire::dist_autograd::Context ctx(trainer());
    const at::Tensor h = at::tanh(batch() * v);
    Future<at::Tensor> pending = trainer().rpc_async<at::Tensor>("w1", "forward", h * 2);
    const at::Tensor p2 = ps.rpc_sync<at::Tensor>("forward", h);
    const at::Tensor p1 = pending.get(30s);
    tda::backward(trainer(), ctx.id(), {p1.sum() + (p2 * p2).sum()});
    // The same function with LibTorch's own autograd, here.
    ::torch::nn::Sequential local = make_model();
    const at::Tensor u = trainer_leaf();
    const at::Tensor hu = at::tanh(batch() * u);
    const at::Tensor q2 = local->forward(hu);
    (local->forward(hu * 2).sum() + (q2 * q2).sum()).backward();
    expect_close(tda::get_gradients(trainer(), ctx.id()).at(v), values(u.grad()), "v");
  }
  ps = {};
}

// Contexts on several threads at once: each pass sees only its own calls' gradients.
TEST_F(TorchDistAutograd, ConcurrentContextsKeepTheirGradientsApart) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 4; ++round) {
        const double x = k + 1 + 0.25 * round;
        const at::Tensor v = at::tensor({x, -x}, at::kDouble).requires_grad_(true);
        gradwire::dist_autograd::Context ctx(trainer());
        const at::Tensor y = trainer().rpc_sync<at::Tensor>("w1", "cube", v * 1.0);
        tda::backward(trainer(), ctx.id(), {y.sum()});
        const std::vector<double> g = values(tda::get_gradients(trainer(), ctx.id()).at(v));
        if (std::abs(g[0] - 3 * x * x) > 1e-12 || std::abs(g[1] - 3 * x * x) > 1e-12) ++bad;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(TorchDistAutograd, RetainedGraphsAccumulateInTheContext) {
  const auto fx = read_fixture("shared", 1);
  const at::Tensor v = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor loss = shared_loss(trainer(), v);
  tda::backward(trainer(), ctx.id(), {loss}, {.retain_graph = true});
  tda::backward(trainer(), ctx.id(), {loss});
  std::vector<double> twice = fx.at("v");
  for (double& d : twice)
    d *= 2;
  expect_close(tda::get_gradients(trainer(), ctx.id()).at(v), twice, "v after two passes");
}

// A root whose graph makes no call: the trainer's own leaves fill the context.
TEST_F(TorchDistAutograd, ALocalGraphFillsTheContextToo) {
  const at::Tensor w = at::tensor({1.0, -2.0, 0.5}, at::kDouble).requires_grad_(true);
  gradwire::dist_autograd::Context ctx(trainer());
  tda::backward(trainer(), ctx.id(), {(w * w * w).sum()});  // d/dw = 3 w^2
  expect_close(tda::get_gradients(trainer(), ctx.id()).at(w), {3.0, 12.0, 0.75}, "w");
  EXPECT_FALSE(w.grad().defined());
}

TEST_F(TorchDistAutograd, TheTwinOfALeafIsStableAndSharesItsMemory) {
  const at::Tensor p = at::zeros({3}, at::kFloat).requires_grad_(true);
  Tensor a = tda::autograd_leaf(p);
  Tensor b = tda::autograd_leaf(p);
  EXPECT_TRUE(a.is_same(b));
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(a.is_leaf());
  EXPECT_EQ(a.data_ptr(), p.data_ptr());
  {
    ::torch::NoGradGuard no_grad;
    p.add_(1.0);
  }
  EXPECT_EQ(values(a), (std::vector<double>{1, 1, 1}));
  // The twin lives while something holds it: the bridge's table holds neither it nor the
  // leaf's memory.
  std::weak_ptr<TensorImpl> held = a.impl_ptr();
  a = Tensor();
  b = Tensor();
  EXPECT_TRUE(held.expired());
  EXPECT_TRUE(tda::autograd_leaf(p).requires_grad());
  const at::Tensor q = p * 2;
  const std::string non_leaf = error_text<InvalidArgument>([&] { tda::autograd_leaf(q); });
  EXPECT_NE(non_leaf.find("MulBackward"), std::string::npos) << non_leaf;
  EXPECT_NE(
      error_text<InvalidArgument>([&] { tda::autograd_leaf(at::Tensor()); }).find("undefined"),
      std::string::npos);
}

TEST_F(TorchDistAutograd, RootsThatCannotStartAPassAreRefused) {
  gradwire::dist_autograd::Context ctx(trainer());
  EXPECT_NE(
      error_text<InvalidArgument>([&] { tda::backward(trainer(), ctx.id(), {}); }).find("no roots"),
      std::string::npos);
  const std::string undefined = error_text<InvalidArgument>([&] {
    tda::backward(trainer(), ctx.id(), {at::ones({}), at::Tensor()});
  });
  EXPECT_NE(undefined.find("root 0"), std::string::npos) << undefined;
  EXPECT_NE(undefined.find("does not require grad"), std::string::npos) << undefined;
  const at::Tensor w = at::ones({2}, at::kDouble).requires_grad_(true);
  const std::string missing = error_text<InvalidArgument>([&] {
    tda::backward(trainer(), ctx.id(), {w.sum(), at::Tensor()});
  });
  EXPECT_NE(missing.find("root 1 is undefined"), std::string::npos) << missing;
  // A root of several elements gets no implicit gradient (gradwire's rule, as PyTorch's).
  EXPECT_THROW(tda::backward(trainer(), ctx.id(), {w * 2}), InvalidArgument);
  // An unknown context.
  EXPECT_THROW(tda::backward(trainer(), 0x7fff0000beefULL, {w.sum()}), InvalidArgument);
}

TEST_F(TorchDistAutograd, LibTorchsOwnBackwardThroughAReceivedTensorIsRefused) {
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor out = trainer().rpc_sync<at::Tensor>("w1", "forward", batch());
  ASSERT_NE(out.grad_fn(), nullptr);
  EXPECT_EQ(out.grad_fn()->name(), "GradwireRecvBackward");
  try {
    out.sum().backward();
    ADD_FAILURE() << "LibTorch's backward() ran through a received tensor";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("gradwire::torch::dist_autograd::backward"),
              std::string::npos)
        << e.what();
  }
}

// Outside a context nothing is recorded: a tensor that requires grad arrives as a fresh leaf.
TEST_F(TorchDistAutograd, OutsideAContextNothingIsRecorded) {
  const at::Tensor v = trainer_leaf();
  const at::Tensor out = trainer().rpc_sync<at::Tensor>("w1", "forward", at::tanh(batch() * v));
  EXPECT_TRUE(out.requires_grad());
  EXPECT_TRUE(out.is_leaf());
}

// A LibTorch node failing in the pass fails it, naming the node and LibTorch's message.
struct Refuse : public ::torch::autograd::Function<Refuse> {
  static at::Tensor forward(::torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext*,
                                                   ::torch::autograd::variable_list) {
    TORCH_CHECK(false, "Refuse's backward refuses");
  }
};

TEST_F(TorchDistAutograd, AFailingLibTorchNodeFailsThePassNamingIt) {
  const at::Tensor v = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor sent = Refuse::apply(batch() * v);
  const at::Tensor out = trainer().rpc_sync<at::Tensor>("w1", "forward", sent);
  const std::string what =
      error_text<Error>([&] { tda::backward(trainer(), ctx.id(), {out.sum()}); });
  EXPECT_NE(what.find("Refuse's backward refuses"), std::string::npos) << what;
  EXPECT_NE(what.find("LibTorch's"), std::string::npos) << what;
  EXPECT_THROW(tda::get_gradients(trainer(), ctx.id()), Error);
}

// A graph with a gradient of a type gradwire lacks (complex) is refused as it is sent.
TEST_F(TorchDistAutograd, AComplexGradientInTheGraphIsRefusedNamingTheNode) {
  const at::Tensor v = trainer_leaf();
  gradwire::dist_autograd::Context ctx(trainer());
  const at::Tensor z = at::view_as_real(at::complex(v, v * 2));
  const std::string what =
      error_text<InvalidArgument>([&] { trainer().rpc_sync<at::Tensor>("w1", "forward", z); });
  EXPECT_NE(what.find("Complex"), std::string::npos) << what;
  EXPECT_NE(what.find("gradwire has no type"), std::string::npos) << what;
}

// Two processes: PyTorch's ps training with Adam, and the shared-tensor graph.
TEST(TorchDistAutogradProcesses, TrainingAcrossProcessesMatchesPyTorch) {
  World world;
  rpc::Registry reg;
  define(reg, world);
  const test::RankResults results = test::run_agent_processes(
      "torch-dist-autograd", 2, test::agent_options(reg),
      [&world](int rank, c10d::Store& store, rpc::RpcAgent& agent) {
        if (rank == 0) {
          train_ps_and_check(agent, "adam", optim::AdamOptions{.lr = 0.01});
          const auto fx = read_fixture("shared", 1);
          ASSERT_TRUE(agent.rpc_sync<bool>("w1", "reset"));
          const at::Tensor v = trainer_leaf();
          gradwire::dist_autograd::Context ctx(agent);
          tda::backward(agent, ctx.id(), {shared_loss(agent, v)});
          expect_close(tda::get_gradients(agent, ctx.id()).at(v), fx.at("v"), "v");
          expect_server_grads(agent, ctx.id(), fx, "grad ");
        }
        (void)world;
        c10d::barrier(store, "torch-dist-autograd-done", 2, 30s);
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire::torch

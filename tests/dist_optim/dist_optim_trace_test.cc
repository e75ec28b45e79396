// dist_optim/'s trace spans: the trainer's whole step (dist_optim.step, with the context id
// and the number of owners) and each owner's step as served (dist_optim.owner_step, with the
// same context id, the caller, the request id and its number of parameters), across three
// processes (a trainer and two owners) each tracing into its own file; and tracing off
// records nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/temp_dir.h"
#include "support/trace_file.h"

namespace gradwire {
namespace {

namespace fs = std::filesystem;
using rref::RRef;
namespace da = dist_autograd;

Tensor make_param(int64_t n) {
  Tensor p = ones({n}, kFloat64);
  p.set_requires_grad(true);
  return p;
}

class DistOptimTrace : public ::testing::Test {
 protected:
  // A trainer (w0) steps parameters owned by w1 (two of them) and w2 (one) once; every
  // process writes what it recorded to DIR/w<rank>.trace.json when its agent is down.
  // With `backward_and_step`, the trainer runs DistributedOptimizer::backward_and_step
  // instead of backward() then step().
  void run(bool traced, bool backward_and_step = false) {
    rpc::Registry reg;
    reg.def("make_param", [](int64_t n) { return make_param(n); });
    reg.def("scaled",
            [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
    const std::string dir = dir_.string();
    test::RankResults results = test::run_agent_processes(
        "dist-optim-trace", 3, test::agent_options(reg),
        [&](int rank, c10d::Store&, rpc::RpcAgent& agent) {
          trace::clear();
          if (traced) trace::start(dir);
          trace::set_directory(dir);
          if (rank == 0) {
            std::vector<RRef<Tensor>> params{
                rref::remote<Tensor>(agent, "w1", "make_param", int64_t{3}),
                rref::remote<Tensor>(agent, "w1", "make_param", int64_t{3}),
                rref::remote<Tensor>(agent, "w2", "make_param", int64_t{3})};
            dist_optim::DistributedOptimizer opt(agent, optim::SGDOptions{.lr = 0.1}, params);
            da::Context ctx(agent);
            const Tensor x = tensor(std::vector<double>{1, 2, 3});
            Tensor loss;
            for (const auto& p : params)
              loss = loss.defined()
                         ? add(loss, sum(agent.rpc_sync<Tensor>(p.owner().name, "scaled", p, x)))
                         : sum(agent.rpc_sync<Tensor>(p.owner().name, "scaled", p, x));
            if (backward_and_step) {
              opt.backward_and_step(ctx.id(), {loss});
            } else {
              da::backward(agent, ctx.id(), {loss});
              opt.step(ctx.id());
            }
            context_id_file(ctx.id());
            // The step moved the parameters: 1 - 0.1 * x.
            EXPECT_DOUBLE_EQ(params[2].to_here().data<double>()[2], 1 - 0.1 * 3);
          }
          agent.shutdown();
          trace::stop();
          trace::flush();
        });
    EXPECT_ALL_RANKS_OK(results);
  }

  // The trainer's context id, passed to the test through a file.
  void context_id_file(uint64_t id) {
    std::ofstream out(dir_ / "context_id");
    out << id;
  }
  uint64_t context_id() {
    std::ifstream in(dir_ / "context_id");
    uint64_t id = 0;
    in >> id;
    return id;
  }
  nlohmann::json file(int rank) {
    return test::read_trace((dir_ / ("w" + std::to_string(rank) + ".trace.json")).string());
  }

  test::TempDir tmp_{"gradwire-dist-optim-trace"};
  fs::path dir_ = tmp_.path();
};

TEST_F(DistOptimTrace, StepOnTheTrainerAndEachOwnersStepCarryTheContextId) {
  run(true);
  const uint64_t id = context_id();
  ASSERT_NE(id, 0u);
  const nlohmann::json trainer = file(0);
  const auto steps = test::trace_events(trainer, "dist_optim.step");
  ASSERT_EQ(steps.size(), 1u) << trainer.dump();
  EXPECT_EQ(steps[0].at("cat"), "dist_optim");
  EXPECT_EQ(steps[0].at("args").at("context_id"), id);
  EXPECT_EQ(steps[0].at("args").at("owners"), 2);
  EXPECT_EQ(steps[0].at("args").at("error"), 0);
  EXPECT_TRUE(test::trace_events(trainer, "dist_optim.owner_step").empty());
  const int params_of[] = {0, 2, 1};
  for (int owner = 1; owner <= 2; ++owner) {
    const nlohmann::json f = file(owner);
    const auto served = test::trace_events(f, "dist_optim.owner_step");
    ASSERT_EQ(served.size(), 1u) << f.dump();
    const nlohmann::json& args = served[0].at("args");
    EXPECT_EQ(args.at("context_id"), id);
    EXPECT_EQ(args.at("caller"), 0);
    EXPECT_EQ(args.at("params"), params_of[owner]);
    EXPECT_EQ(args.at("with_grad"), params_of[owner]);
    EXPECT_GT(args.at("request_id").get<int64_t>(), 0);
    // The owner's serving of the call: inside an rpc.serve span of the same request.
    bool inside = false;
    for (const auto& s : test::trace_events(f, "rpc.serve")) {
      if (s.at("args").at("request_id") == args.at("request_id") &&
          test::trace_begin(s) <= test::trace_begin(served[0]) &&
          test::trace_end(served[0]) <= test::trace_end(s) + 0.01) {
        inside = true;
      }
    }
    EXPECT_TRUE(inside) << f.dump();
    // The lock every step on the owner takes, waited for inside the step.
    const auto waits = test::trace_events(f, "dist_optim.wait_lock");
    ASSERT_EQ(waits.size(), 1u);
    EXPECT_GE(test::trace_begin(waits[0]), test::trace_begin(served[0]));
  }
}

// backward_and_step: the owner whose part of the pass ends last (w1's and w2's parts run at
// once, after the trainer's has sent them their gradients) is sent its step while the pass
// runs and steps once its part is over, the other after the pass; here the parts are so
// short that the pass may be over before that step is sent, and then both are stepped after
// it. Either way each owner steps exactly once, the trainer's span says which way it went,
// and the parameters move as with backward() then step() (checked in run()). That the early
// step is taken is shown in dist_optim_test (BackwardAndStepStepsTheLastOwnerDuringThePass).
TEST_F(DistOptimTrace, BackwardAndStepStepsTheLastOwnerAsItsPartEnds) {
  run(true, /*backward_and_step=*/true);
  const uint64_t id = context_id();
  ASSERT_NE(id, 0u);
  const nlohmann::json trainer = file(0);
  const auto calls = test::trace_events(trainer, "dist_optim.backward_and_step");
  ASSERT_EQ(calls.size(), 1u) << trainer.dump();
  EXPECT_EQ(calls[0].at("args").at("context_id"), id);
  EXPECT_EQ(calls[0].at("args").at("owners"), 2);
  const int sent_early = calls[0].at("args").at("early").get<int>();
  EXPECT_EQ(calls[0].at("args").at("error"), 0);
  int early = 0;
  for (int owner = 1; owner <= 2; ++owner) {
    const nlohmann::json f = file(owner);
    const auto served = test::trace_events(f, "dist_optim.owner_step");
    ASSERT_EQ(served.size(), 1u) << f.dump();
    EXPECT_EQ(served[0].at("args").at("context_id"), id);
    // The early step's request waited on its owner for the part to end, then stepped.
    const auto waited = test::trace_events(f, "dist_optim.wait_part");
    for (const auto& w : waited) {
      EXPECT_EQ(w.at("args").at("context_id"), id);
      EXPECT_EQ(w.at("args").at("caller"), 0);
      EXPECT_EQ(w.at("args").at("error"), 0);
      EXPECT_LE(test::trace_end(w), test::trace_begin(served[0]) + 0.01);
    }
    early += static_cast<int>(waited.size());
  }
  EXPECT_EQ(early, sent_early);
}

TEST_F(DistOptimTrace, TracingOffRecordsNothing) {
  run(false);
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(test::trace_events(file(rank)).empty()) << "w" << rank;
}

}  // namespace
}  // namespace gradwire

// dist_autograd/'s trace spans over two processes: w0 runs a backward through a call to w1.
// The initiator records the whole pass (dist_autograd.backward), its discovery, its wait
// for the others (dist_autograd.wait), each node it runs (dist_autograd.node, named after
// the node), the gradients it sends (dist_autograd.propagate: peer, bytes) and receives
// (dist_autograd.propagate_recv: caller), and the context's release; w1 records the
// discovery request, its nodes, the gradients in and out, and the release request. Every
// span carries the real context id; the byte counts are the real gradients'. Tracing off
// records nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gradwire/autograd/node.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/temp_dir.h"
#include "support/trace_file.h"

namespace gradwire {
namespace {

namespace fs = std::filesystem;
namespace da = dist_autograd;

constexpr double kSlackUs = 0.01;

class DistAutogradTrace : public ::testing::Test {
 protected:
  // w0: y = w1.square(x) for a leaf x of 4 float64, backward of sum(y), then the context's
  // release. Each process writes what it recorded to DIR/w<rank>.trace.json at the end;
  // w0 also writes the context id and the names of the nodes of its local graph.
  void run(bool traced) {
    rpc::Registry reg;
    reg.def("square", [](const Tensor& x) { return mul(x, x); });
    const std::string dir = dir_.string();
    test::RankResults results = test::run_agent_processes(
        "dist-autograd-trace", 2, test::agent_options(reg),
        [&](int rank, c10d::Store&, rpc::RpcAgent& agent) {
          trace::clear();
          if (traced) trace::start(dir);
          trace::set_directory(dir);
          if (rank == 0) {
            std::ofstream facts(dir_ / "facts");
            {
              da::Context ctx(agent);
              Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
              x.set_requires_grad(true);
              Tensor y = agent.rpc_sync<Tensor>("w1", "square", x);
              Tensor loss = sum(y);
              facts << ctx.id() << "\n";
              // The nodes of this worker's graph below the loss, as the engine names them.
              std::vector<autograd::Node*> stack{autograd::gradient_edge(loss).function.get()};
              std::set<autograd::Node*> seen;
              while (!stack.empty()) {
                autograd::Node* node = stack.back();
                stack.pop_back();
                if (node == nullptr || !seen.insert(node).second) continue;
                facts << node->name() << "\n";
                for (const auto& e : node->next_edges())
                  stack.push_back(e.function.get());
              }
              // What the node of a product is called (w1 runs one).
              Tensor a = tensor(std::vector<double>{1});
              a.set_requires_grad(true);
              facts << "mul " << autograd::gradient_edge(mul(a, a)).function->name() << "\n";
              da::backward(agent, ctx.id(), {loss});
              const Tensor g = da::get_gradients(agent, ctx.id()).at(x);
              EXPECT_DOUBLE_EQ(g.data<double>()[1], -4.0);  // d/dx sum(x^2) = 2x
            }
          }
          agent.shutdown();
          trace::stop();
          trace::flush();
        });
    EXPECT_ALL_RANKS_OK(results);
  }

  nlohmann::json file(int rank) {
    return test::read_trace((dir_ / ("w" + std::to_string(rank) + ".trace.json")).string());
  }

  test::TempDir tmp_{"gradwire-dist-autograd-trace"};
  fs::path dir_ = tmp_.path();
};

// The names of the dist_autograd.node spans of `file` in context `id`.
std::multiset<std::string> nodes(const nlohmann::json& file, uint64_t id) {
  std::multiset<std::string> out;
  for (const auto& e : test::trace_events(file, "dist_autograd.node")) {
    if (e.at("args").at("context_id") == id) out.insert(e.at("args").at("node"));
  }
  return out;
}

TEST_F(DistAutogradTrace, APassAcrossTwoWorkersIsTracedWithItsContextNodesAndBytes) {
  run(true);
  std::ifstream facts(dir_ / "facts");
  uint64_t id = 0;
  facts >> id;
  ASSERT_NE(id, 0u);
  std::vector<std::string> local;
  std::string mul_name;
  for (std::string line; std::getline(facts, line);) {
    if (line.rfind("mul ", 0) == 0) {
      mul_name = line.substr(4);
    } else if (!line.empty()) {
      local.push_back(line);
    }
  }
  ASSERT_FALSE(local.empty());
  const uint64_t grad_bytes = 4 * sizeof(double);

  const nlohmann::json w0 = file(0);
  const auto passes = test::trace_events(w0, "dist_autograd.backward");
  ASSERT_EQ(passes.size(), 1u) << w0.dump();
  const nlohmann::json& pass = passes[0];
  EXPECT_EQ(pass.at("cat"), "dist_autograd");
  EXPECT_EQ(pass.at("args").at("context_id"), id);
  EXPECT_EQ(pass.at("args").at("error"), 0);
  const double begin = test::trace_begin(pass), end = test::trace_end(pass) + kSlackUs;
  // Discovery (both workers), then the wait: inside the pass.
  for (const char* name : {"dist_autograd.discovery", "dist_autograd.wait"}) {
    const auto spans = test::trace_events(w0, name);
    ASSERT_EQ(spans.size(), 1u) << name;
    EXPECT_EQ(spans[0].at("args").at("context_id"), id) << name;
    EXPECT_EQ(spans[0].at("args").at("workers"), 2) << name;
    EXPECT_GE(test::trace_begin(spans[0]), begin) << name;
    EXPECT_LE(test::trace_end(spans[0]), end) << name;
  }
  // Every node of the local graph ran, by name, in the pass; and the send node of x, which
  // the gradient from w1 came back through.
  const std::multiset<std::string> ran0 = nodes(w0, id);
  for (const std::string& name : local)
    EXPECT_EQ(ran0.count(name), 1u) << name << " in " << w0.dump();
  EXPECT_EQ(ran0.count("SendRpcBackward"), 1u);
  for (const auto& e : test::trace_events(w0, "dist_autograd.node")) {
    EXPECT_GE(test::trace_begin(e), begin);
    EXPECT_LE(test::trace_end(e), end);
  }
  // The gradient of y to w1, and x's back from it: 4 float64 each way.
  const auto sent0 = test::trace_events(w0, "dist_autograd.propagate");
  ASSERT_EQ(sent0.size(), 1u);
  EXPECT_EQ(sent0[0].at("args").at("context_id"), id);
  EXPECT_EQ(sent0[0].at("args").at("peer"), 1);
  EXPECT_EQ(sent0[0].at("args").at("bytes"), grad_bytes);
  const auto got0 = test::trace_events(w0, "dist_autograd.propagate_recv");
  ASSERT_EQ(got0.size(), 1u);
  EXPECT_EQ(got0[0].at("args").at("context_id"), id);
  EXPECT_EQ(got0[0].at("args").at("caller"), 1);
  EXPECT_EQ(got0[0].at("args").at("bytes"), grad_bytes);
  // The release, after the pass.
  const auto released = test::trace_events(w0, "dist_autograd.release");
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].at("args").at("context_id"), id);
  EXPECT_GE(test::trace_begin(released[0]) + kSlackUs, test::trace_end(pass));

  const nlohmann::json w1 = file(1);
  const auto discovered = test::trace_events(w1, "dist_autograd.discover_recv");
  ASSERT_EQ(discovered.size(), 1u) << w1.dump();
  EXPECT_EQ(discovered[0].at("args").at("context_id"), id);
  EXPECT_EQ(discovered[0].at("args").at("caller"), 0);
  const std::multiset<std::string> ran1 = nodes(w1, id);
  EXPECT_EQ(ran1.count("SendRpcBackward"), 1u) << w1.dump();
  EXPECT_EQ(ran1.count("RecvRpcBackward"), 1u);
  EXPECT_EQ(ran1.count(mul_name), 1u) << mul_name;
  const auto got1 = test::trace_events(w1, "dist_autograd.propagate_recv");
  ASSERT_EQ(got1.size(), 1u);
  EXPECT_EQ(got1[0].at("args").at("caller"), 0);
  EXPECT_EQ(got1[0].at("args").at("context_id"), id);
  EXPECT_EQ(got1[0].at("args").at("bytes"), grad_bytes);
  const auto sent1 = test::trace_events(w1, "dist_autograd.propagate");
  ASSERT_EQ(sent1.size(), 1u);
  EXPECT_EQ(sent1[0].at("args").at("peer"), 0);
  EXPECT_EQ(sent1[0].at("args").at("bytes"), grad_bytes);
  const auto release1 = test::trace_events(w1, "dist_autograd.release_recv");
  ASSERT_EQ(release1.size(), 1u);
  EXPECT_EQ(release1[0].at("args").at("context_id"), id);
  EXPECT_EQ(release1[0].at("args").at("caller"), 0);
}

TEST_F(DistAutogradTrace, TracingOffRecordsNothing) {
  run(false);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_TRUE(test::trace_events(file(rank)).empty()) << "w" << rank;
}

}  // namespace
}  // namespace gradwire

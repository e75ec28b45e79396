// rref/'s trace spans over three processes: w0 creates a tensor on w1 (Create), forks the
// reference to w2 (AddFork from w2 to the owner, ChildAccepted from the owner to w0), and
// both let it go (Delete). Each message is a span rref.send on its sender (to its reply)
// and rref.handle on its receiver, with the operation, the reference's id (minting worker
// and local part), the peer and the outcome. Tracing off records nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gradwire/core/trace.h"
#include "gradwire/rpc/ids.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/temp_dir.h"
#include "support/trace_file.h"

namespace gradwire {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using rref::RRef;

class RRefTrace : public ::testing::Test {
 protected:
  // Every process writes what it recorded to DIR/w<rank>.trace.json once its agent is
  // down; w0 writes the reference's id to DIR/rref_id.
  void run(bool traced) {
    rpc::Registry reg;
    reg.def("make", [](int64_t n) { return full({n}, Scalar(2.0), kFloat64); });
    reg.def("sum_of", [](const RRef<Tensor>& r) { return sum(r.to_here()).item<double>(); });
    const std::string dir = dir_.string();
    test::RankResults results = test::run_agent_processes(
        "rref-trace", 3, test::agent_options(reg),
        [&](int rank, c10d::Store& store, rpc::RpcAgent& agent) {
          trace::clear();
          if (traced) trace::start(dir);
          trace::set_directory(dir);
          if (rank == 0) {
            {
              RRef<Tensor> r = rref::remote<Tensor>(agent, "w1", "make", int64_t{3});
              EXPECT_DOUBLE_EQ(agent.rpc_sync<double>("w2", "sum_of", r), 6.0);
              std::ofstream(dir_ / "rref_id") << r.core_ptr()->rref_id();
            }
            // Every settlement of the fork and the deletes answered.
            rref::wait_idle(agent, 20s);
            store.set("used", "1");
          } else {
            // w2's Delete goes once the owner has counted its fork: each worker's messages
            // are answered before the agents shut down (which stops sending them).
            store.wait({"used"}, 30s);
            rref::wait_idle(agent, 20s);
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

  test::TempDir tmp_{"gradwire-rref-trace"};
  fs::path dir_ = tmp_.path();
};

// The spans `name` of `file` with operation `op`.
std::vector<nlohmann::json> messages(const nlohmann::json& file, const char* name,
                                     const std::string& op) {
  std::vector<nlohmann::json> out;
  for (const auto& e : test::trace_events(file, name)) {
    if (e.at("args").at("op") == op) out.push_back(e);
  }
  return out;
}

TEST_F(RRefTrace, CreateForkAndDeleteAreSpansOnBothSidesWithTheReferencesId) {
  run(true);
  uint64_t id = 0;
  std::ifstream(dir_ / "rref_id") >> id;
  ASSERT_NE(id, 0u);
  const int minter = rpc::minter_of(id);
  const uint64_t local = id & ((uint64_t{1} << rpc::kIdMinterShift) - 1);
  EXPECT_EQ(minter, 0);
  auto about_it = [&](const nlohmann::json& e) {
    return e.at("cat") == "rref" && e.at("args").at("rref_worker") == minter &&
           e.at("args").at("rref_local") == local;
  };
  const nlohmann::json w0 = file(0), w1 = file(1), w2 = file(2);

  // Create: w0 -> w1.
  const auto creates = messages(w0, "rref.send", "create");
  ASSERT_EQ(creates.size(), 1u) << w0.dump();
  EXPECT_TRUE(about_it(creates[0])) << creates[0].dump();
  EXPECT_EQ(creates[0].at("args").at("peer"), 1);
  EXPECT_EQ(creates[0].at("args").at("outcome"), "ok");
  const auto created = messages(w1, "rref.handle", "create");
  ASSERT_EQ(created.size(), 1u) << w1.dump();
  EXPECT_TRUE(about_it(created[0])) << created[0].dump();
  EXPECT_EQ(created[0].at("args").at("peer"), 0);
  EXPECT_NE(created[0].at("args").at("outcome"), "error");

  // The fork w2 received: counted by the owner, and its acceptance told to w0.
  const auto adds = messages(w2, "rref.send", "add_fork");
  ASSERT_EQ(adds.size(), 1u) << w2.dump();
  EXPECT_TRUE(about_it(adds[0])) << adds[0].dump();
  EXPECT_EQ(adds[0].at("args").at("peer"), 1);
  const auto added = messages(w1, "rref.handle", "add_fork");
  ASSERT_EQ(added.size(), 1u);
  EXPECT_TRUE(about_it(added[0]));
  EXPECT_EQ(added[0].at("args").at("peer"), 2);
  EXPECT_EQ(added[0].at("args").at("outcome"), "ok");
  const auto accepted = messages(w0, "rref.handle", "child_accepted");
  ASSERT_EQ(accepted.size(), 1u) << w0.dump();
  EXPECT_EQ(accepted[0].at("args").at("peer"), 1);
  EXPECT_EQ(messages(w1, "rref.send", "child_accepted").size(), 1u);

  // Both users let it go: a Delete each, handled by the owner.
  for (int user : {0, 2}) {
    const auto deletes = messages(user == 0 ? w0 : w2, "rref.send", "delete");
    ASSERT_EQ(deletes.size(), 1u) << "w" << user;
    EXPECT_TRUE(about_it(deletes[0]));
    EXPECT_EQ(deletes[0].at("args").at("peer"), 1);
    EXPECT_EQ(deletes[0].at("args").at("outcome"), "ok");
  }
  const auto deleted = messages(w1, "rref.handle", "delete");
  ASSERT_EQ(deleted.size(), 2u) << w1.dump();
  for (const auto& e : deleted) {
    EXPECT_TRUE(about_it(e));
    EXPECT_EQ(e.at("args").at("outcome"), "ok");
  }
}

TEST_F(RRefTrace, TracingOffRecordsNothing) {
  run(false);
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(test::trace_events(file(rank)).empty()) << "w" << rank;
}

}  // namespace
}  // namespace gradwire

// hybrid_train run as a user runs it (one server, two trainers under gradwire-run): with
// each choice of DDP options, the trainers' dense replicas must end identical — DDP's
// averaged gradients reach the dist_autograd context the DistributedOptimizer steps from.
// The example itself compares the replicas (an all-gather of every parameter value, compared
// exactly) and exits non-zero when they differ; here both trainers' "done" lines are
// required. (Their accuracies may differ: each evaluates against the server's embedding
// table at its own moment.)
#include <gtest/gtest.h>

#include <string>

#include "support/command.h"

namespace {

#ifdef GRADWIRE_HYBRID_TRAIN_PATH
std::string run(const std::string& args, int& status) {
  const std::string command = std::string(GRADWIRE_RUN_PATH) + " --nproc-per-node 3 " +
                              GRADWIRE_HYBRID_TRAIN_PATH + " " + args;
  return gradwire::test::run_command(command, status);
}

std::string expect_identical_replicas(const std::string& options, const std::string& more = "") {
  int status = 0;
  const std::string out =
      run("--epochs 3 --min-accuracy 0 --ddp-options " + options + " " + more, status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("replicas differ"), std::string::npos) << out;
  for (const char* name : {"trainer1", "trainer2"}) {
    EXPECT_NE(out.find(std::string(name) + " done: held-out accuracy"), std::string::npos)
        << name << "\n"
        << out;
    EXPECT_NE(out.find("dense replicas identical on 2 trainers"), std::string::npos) << out;
  }
  return out;
}
#endif

TEST(HybridTrain, DefaultDdpOptionsKeepTheReplicasIdentical) {
#ifndef GRADWIRE_HYBRID_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  // The trainers share this host and its network namespace: the default "cpu" backend is
  // shared memory.
  const std::string out = expect_identical_replicas("default");
  EXPECT_NE(out.find("DDP among 2 trainers over the shm backend"), std::string::npos) << out;
#endif
}

TEST(HybridTrain, GlooChosenByNameKeepsTheReplicasIdenticalAndABadBackendIsRefused) {
#ifndef GRADWIRE_HYBRID_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  const std::string out = expect_identical_replicas("default", "--backend gloo");
  EXPECT_NE(out.find("DDP among 2 trainers over the gloo backend"), std::string::npos) << out;
  int status = 0;
  const std::string bad = run("--backend mpi", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("--backend=\"mpi\" is invalid: expected cpu, shm or gloo"), std::string::npos)
      << bad;
#endif
}

TEST(HybridTrain, FindUnusedParametersKeepsTheReplicasIdentical) {
#ifndef GRADWIRE_HYBRID_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  expect_identical_replicas("find-unused");
#endif
}

TEST(HybridTrain, StaticGraphAndBucketViewsKeepTheReplicasIdentical) {
#ifndef GRADWIRE_HYBRID_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  expect_identical_replicas("static-graph");
  expect_identical_replicas("bucket-view");
  int status = 0;
  const std::string bad = run("--ddp-options fast", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("--ddp-options=\"fast\" is invalid"), std::string::npos) << bad;
#endif
}

}  // namespace

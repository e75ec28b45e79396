// ps_train as an elastic job under gradwire-run --role (docs/elastic.md): trainers that join
// the running job mid-epoch, a trainer that leaves it, and a late trainer killed while the
// job goes on. Each trainer checks its own held-out accuracy (--min-accuracy, 0.85 by
// default) and fails the run below it.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>
#include <vector>

#ifdef GRADWIRE_PS_TRAIN_PATH
// The launcher's test helpers need its path, which only a build with the examples gives.
#include "tools/launch.h"
#endif

namespace {

#ifdef GRADWIRE_PS_TRAIN_PATH
using namespace gradwire::testing::launcher;

// One node's launcher of the job at `endpoint`: the job forms with the first node (and any
// that arrive within 200 ms); later nodes join it.
std::vector<std::string> node(const std::string& endpoint, std::vector<std::string> roles,
                              std::vector<std::string> flags) {
  std::vector<std::string> args = {
      "--rdzv-endpoint",          endpoint, "--rdzv-id",      "ps-elastic", "--nnodes",   "1:4",
      "--rdzv-last-call",         "200ms",  "--rdzv-timeout", "30s",        "--grace-ms", "2000",
      "--rdzv-heartbeat-timeout", "1s"};
  args.insert(args.end(), roles.begin(), roles.end());
  args.push_back(GRADWIRE_PS_TRAIN_PATH);
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}
#endif

// One server and two trainers form the job; while they train a third trainer's node joins
// (mid-epoch), and trainer2 leaves after 40 batches. Nobody restarts; the server serves the
// joiner and stops waiting for the leaver; every trainer that stays to the end reaches its
// accuracy.
TEST(PsElastic, ATrainerJoinsTheRunningJobMidEpochAndAnotherLeavesIt) {
#ifndef GRADWIRE_PS_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(node(ep, {"--role", "server:1:critical", "--role", "trainer:2"},
                    {"--epochs", "30", "--leave-after", "300"}));
  ASSERT_TRUE(first.read_until(
      [](const std::string& out, const std::string&) { return has(out, "trainer1 epoch  1/30"); },
      60s))
      << first.out() << first.err();
  Launch late(node(ep, {"--role", "trainer:1"}, {"--epochs", "6"}));
  ASSERT_EQ(late.wait(90s), 0) << late.out() << late.err();
  ASSERT_EQ(first.wait(90s), 0) << first.out() << first.err();
  for (const char* line : {"trainer3 joined the running job as rank 3", "trainer3 epoch  6/6",
                           "trainer3 done: held-out accuracy"})
    EXPECT_TRUE(has(late.out(), line)) << line << "\n" << late.out();
  for (const char* line :
       {"ps0: trainer3 joined the job; serving it", "trainer2 leaves the job after 300 batches",
        "ps0: trainer2 left the job", "trainer1 done: held-out accuracy"})
    EXPECT_TRUE(has(first.out(), line)) << line << "\n" << first.out();
  // It joined while the first trainers trained: trainer1 went on for epochs after it came.
  EXPECT_LT(first.out().find("ps0: trainer3 joined the job"),
            first.out().find("trainer1 epoch 30/30"))
      << first.out();
  EXPECT_FALSE(has(first.out(), "trainer2 done")) << first.out();
  EXPECT_EQ(count(first.out(), "serving shard 1 of 1"), 1u) << "the server never restarted";
#endif
}

// A late trainer's node is SIGKILLed while it trains: its worker dies with the launcher, the
// server releases what it held and its trainer group stops waiting for it, and the job the
// first node runs ends as it would have.
TEST(PsElastic, KillingALateTrainerLeavesTheJobRunning) {
#ifndef GRADWIRE_PS_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(
      node(ep, {"--role", "server:1:critical", "--role", "trainer:2"}, {"--epochs", "30"}));
  ASSERT_TRUE(first.read_until(
      [](const std::string& out, const std::string&) { return has(out, "trainer1 epoch  1/30"); },
      60s))
      << first.out() << first.err();
  Launch late(node(ep, {"--role", "trainer:1"}, {"--epochs", "30"}));
  ASSERT_TRUE(late.read_until(
      [](const std::string& out, const std::string&) { return has(out, "trainer3 epoch  1/30"); },
      60s))
      << late.out() << late.err();
  ::kill(late.pid(), SIGKILL);
  late.wait(10s);
  ASSERT_EQ(first.wait(90s), 0) << first.out() << first.err();
  for (const char* line : {"ps0: trainer3 joined the job", "ps0: lost trainer3",
                           "trainer1 done: held-out accuracy", "trainer2 done: held-out accuracy"})
    EXPECT_TRUE(has(first.out(), line)) << line << "\n" << first.out();
#endif
}

}  // namespace

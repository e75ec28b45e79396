// ps_train's checkpoints, run as a user runs them: one server and one trainer for four
// epochs; then two epochs with --checkpoint DIR and two more with --resume, which must end
// with the very same parameters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "support/command.h"

namespace {

#ifdef GRADWIRE_PS_TRAIN_PATH
// Runs `args` under the launcher (with `launcher` flags); returns the output, and the exit
// status in `status`.
std::string run(const std::string& args, int& status,
                const std::string& launcher = "--nproc-per-node 2") {
  const std::string command =
      std::string(GRADWIRE_RUN_PATH) + " " + launcher + " " + GRADWIRE_PS_TRAIN_PATH + " " + args;
  return gradwire::test::run_command(command, status);
}

std::string checksum_of(const std::string& out) {
  const size_t at = out.find("parameter checksum ");
  if (at == std::string::npos) return "(none)";
  return out.substr(at + 19, out.find('\n', at) - at - 19);
}
#endif

TEST(PsTrain, ResumingFromACheckpointEndsWhereAnUninterruptedRunDoes) {
#ifndef GRADWIRE_PS_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-ps-checkpoint-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  int status = 0;
  const std::string straight = run("--epochs 4 --min-accuracy 0", status);
  ASSERT_EQ(status, 0) << straight;
  const std::string first = run("--epochs 2 --min-accuracy 0 --checkpoint " + dir.string(), status);
  ASSERT_EQ(status, 0) << first;
  EXPECT_TRUE(std::filesystem::exists(dir / "model-0.gw"));
  EXPECT_TRUE(std::filesystem::exists(dir / "optimizer-1.gw"));
  const std::string resumed =
      run("--epochs 4 --min-accuracy 0 --checkpoint " + dir.string() + " --resume", status);
  ASSERT_EQ(status, 0) << resumed;
  EXPECT_NE(resumed.find("resumed after epoch 2"), std::string::npos) << resumed;
  EXPECT_EQ(checksum_of(resumed), checksum_of(straight)) << straight << resumed;
  EXPECT_NE(checksum_of(first), checksum_of(straight));
  const std::string bad = run("--resume", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("--resume needs --checkpoint DIR"), std::string::npos) << bad;
  const std::string bad_lr = run("--lr abc", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad_lr.find("--lr=\"abc\" is invalid"), std::string::npos) << bad_lr;
  std::filesystem::remove_all(dir);
#endif
}

// A trainer SIGKILLed mid-training: the launcher starts it again alone, it rejoins the running
// job under its name, the server (which released what the dead one held) serves it, the
// other trainer never stops, and both reach the accuracy they must (--min-accuracy, 0.85 by
// default; single runs reach about 0.95).
TEST(PsTrain, AKilledTrainerIsRestartedAndRejoinsWhileTrainingGoesOn) {
#ifndef GRADWIRE_PS_TRAIN_PATH
  GTEST_SKIP() << "the examples are not built";
#else
  int status = 0;
  const std::string out =
      run("--epochs 6 --kill-trainer-after 15", status, "--nproc-per-node 3 --restart-workers 1");
  ASSERT_EQ(status, 0) << out;
  for (const char* line :
       {"trainer1: killing itself after 15 batches", "rank 1 failed (exit status 137)",
        "ps0: lost trainer1", "released its references and autograd contexts",
        "ps0: trainer1 rejoined (incarnation 1)",
        "trainer1 rejoined the running job (incarnation 1)", "trainer1 done: held-out accuracy",
        "trainer2 done: held-out accuracy"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  // The survivor trained every epoch once, without a restart.
  EXPECT_EQ(out.find("trainer2 rejoined"), std::string::npos) << out;
  // Without --restart-workers the first failure ends the job.
  const std::string ended = run("--epochs 6 --kill-trainer-after 15", status, "--nproc-per-node 3");
  EXPECT_NE(status, 0) << ended;
  EXPECT_NE(ended.find("rank 1 failed (exit status 137); stopping the others"), std::string::npos)
      << ended;
#endif
}

}  // namespace

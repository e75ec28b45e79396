// gradwire-ckpt as users run it: inspect prints a checkpoint, refuses a bad one (exit 1)
// and bad arguments (exit 2).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "support/command.h"
#include "support/temp_dir.h"
#include "util.h"

namespace gradwire::checkpoint {
namespace {

namespace fs = std::filesystem;

struct ToolRun {
  std::string out;
  int code = -1;
};

ToolRun ckpt(const std::string& args) {
  int status = 0;
  ToolRun r;
  r.out = gradwire::test::run_command(std::string(GRADWIRE_CKPT_PATH) + " " + args, status);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class CheckpointTool : public ::testing::Test {
 protected:
  gradwire::test::TempDir tmp_{"gradwire-ckpt-tool"};
  std::string dir() const { return tmp_.path().string(); }
};

TEST_F(CheckpointTool, InspectPrintsShardsTensorsAndRows) {
  const test::TwoServers two;
  write_shard(dir(), "ps0", 3, two.shard(0));
  write_shard(dir(), "ps1", 4, two.shard(1));
  const ToolRun r = ckpt("inspect '" + dir() + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const std::string& line : {
           "checkpoint " + dir() + "\n",
           std::string("shards (2):\n"),
           std::string("  ps0  seq 3  replicated no  optimizer Adagrad  rng 10 bytes  counters "
                       "epoch=2 step=40\n"),
           std::string("  ps1  seq 4  replicated no"),
           std::string("parameters (2):\n  bias  float32  [4]  whole: ps0, ps1\n"
                       "  emb.weight  float32  [10,4]  [0,5) ps0; [5,10) ps1\n"),
           std::string("optimizer state (3):\n"),
           std::string("  emb.weight/step  int64  []  whole: ps0, ps1\n"),
           std::string("  emb.weight/sum  float32  [10,4]  [0,5) ps0; [5,10) ps1\n"),
       }) {
    EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << r.out;
  }
  const ToolRun at = ckpt("inspect '" + dir() + "' --seq 3");
  EXPECT_EQ(at.code, 1) << at.out;
  EXPECT_NE(at.out.find("shard 'ps1' is missing"), std::string::npos) << at.out;
}

TEST_F(CheckpointTool, BadArgumentsExitTwoAndBadCheckpointsExitOne) {
  for (const std::string& args : {std::string(""), std::string("inspect"), std::string("list x"),
                                  std::string("inspect x --seq"), std::string("inspect x --seq -3"),
                                  std::string("inspect x --sequence 3")}) {
    const ToolRun r = ckpt(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("usage: gradwire-ckpt inspect DIR [--seq N]"), std::string::npos) << r.out;
  }
  EXPECT_EQ(ckpt("--help").code, 0);

  const ToolRun none = ckpt("inspect '" + (tmp_.path() / "none").string() + "'");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.out.find("is not a directory"), std::string::npos) << none.out;

  const test::TwoServers two;
  write_shard(dir(), "ps0", 1, two.shard(0));
  write_shard(dir(), "ps1", 1, two.shard(1));
  const fs::path manifest = tmp_.path() / "ps0" / "000000000001" / "MANIFEST";
  fs::resize_file(manifest, fs::file_size(manifest) - 5);
  const ToolRun bad = ckpt("inspect '" + dir() + "'");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find(manifest.string() + ": truncated"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace gradwire::checkpoint

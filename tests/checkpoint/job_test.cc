// A job's shards read together: resharded into another number of shards bit for bit, a
// replica loaded into several ranks, and missing or inconsistent shards refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "gradwire/core/error.h"
#include "support/error_text.h"
#include "support/eventually.h"
#include "support/harness.h"
#include "support/temp_dir.h"
#include "util.h"

namespace gradwire::checkpoint {
namespace {

namespace fs = std::filesystem;
using gradwire::test::error_text;
using test::bits_equal;
using test::TwoServers;
using test::values;

class CheckpointJob : public ::testing::Test {
 protected:
  gradwire::test::TempDir tmp_{"gradwire-ckpt-job"};
  std::string dir() const { return tmp_.path().string(); }
  TwoServers two_;
  void write_two(int64_t seq = 3) {
    write_shard(dir(), "ps0", seq, two_.shard(0));
    write_shard(dir(), "ps1", seq, two_.shard(1));
  }
};

const Piece& find(const std::vector<Piece>& pieces, const std::string& name) {
  for (const Piece& p : pieces)
    if (p.name == name) return p;
  throw std::runtime_error("no piece " + name);
}

TEST_F(CheckpointJob, TwoServersLoadIntoThreeAndIntoOneBitForBit) {
  write_two();
  const Checkpoint c = Checkpoint::open(dir());
  EXPECT_EQ(c.shards(), (std::vector<std::string>{"ps0", "ps1"}));
  EXPECT_EQ(c.param_names(), (std::vector<std::string>{"bias", "emb.weight"}));
  EXPECT_EQ(c.optimizer_names(),
            (std::vector<std::string>{"bias/sum", "emb.weight/step", "emb.weight/sum"}));
  EXPECT_EQ(c.global_sizes("emb.weight"), (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(c.global_sizes("bias/sum"), (std::vector<int64_t>{4}));
  EXPECT_TRUE(bits_equal(c.read("emb.weight"), two_.table));
  EXPECT_TRUE(bits_equal(c.read("emb.weight", 3, 8), two_.table.slice(0, 3, 8)));
  EXPECT_TRUE(bits_equal(c.read("emb.weight", 4, 4), two_.table.slice(0, 4, 4)));
  EXPECT_TRUE(bits_equal(c.read_optimizer("emb.weight/sum", 0, 10), two_.table_sum));

  for (int count : {3, 1}) {
    for (int i = 0; i < count; ++i) {
      SCOPED_TRACE("shard " + std::to_string(i) + " of " + std::to_string(count));
      const ShardState s = c.reshard(i, count);
      const auto [first, last] = row_range(10, i, count);
      const Piece& emb = find(s.params, "emb.weight");
      EXPECT_TRUE(bits_equal(emb.value, two_.table.slice(0, first, last)));
      EXPECT_EQ(emb.global_sizes, (std::vector<int64_t>{10, 4}));
      EXPECT_EQ(emb.row_offset, first);
      EXPECT_TRUE(bits_equal(find(s.params, "bias").value, two_.bias));
      const Piece& sum = find(s.optimizer, "emb.weight/sum");
      EXPECT_TRUE(bits_equal(sum.value, two_.table_sum.slice(0, first, last)));
      EXPECT_EQ(sum.row_offset, first);
      EXPECT_TRUE(bits_equal(find(s.optimizer, "bias/sum").value, two_.bias_sum));
      // Whole entries come from the first shard that holds them (ps0's step is 7).
      EXPECT_EQ(find(s.optimizer, "emb.weight/step").value.item<int64_t>(), 7);
      EXPECT_EQ(s.optimizer_kind, "Adagrad");
      ASSERT_EQ(s.optimizer_hyper.size(), 1u);
      EXPECT_EQ(s.optimizer_hyper[0].second.item<double>(), 0.1);
      EXPECT_EQ(s.counters, two_.shard(0).counters);
      EXPECT_EQ(s.rng, two_.shard(0).rng);
      EXPECT_TRUE(s.job_shards.empty());
    }
  }

  // The three new shards written as a job of their own read back as the same tensors.
  const std::string three = (tmp_.path() / "three").string();
  for (int i = 0; i < 3; ++i) {
    ShardState s = c.reshard(i, 3);
    s.job_shards = {"a", "b", "c"};
    write_shard(three, std::string(1, static_cast<char>('a' + i)), 1, s);
  }
  const Checkpoint again = Checkpoint::open(three);
  EXPECT_TRUE(bits_equal(again.read("emb.weight"), two_.table));
  EXPECT_TRUE(bits_equal(again.read_optimizer("emb.weight/sum"), two_.table_sum));
  EXPECT_TRUE(bits_equal(again.read("bias"), two_.bias));
}

TEST_F(CheckpointJob, MissingShardIsRefusedNamingIt) {
  write_shard(dir(), "ps0", 3, two_.shard(0));
  const std::string text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("shard 'ps1' is missing: the job's shards are [ps0, ps1]"), std::string::npos)
      << text;
  // A shard whose only snapshot was interrupted is missing as well.
  write_shard(dir(), "ps1", 3, two_.shard(1));
  fs::remove(tmp_.path() / "ps1" / "000000000003" / "MANIFEST");
  EXPECT_NE(
      error_text<InvalidArgument>([&] { Checkpoint::open(dir()); }).find("shard 'ps1' is missing"),
      std::string::npos);
}

TEST_F(CheckpointJob, GapOrOverlapAcrossShardsIsRefusedNamingTensorAndRows) {
  ShardState s0 = two_.shard(0), s1 = two_.shard(1);
  s1.params[0] = {"emb.weight", two_.table.slice(0, 6, 10).clone(), {10, 4}, 6};
  s1.optimizer[0] = {"emb.weight/sum", two_.table_sum.slice(0, 6, 10).clone(), {10, 4}, 6};
  write_shard(dir(), "ps0", 1, s0);
  write_shard(dir(), "ps1", 1, s1);
  std::string text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("rows [5,6) of 'emb.weight' are held by no shard (held: [0,5) ps0; "
                      "[6,10) ps1)"),
            std::string::npos)
      << text;

  s1.params[0] = {"emb.weight", two_.table.slice(0, 4, 10).clone(), {10, 4}, 4};
  s1.optimizer[0] = {"emb.weight/sum", two_.table_sum.slice(0, 4, 10).clone(), {10, 4}, 4};
  write_shard(dir(), "ps1", 2, s1);
  text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("rows [4,5) of 'emb.weight' are held by both 'ps0' and 'ps1'"),
            std::string::npos)
      << text;
}

TEST_F(CheckpointJob, MismatchedShardsAreRefused) {
  ShardState s1 = two_.shard(1);
  s1.params[1].value = two_.bias.to(kFloat64);
  write_shard(dir(), "ps0", 1, two_.shard(0));
  write_shard(dir(), "ps1", 1, s1);
  std::string text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("tensor 'bias': shard 'ps0' holds it as float32 [4] whole, shard 'ps1' as "
                      "float64 [4] whole"),
            std::string::npos)
      << text;

  s1 = two_.shard(1);
  s1.optimizer_kind = "SGD";
  write_shard(dir(), "ps1", 2, s1);
  text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("shard 'ps0' saved a Adagrad optimizer, shard 'ps1' a SGD"),
            std::string::npos)
      << text;

  s1 = two_.shard(1);
  s1.job_shards = {"ps0", "ps1", "ps2"};
  write_shard(dir(), "ps1", 3, s1);
  text = error_text<InvalidArgument>([&] { Checkpoint::open(dir()); });
  EXPECT_NE(text.find("shards 'ps0' and 'ps1' disagree on the job's shards: [ps0, ps1] and "
                      "[ps0, ps1, ps2]"),
            std::string::npos)
      << text;
}

TEST_F(CheckpointJob, OpenAtASeqTakesThatSnapshotOfEveryShard) {
  write_two(1);
  TwoServers later;
  later.table = values({10, 4}, 99);
  write_shard(dir(), "ps0", 2, later.shard(0));
  write_shard(dir(), "ps1", 2, later.shard(1));
  EXPECT_TRUE(bits_equal(Checkpoint::open(dir(), 1).read("emb.weight"), two_.table));
  EXPECT_TRUE(bits_equal(Checkpoint::open(dir()).read("emb.weight"), later.table));
  EXPECT_EQ(Checkpoint::open(dir(), 2).snapshot("ps1").seq, 2);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              Checkpoint::open(dir(), 3);
            }).find("holds no complete snapshot of any shard at seq 3"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              Checkpoint::open((tmp_.path() / "none").string());
            }).find("is not a directory"),
            std::string::npos);
}

TEST_F(CheckpointJob, UnknownNamesAndRowsOutOfRangeAreRefusedNamingThem) {
  write_two();
  const Checkpoint c = Checkpoint::open(dir());
  EXPECT_NE(error_text<InvalidArgument>([&] {
              c.read("emb");
            }).find("no parameter 'emb' (it holds [bias, emb.weight])"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              c.read_optimizer("emb.weight/exp_avg", 0, 1);
            }).find("no optimizer entry 'emb.weight/exp_avg'"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              c.read("emb.weight", 3, 11);
            }).find("rows [3,11) of 'emb.weight' are out of range: it has 10 rows"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] { c.read("bias", 2, 1); }).find("rows [2,1) of 'bias'"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              c.read_optimizer("emb.weight/step", 0, 0);
            }).find("is a 0-d tensor"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] { c.global_sizes("nope"); }).find("'nope'"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] { c.snapshot("ps9"); }).find("no shard 'ps9'"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] { c.reshard(3, 3); }).find("index 3"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] { read_latest(dir(), "a b"); }).find("shard name"),
            std::string::npos);
}

TEST_F(CheckpointJob, DataParallelReplicaSavedOnceLoadsIntoFourRanks) {
  ShardState replica;
  replica.replicated = true;
  replica.params.push_back({"fc.weight", values({3, 8}, 5)});
  replica.params.push_back({"fc.bias", values({3}, 6, kFloat64)});
  replica.counters["step"] = 11;
  write_shard(dir(), "replica", 11, replica);
  const Checkpoint c = Checkpoint::open(dir());
  for (int rank = 0; rank < 4; ++rank) {
    const ShardState s = c.reshard(rank, 4);
    EXPECT_TRUE(s.replicated);
    ASSERT_EQ(s.params.size(), 2u);
    EXPECT_TRUE(bits_equal(find(s.params, "fc.weight").value, replica.params[0].value));
    EXPECT_TRUE(bits_equal(find(s.params, "fc.bias").value, replica.params[1].value));
    EXPECT_TRUE(find(s.params, "fc.weight").global_sizes.empty());
    EXPECT_EQ(s.counters.at("step"), 11);
  }
}

// Two processes each write their shard, several snapshots, while a third opens the job
// checkpoint again and again: every open it makes sees whole snapshots, and it ends with
// both shards' last one.
TEST(CheckpointProcesses, TwoWritersAndAReaderOfTheJob) {
  gradwire::test::TempDir tmp("gradwire-ckpt-procs");
  const std::string dir = tmp.path().string();
  constexpr int64_t kLast = 6;
  // Snapshot `seq` of server `rank`: every value of its rows is seq * 100 + rank.
  const auto state = [](int rank, int64_t seq) {
    const auto [first, last] = row_range(10, rank, 2);
    ShardState s;
    s.job_shards = {"ps0", "ps1"};
    s.params.push_back(
        {"emb", full({last - first, 4}, static_cast<double>(seq * 100 + rank)), {10, 4}, first});
    s.counters["step"] = seq;
    return s;
  };
  const auto check = [](const Checkpoint& c) {
    for (int rank = 0; rank < 2; ++rank) {
      const Snapshot& s = c.snapshot("ps" + std::to_string(rank));
      EXPECT_EQ(s.state.counters.at("step"), s.seq);
      const auto [first, last] = row_range(10, rank, 2);
      const Tensor rows = c.read("emb", first, last);
      EXPECT_TRUE(
          bits_equal(rows, full({last - first, 4}, static_cast<double>(s.seq * 100 + rank))));
    }
  };
  const auto results = gradwire::test::run_ranks_as_processes(
      3,
      [&](int rank) {
        if (rank < 2) {
          for (int64_t seq = 1; seq <= kLast; ++seq)
            write_shard(dir, "ps" + std::to_string(rank), seq, state(rank, seq),
                        WriteOptions{.keep_last = 2});
          return;
        }
        const bool done = gradwire::testing::eventually(
            [&] {
              try {
                const Checkpoint c = Checkpoint::open(dir);
                check(c);
                return c.snapshot("ps0").seq == kLast && c.snapshot("ps1").seq == kLast;
              } catch (const InvalidArgument& e) {
                const std::string text = e.what();
                // Before both writers' first snapshot.
                if (text.find("is missing") != std::string::npos ||
                    text.find("is not a directory") != std::string::npos ||
                    text.find("holds no complete snapshot") != std::string::npos)
                  return false;
                throw;
              }
            },
            std::chrono::seconds(20));
        EXPECT_TRUE(done);
      },
      std::chrono::seconds(30));
  EXPECT_ALL_RANKS_OK(results);
  const Checkpoint c = Checkpoint::open(dir);
  check(c);
  EXPECT_EQ(c.snapshot("ps0").seq, kLast);
  EXPECT_EQ(c.snapshot("ps1").seq, kLast);
}

}  // namespace
}  // namespace gradwire::checkpoint

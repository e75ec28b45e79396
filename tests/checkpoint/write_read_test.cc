// One shard's snapshots: written, read back bit for bit, pruned, skipped when interrupted,
// and refused when corrupt, truncated or badly formed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "gradwire/core/error.h"
#include "support/error_text.h"
#include "support/temp_dir.h"
#include "util.h"

namespace gradwire::checkpoint {
namespace {

namespace fs = std::filesystem;
using gradwire::test::error_text;
using test::bits_equal;
using test::values;

std::string read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A one-shard state of every part: float32, float64 and int64 tensors, one of them split
// (all its rows here), names that need escaping in the manifest.
ShardState every_part() {
  ShardState s;
  s.params.push_back({"w f32", values({3, 5}, 11)});
  s.params.push_back({"w%64", values({6}, 12, kFloat64), {6}, 0});
  s.params.push_back({"ids", arange(int64_t{0}, int64_t{12}).reshape({3, 4}) * int64_t{-7}});
  s.params.push_back({"scalar", scalar_tensor(2.5, TensorOptions(kFloat64))});
  s.optimizer.push_back({"w%64/exp_avg", values({6}, 13, kFloat64), {6}, 0});
  s.optimizer.push_back({"w f32/step", scalar_tensor(int64_t{9}, TensorOptions(kInt64))});
  s.optimizer_kind = "Adam";
  s.optimizer_hyper = {{"hyper.lr", scalar_tensor(1e-3, TensorOptions(kFloat64))},
                       {"hyper.amsgrad", scalar_tensor(true, TensorOptions(kBool))}};
  s.counters = {{"step", 123456789012}, {"epoch", -1}, {"name with space", 3}};
  s.rng = std::string("\0\x01\xff binary\n", 11);
  return s;
}

void expect_same_pieces(const std::vector<Piece>& a, const std::vector<Piece>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(bits_equal(a[i].value, b[i].value)) << a[i].name;
    EXPECT_EQ(a[i].global_sizes, b[i].global_sizes) << a[i].name;
    EXPECT_EQ(a[i].row_offset, b[i].row_offset) << a[i].name;
  }
}

class CheckpointWriteRead : public ::testing::Test {
 protected:
  gradwire::test::TempDir tmp_{"gradwire-ckpt"};
  std::string dir() const { return tmp_.path().string(); }
  fs::path snap(const std::string& shard, int64_t seq) const {
    char name[16];
    std::snprintf(name, sizeof(name), "%012lld", static_cast<long long>(seq));
    return tmp_.path() / shard / name;
  }
};

TEST_F(CheckpointWriteRead, EveryPartRoundTripsBitForBit) {
  const ShardState saved = every_part();
  const std::string path = write_shard(dir(), "w0", 17, saved);
  EXPECT_EQ(path, snap("w0", 17).string());
  for (const char* file : {"MANIFEST", "params.gw", "optimizer.gw", "hyper.gw", "rng.gw"})
    EXPECT_TRUE(fs::exists(snap("w0", 17) / file)) << file;
  const std::optional<Snapshot> got = read_latest(dir(), "w0");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->seq, 17);
  EXPECT_EQ(got->path, path);
  const ShardState& s = got->state;
  expect_same_pieces(s.params, saved.params);
  expect_same_pieces(s.optimizer, saved.optimizer);
  ASSERT_EQ(s.optimizer_hyper.size(), 2u);
  EXPECT_EQ(s.optimizer_hyper[0].first, "hyper.lr");
  EXPECT_TRUE(bits_equal(s.optimizer_hyper[0].second, saved.optimizer_hyper[0].second));
  EXPECT_TRUE(bits_equal(s.optimizer_hyper[1].second, saved.optimizer_hyper[1].second));
  EXPECT_EQ(s.optimizer_kind, "Adam");
  EXPECT_EQ(s.counters, saved.counters);
  EXPECT_EQ(s.rng, saved.rng);
  EXPECT_TRUE(s.job_shards.empty());
  EXPECT_FALSE(s.replicated);
  EXPECT_FALSE(read_latest(dir(), "w1").has_value());
}

TEST_F(CheckpointWriteRead, KeepLastRemovesOlderSnapshots) {
  ShardState s;
  for (int64_t seq = 1; seq <= 5; ++seq) {
    s.counters["step"] = seq;
    write_shard(dir(), "w0", seq, s, WriteOptions{.keep_last = 2});
  }
  for (int64_t seq = 1; seq <= 3; ++seq)
    EXPECT_FALSE(fs::exists(snap("w0", seq))) << seq;
  EXPECT_TRUE(fs::exists(snap("w0", 4) / "MANIFEST"));
  EXPECT_TRUE(fs::exists(snap("w0", 5) / "MANIFEST"));
  const auto got = read_latest(dir(), "w0");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->seq, 5);
  EXPECT_EQ(got->state.counters.at("step"), 5);
  EXPECT_EQ(read_snapshot(dir(), "w0", 4)->state.counters.at("step"), 4);
  EXPECT_FALSE(read_snapshot(dir(), "w0", 3).has_value());
  EXPECT_NE(error_text<InvalidArgument>([&] {
              write_shard(dir(), "w0", 6, s, {.keep_last = 0});
            }).find("keep_last is 0"),
            std::string::npos);
}

TEST_F(CheckpointWriteRead, InterruptedWriteIsSkippedForThePreviousOne) {
  ShardState s;
  s.params.push_back({"w", values({2, 2}, 1)});
  write_shard(dir(), "w0", 1, s);
  s.params[0].value = values({2, 2}, 2);
  write_shard(dir(), "w0", 2, s);
  fs::remove(snap("w0", 2) / "MANIFEST");  // as if the writer died before its manifest
  const auto got = read_latest(dir(), "w0");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->seq, 1);
  EXPECT_TRUE(bits_equal(got->state.params[0].value, values({2, 2}, 1)));
  EXPECT_FALSE(read_snapshot(dir(), "w0", 2).has_value());
  // The next write takes the place of the interrupted one and removes it.
  write_shard(dir(), "w0", 3, s);
  EXPECT_FALSE(fs::exists(snap("w0", 2)));
  EXPECT_EQ(read_latest(dir(), "w0")->seq, 3);
}

TEST_F(CheckpointWriteRead, SequenceNumbersOnlyGrow) {
  write_shard(dir(), "w0", 5, ShardState{});
  EXPECT_NE(error_text<InvalidArgument>([&] {
              write_shard(dir(), "w0", 5, ShardState{});
            }).find("already has a complete snapshot at seq 5"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              write_shard(dir(), "w0", 3, ShardState{});
            }).find("sequence numbers only grow"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              write_shard(dir(), "w0", -1, ShardState{});
            }).find("seq -1"),
            std::string::npos);
}

TEST_F(CheckpointWriteRead, CorruptedByteInADataFileIsRefusedNamingTheFile) {
  write_shard(dir(), "w0", 1, every_part());
  const fs::path file = snap("w0", 1) / "params.gw";
  std::string bytes = read_bytes(file);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(file, bytes);
  const std::string text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find(file.string()), std::string::npos) << text;
  EXPECT_NE(text.find("the file is corrupt"), std::string::npos) << text;
  EXPECT_NE(error_text<InvalidArgument>([&] { Checkpoint::open(dir()); }).find(file.string()),
            std::string::npos);
}

TEST_F(CheckpointWriteRead, DataFileOfAnotherSnapshotIsRefused) {
  ShardState s;
  s.params.push_back({"w", values({2, 3}, 1)});
  write_shard(dir(), "w0", 1, s);
  s.params[0].value = values({2, 3}, 2);  // same name, dtype and sizes; other values
  write_shard(dir(), "w0", 2, s);
  const fs::path file = snap("w0", 2) / "params.gw";
  std::string own = read_bytes(file);
  write_bytes(file, read_bytes(snap("w0", 1) / "params.gw"));
  const std::string text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find(file.string() + ": crc32 "), std::string::npos) << text;
  EXPECT_NE(text.find("another snapshot's"), std::string::npos) << text;
  // A byte of the file's own trailing checksum: the state file's parser names the file.
  own.back() ^= 0x01;
  write_bytes(file, own);
  const std::string tail = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(tail.find(file.string()), std::string::npos) << tail;
  EXPECT_NE(tail.find("checksum mismatch"), std::string::npos) << tail;
}

TEST_F(CheckpointWriteRead, TruncatedFilesAreRefusedNamingThem) {
  write_shard(dir(), "w0", 1, every_part());
  const fs::path data = snap("w0", 1) / "optimizer.gw";
  const std::string bytes = read_bytes(data);
  write_bytes(data, bytes.substr(0, bytes.size() - 3));
  std::string text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find(data.string() + ": " + std::to_string(bytes.size() - 3) +
                      " bytes, the manifest lists " + std::to_string(bytes.size()) +
                      " (the file is truncated)"),
            std::string::npos)
      << text;
  write_bytes(data, bytes);

  const fs::path manifest = snap("w0", 1) / "MANIFEST";
  const std::string text_bytes = read_bytes(manifest);
  write_bytes(manifest, text_bytes.substr(0, text_bytes.size() - 20));
  text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find(manifest.string() + ": truncated"), std::string::npos) << text;

  std::string edited = text_bytes;
  edited[edited.find("seq 1") + 4] = '2';  // a change that still parses
  write_bytes(manifest, edited);
  text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find(manifest.string() + ": checksum mismatch"), std::string::npos) << text;

  fs::remove(snap("w0", 1) / "rng.gw");
  write_bytes(manifest, text_bytes);
  text = error_text<InvalidArgument>([&] { read_latest(dir(), "w0"); });
  EXPECT_NE(text.find((snap("w0", 1) / "rng.gw").string() + ": missing"), std::string::npos)
      << text;
}

TEST_F(CheckpointWriteRead, BadStatesAreRefusedAtWriteAndNothingIsWritten) {
  const auto refused = [&](const ShardState& s, const std::string& shard = "w0") {
    return error_text<InvalidArgument>([&] { write_shard(dir(), shard, 1, s); });
  };
  ShardState gap;  // one shard, half of a table's rows
  gap.params.push_back({"emb", values({5, 4}, 1), {10, 4}, 0});
  EXPECT_NE(refused(gap).find("parameter 'emb' holds rows [0,5) of 10, and this shard is the "
                              "job's only one: rows [5,10) are missing"),
            std::string::npos)
      << refused(gap);

  ShardState overlap;
  overlap.job_shards = {"w0", "w1"};
  overlap.params.push_back({"emb", values({5, 4}, 1), {10, 4}, 0});
  overlap.params.push_back({"emb", values({5, 4}, 1), {10, 4}, 3});
  EXPECT_NE(refused(overlap).find("parameter 'emb' is given twice (rows [0,5) and [3,8))"),
            std::string::npos)
      << refused(overlap);

  ShardState past_end;
  past_end.job_shards = {"w0", "w1"};
  past_end.params.push_back({"emb", values({4, 4}, 1), {10, 4}, 8});
  EXPECT_NE(refused(past_end).find("holds rows [8,12), which do not fit its 10 global rows"),
            std::string::npos);

  ShardState wrong_width = past_end;
  wrong_width.params[0] = {"emb", values({4, 3}, 1), {10, 4}, 0};
  EXPECT_NE(refused(wrong_width).find("cannot be rows of global sizes [10,4]"), std::string::npos);

  ShardState state_rows = overlap;
  state_rows.params.pop_back();
  state_rows.optimizer.push_back({"emb/sum", values({5, 4}, 2), {10, 4}, 5});
  EXPECT_NE(refused(state_rows)
                .find("optimizer entry 'emb/sum' holds rows [5,10) of 10, its "
                      "parameter 'emb' rows [0,5) of 10"),
            std::string::npos);
  ShardState orphan;
  orphan.optimizer.push_back({"nobody/sum", values({2}, 2)});
  EXPECT_NE(refused(orphan).find("'nobody/sum' names no saved parameter"), std::string::npos);

  EXPECT_NE(refused(ShardState{}, "bad/name").find("shard name 'bad/name'"), std::string::npos);
  EXPECT_NE(refused(ShardState{}, "..").find("shard name '..'"), std::string::npos);
  ShardState not_member;
  not_member.job_shards = {"w1", "w2"};
  EXPECT_NE(refused(not_member).find("job_shards does not name this shard 'w0'"),
            std::string::npos);
  ShardState replica_split = overlap;
  replica_split.params.pop_back();
  replica_split.replicated = true;
  EXPECT_NE(refused(replica_split).find("split by rows in a replicated state"), std::string::npos);
  ShardState undefined;
  undefined.params.push_back({"w", Tensor()});
  EXPECT_NE(refused(undefined).find("'w' is an undefined tensor"), std::string::npos);

  EXPECT_FALSE(read_latest(dir(), "w0").has_value());
}

TEST(CheckpointRowRange, SplitsRowsContiguouslyFirstShardsLarger) {
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(row_range(10, 0, 3), P(0, 4));
  EXPECT_EQ(row_range(10, 1, 3), P(4, 7));
  EXPECT_EQ(row_range(10, 2, 3), P(7, 10));
  EXPECT_EQ(row_range(10, 0, 1), P(0, 10));
  EXPECT_EQ(row_range(10, 1, 2), P(5, 10));
  EXPECT_EQ(row_range(0, 2, 3), P(0, 0));
  EXPECT_EQ(row_range(2, 0, 5), P(0, 1));
  EXPECT_EQ(row_range(2, 1, 5), P(1, 2));
  EXPECT_EQ(row_range(2, 4, 5), P(2, 2));
  EXPECT_NE(
      error_text<InvalidArgument>([] { row_range(10, 3, 3); }).find("index 3 is outside [0, 3)"),
      std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([] { row_range(10, -1, 3); }).find("index -1"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([] { row_range(10, 0, 0); }).find("count 0"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([] { row_range(-1, 0, 1); }).find("rows -1"),
            std::string::npos);
}

}  // namespace
}  // namespace gradwire::checkpoint

// gradwire-ckpt: looks into a distributed checkpoint (docs/checkpoint.md).
//
//   gradwire-ckpt inspect DIR [--seq N]
//
// reads every shard's newest complete snapshot (or snapshot N of each), checks every file
// and the shards against each other as Checkpoint::open does, and prints the shards with
// their seqs, optimizer kind and counters, then every tensor with its dtype, global sizes
// and which shard holds which rows. Exit status: 0 printed, 1 the checkpoint is refused
// (the error on stderr), 2 bad arguments (the usage on stderr).
#include <charconv>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "gradwire/checkpoint/checkpoint.h"

namespace {

constexpr const char* kUsage =
    "usage: gradwire-ckpt inspect DIR [--seq N]\n"
    "  inspect DIR      print the shards, seqs, tensors (dtype, global sizes, which shard\n"
    "                   holds which rows), optimizer kind and counters of the checkpoint\n"
    "                   in DIR, every file checked\n"
    "  --seq N          snapshot N of every shard instead of each shard's newest\n";

int usage(const std::string& problem) {
  std::cerr << "gradwire-ckpt: " << problem << "\n" << kUsage;
  return 2;
}

std::optional<int64_t> parse_seq(std::string_view text) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::cout << kUsage;
    return 0;
  }
  if (argc < 2) return usage("no command given");
  if (std::string_view(argv[1]) != "inspect")
    return usage("unknown command '" + std::string(argv[1]) + "'");
  if (argc != 3 && argc != 5) return usage("inspect takes DIR and optionally --seq N");
  std::optional<int64_t> seq;
  if (argc == 5) {
    if (std::string_view(argv[3]) != "--seq")
      return usage("unknown option '" + std::string(argv[3]) + "'");
    seq = parse_seq(argv[4]);
    if (!seq)
      return usage("--seq takes a non-negative integer, got '" + std::string(argv[4]) + "'");
  }
  try {
    namespace ckpt = gradwire::checkpoint;
    const ckpt::Checkpoint c =
        seq ? ckpt::Checkpoint::open(argv[2], *seq) : ckpt::Checkpoint::open(argv[2]);
    std::cout << c.describe();
  } catch (const std::exception& e) {
    std::cerr << "gradwire-ckpt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

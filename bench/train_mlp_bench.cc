// nn.train_mlp_shards_ratio: the train_mlp example's (examples/train_mlp) training time
// with --shards 4 (each step's batch split in four, the shards' forward and backward
// passes run concurrently on a thread pool into the shared gradients) over its time with
// --shards 1 (one shard, the same steps, one pool thread). The model, data and Adam steps
// are the same either way (the shards' gradients add up to the full-batch one), so the
// ratio weighs what sharding gains (the cores working at once) against what it costs
// (smaller matrix products, concurrent gradient accumulation, the pool's hand-offs).
//
// The figure runs the built example itself (gradwire-train-mlp, or the program named by
// $GRADWIRE_BENCH_TRAIN_MLP) with its default options but --shards, and reads the training
// time it prints (its step loop, progress lines included; not start-up, data, saving or
// reloading). The two
// shard counts alternate run after run, after one warm-up run each; each side reports its
// median. The child inherits this environment, so its intra-op threads are
// $GRADWIRE_NUM_THREADS or the cores, as for any program.
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"

namespace gradwire::bench {
namespace {

constexpr int kShards = 4;
constexpr int kRounds = 9;

// The example's path, or nullopt when it was not built and $GRADWIRE_BENCH_TRAIN_MLP is unset.
std::optional<std::string> train_mlp_program() {
  const char* env = std::getenv("GRADWIRE_BENCH_TRAIN_MLP");
  if (env != nullptr && *env != '\0') return std::string(env);
#ifdef GRADWIRE_BENCH_TRAIN_MLP
  return std::string(GRADWIRE_BENCH_TRAIN_MLP);
#else
  return std::nullopt;
#endif
}

// `s` quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Run {
  int steps;
  double seconds;
};

// One run of the example with `shards` shards: its step count and training seconds.
Run train(const std::string& program, int shards) {
  const std::string command =
      shell_quote(program) + " --shards " + std::to_string(shards) + " 2>&1";
  std::string out;
  const std::optional<int> status = run_command(command, out);
  if (!status) throw std::runtime_error("cannot run " + program);
  if (*status != 0) {
    throw std::runtime_error(program + " --shards " + std::to_string(shards) + " exited with " +
                             std::to_string(*status) + ": " + out);
  }
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(trained (\d+) steps on .* in ([0-9.]+) s)"))) {
    throw std::runtime_error("no training time in the output of " + program + ": " + out);
  }
  return Run{std::stoi(m[1]), std::stod(m[2])};
}

const Register train_mlp_bench({"nn.train_mlp_shards_ratio"}, [](const auto& emit) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Figure f{"nn.train_mlp_shards_ratio",
           nan,
           "x",
           {{"example", "gradwire-train-mlp (examples/train_mlp), default options"},
            {"shards", double(kShards)},
            {"baseline", "the same example with --shards 1"}}};
  const std::optional<std::string> program = train_mlp_program();
  if (!program) {
    f.params.push_back({"unavailable",
                        "the example was not built (GRADWIRE_BUILD_EXAMPLES=OFF) and "
                        "GRADWIRE_BENCH_TRAIN_MLP is unset"});
    f.params.push_back({"ratio", nan});
    f.params.push_back({"target_ratio_max", 1.5});
    emit(f);
    return;
  }
  train(*program, kShards);
  train(*program, 1);
  std::vector<double> sharded, single;
  int steps = 0;
  for (int r = 0; r < kRounds; ++r) {
    const Run a = train(*program, kShards);
    const Run b = train(*program, 1);
    sharded.push_back(a.seconds);
    single.push_back(b.seconds);
    steps = a.steps;
  }
  const double t_sharded = median(sharded), t_single = median(single);
  f.value = t_sharded / t_single;
  f.params.push_back({"steps", double(steps)});
  f.params.push_back({"cores", double(::sysconf(_SC_NPROCESSORS_ONLN))});
  f.params.push_back({"shards_s", t_sharded});
  f.params.push_back({"baseline_s", t_single});
  f.params.push_back(
      {"statistic", "median of " + std::to_string(kRounds) + " runs each, alternating"});
  f.params.push_back({"ratio", f.value});
  f.params.push_back({"target_ratio_max", 1.5});
  emit(f);
});

}  // namespace
}  // namespace gradwire::bench

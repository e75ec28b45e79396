// gradwire-bench plumbing: a registry of named metrics, timing helpers, and the one JSON
// line per figure (docs/benchmarks.md, docs/architecture.md "Performance"):
//   {"metric": "...", "value": ..., "unit": "...", "params": {...}}
// Baselines are measured in the same run and go in params, with the ratio and its target.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace gradwire::bench {

// A params value: number or text.
using ParamValue = std::variant<double, std::string>;
using Params = std::vector<std::pair<std::string, ParamValue>>;

struct Figure {
  std::string metric;
  double value;
  std::string unit;
  Params params;
};

// A benchmark produces one or more figures (their metric names are listed up front so that
// --list and --filter work without running anything).
struct Benchmark {
  std::vector<std::string> metrics;
  std::function<void(const std::function<void(const Figure&)>& emit)> run;
};

std::vector<Benchmark>& registry();

struct Register {
  Register(std::vector<std::string> metrics,
           std::function<void(const std::function<void(const Figure&)>&)> run) {
    registry().push_back(Benchmark{std::move(metrics), std::move(run)});
  }
};

std::string to_json(const Figure& f);

// Seconds taken by one call of fn.
template <typename F>
double time_once(F&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Calls fn `warmup` times untimed, then `count` times; returns each timed call's seconds.
template <typename F>
std::vector<double> time_calls(int warmup, int count, F&& fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  std::vector<double> times;
  times.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    times.push_back(time_once(fn));
  return times;
}

// Seconds per call of `calls` asynchronous calls kept `window` in flight (a sliding window):
// start() issues one and returns its future; each future is waited for at most `timeout`.
template <typename Start>
double seconds_per_windowed_call(int calls, size_t window, std::chrono::milliseconds timeout,
                                 Start&& start) {
  std::deque<decltype(start())> in_flight;
  const double total = time_once([&] {
    for (int i = 0; i < calls; ++i) {
      if (in_flight.size() == window) {
        in_flight.front().get(timeout);
        in_flight.pop_front();
      }
      in_flight.push_back(start());
    }
    for (auto& f : in_flight)
      f.get(timeout);
  });
  return total / calls;
}

// Runs `measured` and `baseline` alternately `rounds` times after one warm-up each, and
// returns the median seconds of each. Alternating keeps slow drift of a shared machine
// from favouring either side.
std::pair<double, double> time_interleaved(const std::function<void()>& measured,
                                           const std::function<void()>& baseline, int rounds);

double median(std::vector<double> values);
// The value below which a fraction q of `values` lies (q = 0.99: the p99); 0 for none.
double percentile(std::vector<double> values, double q);

// Runs `command` through /bin/sh and appends what it writes to stdout to `output`.
// Returns its exit status (-1 when it did not exit normally), or nullopt when it could not
// be started.
std::optional<int> run_command(const std::string& command, std::string& output);

// What a PyTorch peer script (bench/pytorch/*.py) measured: the per-round or per-step
// seconds it printed as JSON ({"seconds": [...], "torch": "<version>"}).
struct PeerTimings {
  std::vector<double> seconds;
  std::string torch_version;
};

// Runs `script` (in bench/pytorch) with `args` under $GRADWIRE_BENCH_PYTHON or
// /usr/bin/python3, with `env` ("NAME=value ..." or empty) prepended; a run in which the
// script reported an error of its own (a PyTorch process that failed) is run once more,
// saying so on stderr. Returns nullopt, with the reason in `why`, when python, torch or the
// script is unavailable, or the script reported an error both times, so a figure can still
// be reported without its baseline.
std::optional<PeerTimings> run_pytorch_peer(const std::string& script, const std::string& args,
                                            const std::string& env, std::string& why);

}  // namespace gradwire::bench

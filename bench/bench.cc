#include "bench.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <sstream>

namespace gradwire::bench {

std::vector<Benchmark>& registry() {
  static std::vector<Benchmark> benchmarks;
  return benchmarks;
}

namespace {
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}
}  // namespace

std::string to_json(const Figure& f) {
  std::ostringstream os;
  os << "{\"metric\": " << json_string(f.metric) << ", \"value\": " << json_number(f.value)
     << ", \"unit\": " << json_string(f.unit) << ", \"params\": {";
  for (size_t i = 0; i < f.params.size(); ++i) {
    if (i) os << ", ";
    os << json_string(f.params[i].first) << ": ";
    if (const double* d = std::get_if<double>(&f.params[i].second)) {
      os << json_number(*d);
    } else {
      os << json_string(std::get<std::string>(f.params[i].second));
    }
  }
  os << "}}";
  return os.str();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1,
                         static_cast<size_t>(q * static_cast<double>(values.size())))];
}

std::pair<double, double> time_interleaved(const std::function<void()>& measured,
                                           const std::function<void()>& baseline, int rounds) {
  measured();
  baseline();
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {
    a.push_back(time_once(measured));
    b.push_back(time_once(baseline));
  }
  return {median(a), median(b)};
}

std::optional<int> run_command(const std::string& command, std::string& output) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::array<char, 4096> buf{};
  while (size_t got = std::fread(buf.data(), 1, buf.size(), pipe))
    output.append(buf.data(), got);
  const int status = ::pclose(pipe);
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#ifndef GRADWIRE_BENCH_PYTORCH_DIR
#define GRADWIRE_BENCH_PYTORCH_DIR "bench/pytorch"
#endif

namespace {

std::optional<PeerTimings> run_peer_once(const std::string& script, const std::string& args,
                                         const std::string& env, std::string& why, bool& printed) {
  printed = false;
  const char* python = std::getenv("GRADWIRE_BENCH_PYTHON");
  const std::string command = env + (env.empty() ? "" : " ") +
                              std::string(python && *python ? python : "/usr/bin/python3") +
                              " " GRADWIRE_BENCH_PYTORCH_DIR "/" + script + " " + args +
                              " 2>/dev/null";
  std::string out;
  if (!run_command(command, out)) {
    why = "cannot run python";
    return std::nullopt;
  }
  std::smatch m;
  if (std::regex_search(out, m, std::regex(R"re("error": "([^"]*)")re"))) {
    why = m[1];
    printed = true;
    return std::nullopt;
  }
  if (!std::regex_search(out, m, std::regex(R"re("seconds": \[([^\]]*)\])re"))) {
    why = (out.empty() ? "no output from " : "unexpected output from ") + script;
    return std::nullopt;
  }
  PeerTimings timings;
  const std::string list = m[1];
  const std::regex number(R"([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), number);
       it != std::sregex_iterator(); ++it) {
    timings.seconds.push_back(std::stod(it->str()));
  }
  if (timings.seconds.empty()) {
    why = "no timings from " + script;
    return std::nullopt;
  }
  if (std::regex_search(out, m, std::regex(R"re("torch": "([^"]*)")re"))) {
    timings.torch_version = m[1];
  }
  return timings;
}

}  // namespace

std::optional<PeerTimings> run_pytorch_peer(const std::string& script, const std::string& args,
                                            const std::string& env, std::string& why) {
  bool printed = false;  // the script ran and said why it failed (not: no python or torch)
  if (auto timings = run_peer_once(script, args, env, why, printed)) return timings;
  // PyTorch's processes sometimes fail on their way out (rpc.shutdown) after measuring:
  // one such exit must not cost a figure its baseline for every later round.
  if (!printed) return std::nullopt;
  const std::string first = why;
  std::fprintf(stderr, "bench: the PyTorch peer %s failed (%s); running it once more\n",
               script.c_str(), first.c_str());
  if (auto timings = run_peer_once(script, args, env, why, printed)) return timings;
  if (why != first) why = first + "; then, run again: " + why;
  return std::nullopt;
}

}  // namespace gradwire::bench

#include "bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

}  // namespace gradwire::bench

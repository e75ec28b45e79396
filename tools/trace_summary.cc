// gradwire-trace summary: where each worker's step time went (rules in trace_report.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "trace_report.h"

namespace gradwire::tools::trace {

namespace {

bool is_step(const Event& e) {
  return e.phase == 'X' && e.name == "step" && e.category == "train" && e.int_arg("step");
}

struct Piece {
  int64_t begin, end;
  Phase phase;
};

// Splits [a, b) among `pieces` (clipped to it): adds each phase's time to `t`.
void split(int64_t a, int64_t b, const std::vector<Piece>& pieces, StepTime& t) {
  // A sweep over the pieces' ends, counting the open pieces of each phase.
  std::vector<std::pair<int64_t, int>> points;  // (time, +-(phase + 1))
  points.reserve(pieces.size() * 2);
  for (const Piece& p : pieces) {
    const int64_t begin = std::max(a, p.begin);
    const int64_t end = std::min(b, p.end);
    if (end <= begin) continue;
    points.emplace_back(begin, static_cast<int>(p.phase) + 1);
    points.emplace_back(end, -(static_cast<int>(p.phase) + 1));
  }
  std::sort(points.begin(), points.end());
  int open[3] = {0, 0, 0};
  int64_t covered[3] = {0, 0, 0};
  int64_t last = a;
  for (const auto& [time, change] : points) {
    if (time > last) {
      for (int ph = 0; ph < 3; ++ph) {
        if (open[ph] > 0) {
          covered[ph] += time - last;
          break;
        }
      }
      last = time;
    }
    open[std::abs(change) - 1] += change > 0 ? 1 : -1;
  }
  t.waiting_ns += covered[0];
  t.communication_ns += covered[1];
  t.compute_ns += covered[2];
  t.unaccounted_ns += (b - a) - covered[0] - covered[1] - covered[2];
  t.step_ns += b - a;
}

std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}

const char* const kColumns[] = {"step", "compute", "communication", "waiting", "unaccounted"};

int64_t column(const StepTime& t, int c) {
  switch (c) {
    case 0:
      return t.step_ns;
    case 1:
      return t.compute_ns;
    case 2:
      return t.communication_ns;
    case 3:
      return t.waiting_ns;
    default:
      return t.unaccounted_ns;
  }
}

// The index of the worker with the most time in column `c`.
size_t slowest(const std::vector<StepTime>& rows, int c) {
  size_t best = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (column(rows[i], c) > column(rows[best], c)) best = i;
  }
  return best;
}

// Each worker's steps added up.
std::vector<StepTime> totals(const Job& job, const Summary& s, std::vector<int64_t>& counts) {
  std::vector<StepTime> out;
  counts.clear();
  for (const Worker& w : job.workers) {
    StepTime t;
    t.worker = w.name;
    int64_t n = 0;
    for (const auto& [step, rows] : s.steps) {
      for (const StepTime& r : rows) {
        if (r.worker != w.name) continue;
        ++n;
        t.step_ns += r.step_ns;
        t.compute_ns += r.compute_ns;
        t.communication_ns += r.communication_ns;
        t.waiting_ns += r.waiting_ns;
        t.unaccounted_ns += r.unaccounted_ns;
      }
    }
    if (n == 0) continue;
    out.push_back(t);
    counts.push_back(n);
  }
  return out;
}

}  // namespace

Phase phase_of(const Event& e) {
  const std::string& n = e.name;
  const size_t dot = n.rfind('.');
  const std::string last = dot == std::string::npos ? n : n.substr(dot + 1);
  if (last.rfind("wait", 0) == 0 || last == "finalize" || n == "rpc.queue") return Phase::kWaiting;
  // Serving a request or handling a message here is work done here.
  if (n == "rpc.serve" || n == "rref.handle") return Phase::kCompute;
  if (e.category == "rpc" || e.category == "rref" || e.category == "c10d") {
    return Phase::kCommunication;
  }
  // The messages of a distributed backward pass, and DDP's all-reduces.
  for (const char* name : {"dist_autograd.discovery", "dist_autograd.propagate",
                           "dist_autograd.release", "ddp.allreduce"}) {
    if (n == name) return Phase::kCommunication;
  }
  return Phase::kCompute;
}

Summary summarize(const Job& job, std::optional<int64_t> only_step) {
  std::map<int64_t, std::vector<StepTime>> steps;
  for (const Worker& w : job.workers) {
    // The worker's other spans by start, and the longest, to find those overlapping a step.
    std::vector<const Event*> spans;
    int64_t longest = 0;
    for (const Event& e : w.events) {
      if (e.phase != 'X' || is_step(e)) continue;
      spans.push_back(&e);
      longest = std::max(longest, e.dur_ns);
    }
    std::sort(spans.begin(), spans.end(),
              [](const Event* x, const Event* y) { return x->ts_ns < y->ts_ns; });
    std::map<int64_t, StepTime> mine;
    for (const Event& e : w.events) {
      if (!is_step(e)) continue;
      const int64_t number = *e.int_arg("step");
      if (only_step && number != *only_step) continue;
      const int64_t a = e.ts_ns;
      const int64_t b = e.ts_ns + e.dur_ns;
      auto first = std::lower_bound(spans.begin(), spans.end(), a - longest,
                                    [](const Event* x, int64_t t) { return x->ts_ns < t; });
      std::vector<Piece> pieces;
      for (auto it = first; it != spans.end() && (*it)->ts_ns < b; ++it) {
        const Event& s = **it;
        if (s.ts_ns + s.dur_ns <= a) continue;
        pieces.push_back(Piece{s.ts_ns, s.ts_ns + s.dur_ns, phase_of(s)});
      }
      StepTime& t = mine[number];
      t.worker = w.name;
      t.step = number;
      split(a, b, pieces, t);
    }
    for (auto& [number, t] : mine)
      steps[number].push_back(t);
  }
  Summary s;
  for (auto& [number, rows] : steps)
    s.steps.emplace_back(number, std::move(rows));
  return s;
}

std::string summary_text(const Job& job, const Summary& s) {
  std::ostringstream out;
  size_t width = 6;
  for (const Worker& w : job.workers)
    width = std::max(width, w.name.size());
  char line[512];
  auto header = [&] {
    std::snprintf(line, sizeof(line), "  %-*s %12s %12s %14s %12s %12s\n", static_cast<int>(width),
                  "worker", "step ms", "compute ms", "comm. ms", "waiting ms", "unacc. ms");
    out << line;
  };
  auto row = [&](const StepTime& t, const char* suffix) {
    std::snprintf(line, sizeof(line), "  %-*s %12s %12s %14s %12s %12s%s\n",
                  static_cast<int>(width), t.worker.c_str(), ms(t.step_ns).c_str(),
                  ms(t.compute_ns).c_str(), ms(t.communication_ns).c_str(),
                  ms(t.waiting_ns).c_str(), ms(t.unaccounted_ns).c_str(), suffix);
    out << line;
  };
  if (s.steps.empty()) {
    out << "no step spans (name \"step\", category \"train\", an integer arg \"step\") in the "
           "trace\n";
    return out.str();
  }
  for (const auto& [number, rows] : s.steps) {
    out << "step " << number << "\n";
    header();
    for (const StepTime& t : rows)
      row(t, "");
    out << "  slowest:";
    for (int c = 0; c < 5; ++c) {
      const StepTime& t = rows[slowest(rows, c)];
      out << (c == 0 ? " " : ", ") << kColumns[c] << " " << t.worker << " (" << ms(column(t, c))
          << " ms)";
    }
    out << "\n\n";
  }
  std::vector<int64_t> counts;
  const std::vector<StepTime> sums = totals(job, s, counts);
  out << "all steps\n";
  header();
  for (size_t i = 0; i < sums.size(); ++i) {
    char suffix[96];
    std::snprintf(suffix, sizeof(suffix), "  (%lld steps, %.1f %% unaccounted)",
                  static_cast<long long>(counts[i]),
                  sums[i].step_ns > 0 ? 100.0 * static_cast<double>(sums[i].unaccounted_ns) /
                                            static_cast<double>(sums[i].step_ns)
                                      : 0.0);
    row(sums[i], suffix);
  }
  return out.str();
}

nlohmann::json summary_json(const Job& job, const Summary& s) {
  auto one = [](const StepTime& t) {
    return nlohmann::json{{"worker", t.worker},         {"step_ns", t.step_ns},
                          {"compute_ns", t.compute_ns}, {"communication_ns", t.communication_ns},
                          {"waiting_ns", t.waiting_ns}, {"unaccounted_ns", t.unaccounted_ns}};
  };
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& [number, rows] : s.steps) {
    nlohmann::json list = nlohmann::json::array();
    for (const StepTime& t : rows)
      list.push_back(one(t));
    nlohmann::json slow = nlohmann::json::object();
    for (int c = 0; c < 5; ++c)
      slow[kColumns[c]] = rows[slowest(rows, c)].worker;
    steps.push_back({{"step", number}, {"workers", std::move(list)}, {"slowest", std::move(slow)}});
  }
  std::vector<int64_t> counts;
  const std::vector<StepTime> sums = totals(job, s, counts);
  nlohmann::json workers = nlohmann::json::array();
  for (size_t i = 0; i < sums.size(); ++i) {
    nlohmann::json j = one(sums[i]);
    j["steps"] = counts[i];
    j["unaccounted_fraction"] = sums[i].step_ns > 0 ? static_cast<double>(sums[i].unaccounted_ns) /
                                                          static_cast<double>(sums[i].step_ns)
                                                    : 0.0;
    workers.push_back(std::move(j));
  }
  return {{"steps", std::move(steps)}, {"workers", std::move(workers)}};
}

}  // namespace gradwire::tools::trace

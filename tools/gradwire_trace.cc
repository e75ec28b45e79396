// gradwire-trace: one timeline for a whole job from its workers' trace files
// (GRADWIRE_TRACE=DIR), a per-step summary of where the time went, and an SVG picture.
//
//   gradwire-trace merge DIR -o job.json
//   gradwire-trace summary DIR|job.json [--step N] [--json]
//   gradwire-trace svg DIR|job.json -o out.svg [--step N [--worker NAME]]
//
// Exit status: 0 done, 1 an input could not be used (the message names the file and what
// is wrong), 2 a bad command line. See docs/observability.md.
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "trace_job.h"
#include "trace_report.h"

namespace {

using namespace gradwire::tools::trace;

constexpr const char* kUsage =
    "usage:\n"
    "  gradwire-trace merge DIR -o OUT.json\n"
    "      every DIR/*.trace.json on the store's clock, one Chrome/Perfetto trace\n"
    "  gradwire-trace summary DIR|MERGED.json [--step N] [--json]\n"
    "      per step and worker: step time, compute, communication, waiting, unaccounted\n"
    "  gradwire-trace svg DIR|MERGED.json -o OUT.svg [--step N [--worker NAME]]\n"
    "      the timeline as an SVG picture (of step N, as NAME ran it)\n";

struct UsageError {
  std::string message;
};

struct Command {
  std::string verb;
  std::string input;
  std::string output;
  std::optional<int64_t> step;
  std::string worker;  // svg --worker: the step's window is this worker's
  bool json = false;
};

Command parse(int argc, char** argv) {
  if (argc < 2) throw UsageError{"no command given"};
  Command c;
  c.verb = argv[1];
  if (c.verb != "merge" && c.verb != "summary" && c.verb != "svg") {
    throw UsageError{"unknown command '" + c.verb + "'"};
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError{a + " needs a value"};
      return argv[++i];
    };
    if (a == "-o" || a == "--output") {
      c.output = value();
    } else if (a == "--step" && c.verb != "merge") {
      const std::string v = value();
      int64_t n = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size()) {
        throw UsageError{"--step=\"" + v + "\" is not an integer"};
      }
      c.step = n;
    } else if (a == "--worker" && c.verb == "svg") {
      c.worker = value();
    } else if (a == "--json" && c.verb == "summary") {
      c.json = true;
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"unknown option '" + a + "' for " + c.verb};
    } else if (c.input.empty()) {
      c.input = a;
    } else {
      throw UsageError{"unexpected argument '" + a + "'"};
    }
  }
  if (c.input.empty()) throw UsageError{c.verb + " needs a trace directory or file"};
  if (c.verb != "summary" && c.output.empty()) throw UsageError{c.verb + " needs -o FILE"};
  if (!c.worker.empty() && !c.step) throw UsageError{"--worker needs --step N"};
  return c;
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw TraceInputError(path + ": cannot be written: " + std::strerror(errno));
    }
    out << text;
    out.flush();
    if (!out) throw TraceInputError(path + ": writing failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw TraceInputError(path + ": cannot be written: " + why);
  }
}

void print_notes(const Job& job) {
  for (const std::string& note : job.notes)
    std::cerr << "gradwire-trace: " << note << "\n";
}

int merge(const Command& c) {
  Job job = load_directory(c.input);
  print_notes(job);
  write_file(c.output, merged_json(job).dump() + "\n");
  std::printf("%zu workers, %zu rpc flows, written to %s\n", job.workers.size(), job.flows.size(),
              c.output.c_str());
  for (const Worker& w : job.workers) {
    if (auto r = w.residual_ns()) {
      std::printf(
          "  %-20s aligned by the store: offset %lld ns, residual +-%.1f us (best "
          "round trip %.1f us)\n",
          w.name.c_str(), static_cast<long long>(w.offset_ns), static_cast<double>(*r) / 1e3,
          static_cast<double>(*w.rtt_ns) / 1e3);
    } else {
      std::printf("  %-20s aligned by its system clock: residual unknown\n", w.name.c_str());
    }
  }
  return 0;
}

int summary(const Command& c) {
  Job job = load(c.input);
  print_notes(job);
  const Summary s = summarize(job, c.step);
  if (c.json) {
    std::cout << summary_json(job, s).dump(2) << "\n";
  } else {
    std::cout << summary_text(job, s);
  }
  return 0;
}

int svg(const Command& c) {
  Job job = load(c.input);
  print_notes(job);
  write_file(c.output, render_svg(job, c.step, c.worker));
  std::printf("written to %s\n", c.output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::cout << kUsage;
    return 0;
  }
  try {
    const Command c = parse(argc, argv);
    if (c.verb == "merge") return merge(c);
    if (c.verb == "summary") return summary(c);
    return svg(c);
  } catch (const UsageError& e) {
    std::cerr << "gradwire-trace: " << e.message << "\n" << kUsage;
    return 2;
  } catch (const TraceInputError& e) {
    std::cerr << "gradwire-trace: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gradwire-trace: " << e.what() << "\n";
    return 1;
  }
}

// gradwire-bench: every performance figure of gradwire, one JSON line each.
//
//   gradwire-bench                 run everything
//   gradwire-bench --filter REGEX  only metrics whose names match (ECMAScript regex)
//   gradwire-bench --list          print the metric names and exit
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>

#include "bench.h"

int main(int argc, char** argv) {
  using namespace gradwire::bench;
  std::string filter = ".*";
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gradwire-bench [--list] [--filter REGEX]\n");
      return 2;
    }
  }
  std::regex re;
  try {
    re = std::regex(filter);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "gradwire-bench: bad --filter '%s': %s\n", filter.c_str(), e.what());
    return 2;
  }
  int failures = 0;
  for (const Benchmark& b : registry()) {
    bool selected = false;
    for (const auto& m : b.metrics) {
      if (std::regex_search(m, re)) {
        selected = true;
        if (list) std::printf("%s\n", m.c_str());
      }
    }
    if (list || !selected) continue;
    try {
      b.run([&](const Figure& f) {
        if (std::regex_search(f.metric, re)) {
          std::printf("%s\n", to_json(f).c_str());
          std::fflush(stdout);
        }
      });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradwire-bench: %s failed: %s\n", b.metrics.front().c_str(), e.what());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

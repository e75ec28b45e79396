// core/ trace figures: what a trace::Span costs on the thread that makes it.
//   core.trace_span_disabled_ns  ns per span while tracing is off (one relaxed load);
//                                baseline: the same loop without a span (params.empty_ns)
//   core.trace_span_enabled_ns   ns per span while tracing is on: two clock readings and one
//                                event (two integer arguments) copied into the thread's ring
// Both with the loop body kept alive by an atomic counter; the rounds of each side alternate
// with the empty loop's.
#include <atomic>
#include <cstdint>

#include "bench.h"
#include "gradwire/core/trace.h"

namespace gradwire::bench {
namespace {

constexpr int kSpans = 200000;  // per timed round
constexpr int kRounds = 7;

const Register trace_bench(
    {"core.trace_span_disabled_ns", "core.trace_span_enabled_ns"}, [](const auto& emit) {
      std::atomic<int64_t> sink{0};
      const auto spans = [&] {
        for (int i = 0; i < kSpans; ++i) {
          trace::Span span("bench.span", "bench", trace::Arg("i", i), trace::Arg("n", kSpans));
          sink.fetch_add(1, std::memory_order_relaxed);
        }
      };
      const auto empty = [&] {
        for (int i = 0; i < kSpans; ++i)
          sink.fetch_add(1, std::memory_order_relaxed);
      };
      const bool was_on = trace::enabled();
      trace::stop();
      const auto [off_s, empty_off_s] = time_interleaved(spans, empty, kRounds);
      trace::start();
      const auto [on_s, empty_on_s] = time_interleaved(spans, empty, kRounds);
      trace::stop();
      const uint64_t overwritten = trace::overwritten();
      trace::clear();
      if (was_on) trace::start();
      const double per = 1e9 / kSpans;
      const double empty_ns = per * (empty_off_s + empty_on_s) / 2;
      Figure off{"core.trace_span_disabled_ns",
                 per * off_s,
                 "ns",
                 {{"statistic", "median of " + std::to_string(kRounds) + " rounds of " +
                                    std::to_string(kSpans) + " spans"},
                  {"span", "trace::Span with 2 int64 arguments, tracing off"},
                  {"empty_ns", empty_ns},
                  {"over_empty_ns", per * off_s - empty_ns}}};
      emit(off);
      Figure on{"core.trace_span_enabled_ns",
                per * on_s,
                "ns",
                {{"statistic", "median of " + std::to_string(kRounds) + " rounds of " +
                                   std::to_string(kSpans) + " spans"},
                 {"span", "trace::Span with 2 int64 arguments, tracing on"},
                 {"ring_capacity", static_cast<double>(trace::ring_capacity())},
                 {"overwritten_events", static_cast<double>(overwritten)},
                 {"empty_ns", empty_ns},
                 {"over_empty_ns", per * on_s - empty_ns}}};
      emit(on);
    });

}  // namespace
}  // namespace gradwire::bench

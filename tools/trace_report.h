// gradwire-trace's reports on a Job: the per-step summary (where each worker's step time
// went) and the SVG timeline. The rules are documented in docs/observability.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trace_job.h"

namespace gradwire::tools::trace {

// The phases a step's time is split into, in order of precedence.
enum class Phase { kWaiting, kCommunication, kCompute };

// Which phase a span nested in a step counts toward:
//   waiting: a span whose name's last dot-separated part begins with "wait" or is
//     "finalize" (dist_autograd.wait, c10d.work.wait, ddp.finalize), or rpc.queue;
//   communication: any other span of category rpc, rref or c10d except rpc.serve and
//     rref.handle (a call, a store request, a collective, an rref message sent), and
//     dist_autograd.discovery, dist_autograd.propagate, dist_autograd.release,
//     ddp.allreduce;
//   compute: every other span (train.forward, train.backward, train.optimizer, autograd
//     nodes, rpc.serve and rref.handle: work done here).
Phase phase_of(const Event& e);

// One worker's step: its time, split into phases. Time covered by spans of several phases
// counts once, toward the first of waiting, communication, compute; unaccounted is what no
// nested span covers. The four parts add up to step_ns.
struct StepTime {
  std::string worker;
  int64_t step{0};
  int64_t step_ns{0};
  int64_t compute_ns{0};
  int64_t communication_ns{0};
  int64_t waiting_ns{0};
  int64_t unaccounted_ns{0};
};

struct Summary {
  // Every step number seen, in order, with each worker's StepTime (workers without that
  // step are absent).
  std::vector<std::pair<int64_t, std::vector<StepTime>>> steps;
};

// `only_step`: just that step.
Summary summarize(const Job& job, std::optional<int64_t> only_step = std::nullopt);
std::string summary_text(const Job& job, const Summary& s);
nlohmann::json summary_json(const Job& job, const Summary& s);

// The SVG timeline of `job` (of step `only_step` when given: the span of time from the
// first worker's start of it to the last one's end; of that worker's step only when
// `step_worker` names one, every worker still drawn). Throws TraceInputError when that step
// is in no file (or not in that worker's).
std::string render_svg(const Job& job, std::optional<int64_t> only_step = std::nullopt,
                       const std::string& step_worker = "");

}  // namespace gradwire::tools::trace

// A chaos schedule: everything one randomized run of the parameter-server workload does,
// drawn from a single 64-bit seed (std::mt19937_64), so that a seed names a run exactly —
// the same seed gives the same workers, rounds, timeouts, fault rules and kill point.
//
// Roles. w0 (and w3 in a four-worker schedule) are trainers: each creates a ParamServer on
// w1, and in every round makes an input on some worker, forks references to a third
// worker, runs a forward through the server (by proxy or relayed by the third worker), a
// dist_autograd pass and a DistributedOptimizer step. w2 is the third worker. In a kill
// schedule one of w1 and w2 (never a trainer) dies by SIGKILL while serving its kill_at-th
// request; those schedules run the workers as processes, the others as threads.
//
// Thread-safety: plain values; make() is a pure function.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/rpc/fault_injection.h"

namespace gradwire::chaos {

// One round of one trainer.
struct Round {
  int64_t key{0};      // the input's and target's closed forms
  int input_owner{1};  // where rref::remote makes the input
  bool relay{false};   // forward through the third worker instead of by proxy
  bool step{true};     // a DistributedOptimizer step after a successful pass
  std::chrono::milliseconds call_timeout{100};
  std::chrono::milliseconds pass_timeout{300};
};

struct Schedule {
  uint64_t seed{0};
  int world{3};
  // Ranks that train (and initiate passes): 0, and 3 when world == 4.
  std::vector<int> trainers;
  // -1: nobody dies. Otherwise 1 or 2, killed while serving its kill_at-th request.
  int victim{-1};
  int kill_at{0};
  // The agents' rpc_timeout (bounds what has no timeout of its own: rref's control
  // messages, optimizer steps, releases).
  std::chrono::milliseconds rpc_timeout{500};
  std::vector<rpc::FaultRule> rules;
  // Per trainer, in the order of `trainers`.
  std::vector<std::vector<Round>> rounds;

  bool processes() const { return victim >= 0; }
  // Several lines: the workers, the kill, every rule and every round.
  std::string describe() const;
};

// The schedule of `seed`.
Schedule make_schedule(uint64_t seed);

// "drop from w1 to any, replies of handler 3 'propagate', nth 4, count 2".
std::string describe_rule(const rpc::FaultRule& rule);

}  // namespace gradwire::chaos

#include "chaos/schedule.h"

#include <random>
#include <sstream>

#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rref/rref.h"

namespace gradwire::chaos {
namespace {

using std::chrono::milliseconds;

// Draws from the seed's generator with plain arithmetic (the standard distributions differ
// between standard libraries; a seed must name the same run everywhere).
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  // In [lo, hi].
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(int percent) { return between(1, 100) <= percent; }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(between(0, static_cast<int64_t>(items.size()) - 1))];
  }

 private:
  std::mt19937_64 rng_;
};

// The module's messages a rule may aim at: rpc calls, rref's creations and proxies, rref's
// fork protocol, and each of dist_autograd's messages by name.
struct Target {
  std::optional<uint32_t> handler;
  std::string function;
};

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {std::nullopt, ""},
      {rpc::kCallHandler, ""},
      {rref::kRRefHandler, ""},
      {rref::kRRefControlHandler, ""},
      {dist_autograd::kDistAutogradHandler, ""},
      {dist_autograd::kDistAutogradHandler, "discover"},
      {dist_autograd::kDistAutogradHandler, "propagate"},
      {dist_autograd::kDistAutogradHandler, "wait"},
      {dist_autograd::kDistAutogradHandler, "release"},
      {rpc::kCallHandler, "relay"},
      {rpc::kCallHandler, "sum_of"},
  };
  return all;
}

rpc::FaultRule draw_rule(Draw& d, int world) {
  rpc::FaultRule rule;
  const int64_t a = d.between(0, 9);
  // Delays are the most common (they reorder), drops cost a timeout, cuts a reconnection.
  rule.action =
      a < 4 ? rpc::FaultAction::kDelay : (a < 7 ? rpc::FaultAction::kDrop : rpc::FaultAction::kCut);
  if (d.chance(60)) rule.from = "w" + std::to_string(d.between(0, world - 1));
  if (d.chance(40)) rule.to = "w" + std::to_string(d.between(0, world - 1));
  const int64_t k = d.between(0, 2);
  rule.kind = k == 0 ? rpc::MessageKind::kAny
                     : (k == 1 ? rpc::MessageKind::kRequest : rpc::MessageKind::kReply);
  const Target& t = d.pick(targets());
  rule.handler = t.handler;
  rule.function = t.function;
  rule.nth = d.between(1, 12);
  rule.count = d.between(1, 3);
  if (rule.action == rpc::FaultAction::kDelay) rule.delay = milliseconds(d.between(5, 250));
  return rule;
}

}  // namespace

Schedule make_schedule(uint64_t seed) {
  Draw d(seed);
  Schedule s;
  s.seed = seed;
  s.world = d.chance(50) ? 3 : 4;
  s.trainers = s.world == 4 ? std::vector<int>{0, 3} : std::vector<int>{0};
  if (d.chance(30)) {
    s.victim = static_cast<int>(d.between(1, 2));
    s.kill_at = static_cast<int>(d.between(1, 8));
  }
  s.rpc_timeout = milliseconds(d.between(300, 700));
  const int64_t num_rules = d.between(1, 5);
  for (int64_t i = 0; i < num_rules; ++i)
    s.rules.push_back(draw_rule(d, s.world));
  for (size_t t = 0; t < s.trainers.size(); ++t) {
    std::vector<Round> rounds(static_cast<size_t>(d.between(2, 4)));
    for (Round& r : rounds) {
      r.key = d.between(-50, 50);
      r.input_owner = static_cast<int>(d.between(1, 2));
      r.relay = d.chance(50);
      r.step = d.chance(75);
      r.call_timeout = milliseconds(d.between(30, 300));
      r.pass_timeout = milliseconds(d.between(150, 600));
    }
    s.rounds.push_back(std::move(rounds));
  }
  return s;
}

std::string describe_rule(const rpc::FaultRule& rule) {
  std::ostringstream out;
  out << rpc::fault_action_name(rule.action);
  if (rule.action == rpc::FaultAction::kDelay) out << " " << rule.delay.count() << " ms";
  out << " from " << (rule.from.empty() ? "any" : rule.from) << " to "
      << (rule.to.empty() ? "any" : rule.to) << ", "
      << (rule.kind == rpc::MessageKind::kAny
              ? "messages"
              : (rule.kind == rpc::MessageKind::kRequest ? "requests" : "replies"));
  if (rule.handler) out << " of handler " << *rule.handler;
  if (!rule.function.empty()) out << " '" << rule.function << "'";
  out << ", nth " << rule.nth << ", count " << rule.count;
  return out.str();
}

std::string Schedule::describe() const {
  std::ostringstream out;
  out << "seed " << seed << ": " << world << " workers (" << (processes() ? "processes" : "threads")
      << "), rpc_timeout " << rpc_timeout.count() << " ms";
  if (victim >= 0) out << ", w" << victim << " killed at its request " << kill_at;
  out << "\n";
  for (const rpc::FaultRule& r : rules)
    out << "  rule: " << describe_rule(r) << "\n";
  for (size_t t = 0; t < trainers.size(); ++t) {
    for (size_t i = 0; i < rounds[t].size(); ++i) {
      const Round& r = rounds[t][i];
      out << "  w" << trainers[t] << " round " << i << ": key " << r.key << ", input on w"
          << r.input_owner << ", " << (r.relay ? "relayed" : "proxy") << ", call "
          << r.call_timeout.count() << " ms, pass " << r.pass_timeout.count() << " ms"
          << (r.step ? ", step" : "") << "\n";
    }
  }
  return out.str();
}

}  // namespace gradwire::chaos

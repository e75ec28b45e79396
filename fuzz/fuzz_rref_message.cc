// libFuzzer target: rref/'s messages (rref/proto/rref.proto) as worker w0's rref handlers
// serve them. Three live agents run in this process; each input is a sequence of messages
// (module_input.h) that w1 or w2 sends to w0 as real requests, so every one goes through
// the envelope, the rref interceptor (references among the arguments are accepted) and
// the handler, and w0's owner and fork tables see whole hostile sequences: forks of values
// never created, deletes of forks held elsewhere, fetches before creations, creations
// repeated or of the wrong type. Flags of a message:
//   bit 0  send it to the other handler than the one its operation belongs to
//   bit 1  w2 sends it (else w1)
//   2-4    the number of arguments
//   bit 5  do not wait for its reply before the next message (the two race on w0)
// A payload that parses is sent as it is; one that does not is sent too (and refused).
//
// Each input then ends as an honest sender would end it: a creation (of a function that
// does not exist) for every reference it asked about before creating it, and a delete of
// every fork it announced. After that every worker must hold nothing: no owned value, fork,
// user reference, pending child or message in flight. What is left is a leak, and the
// target traps. Errors the handlers reply with are expected.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "module_input.h"
#include "proto/rref.pb.h"

using namespace gradwire;
using namespace std::chrono_literals;
namespace wire = gradwire::rref::wire;

namespace {

// A class with methods, for creations by constructor and method calls.
class Counter {
 public:
  explicit Counter(int64_t start) : value_(start) {}
  int64_t add(int64_t n) { return value_ += n; }
  int64_t get() const { return value_; }

 private:
  int64_t value_;
};

rpc::Registry& fuzz_registry() {
  static rpc::Registry* reg = [] {
    auto* r = new rpc::Registry();
    r->def("make", [](int64_t n) { return full({2}, Scalar(static_cast<double>(n)), kFloat32); });
    r->def("ident", [](int64_t n) { return n; });
    r->def("fail", [](int64_t) -> int64_t { throw InvalidArgument("fuzz: failing on purpose"); });
    r->def_class<Counter>("Counter")
        .ctor<int64_t>()
        .method("add", &Counter::add)
        .method("get", &Counter::get);
    return r;
  }();
  return *reg;
}

std::vector<std::shared_ptr<rpc::RpcAgent>>& agents() {
  static auto* all =
      new std::vector<std::shared_ptr<rpc::RpcAgent>>(fuzz::start_agents(fuzz_registry()));
  return *all;
}

// Sends `payload` from worker `from` to w0; waits at most `wait` for the reply (a fetch of
// a reference not yet created is answered only once it is).
void send(int from, uint32_t handler, const std::string& payload, std::vector<rpc::Value> args,
          std::chrono::milliseconds wait) {
  rpc::Request request;
  request.handler = handler;
  request.function = "fuzz";
  request.payload.assign(payload.begin(), payload.end());
  request.args = std::move(args);
  try {
    Future<rpc::Value> reply = agents()[from]->send("w0", std::move(request));
    if (wait.count() > 0) reply.wait(wait);
  } catch (const Error&) {
    // Refused before it left (a value that cannot travel): as good as refused by w0.
  }
}

std::string serialise(const wire::RRefMessage& m) {
  return m.SerializeAsString();
}

bool settled(std::string& why) {
  for (int r = 0; r < fuzz::kWorkers; ++r) {
    const rref::RRefMetrics m = rref::metrics(*agents()[r]);
    if (m.owned_values != 0 || m.shared_values != 0 || m.owned_forks != 0 ||
        m.user_references != 0 || m.pending_children != 0 || m.messages_in_flight != 0) {
      why = "w" + std::to_string(r) + ": owned_values " + std::to_string(m.owned_values) +
            ", shared_values " + std::to_string(m.shared_values) + ", owned_forks " +
            std::to_string(m.owned_forks) + ", user_references " +
            std::to_string(m.user_references) + ", pending_children " +
            std::to_string(m.pending_children) + ", messages_in_flight " +
            std::to_string(m.messages_in_flight);
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)agents();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // What the input announced, per sender: forks to delete, references to create.
  std::set<std::tuple<int, uint64_t, uint64_t>> forks;
  std::set<std::tuple<int, uint64_t, std::string>> asked;
  for (fuzz::Message& m : fuzz::split(data, size)) {
    const int from = (m.flags & 2) != 0 ? 2 : 1;
    wire::RRefMessage message;
    const bool parsed = message.ParseFromString(m.payload);
    const bool runs_user_code = message.op_case() == wire::RRefMessage::kCreate ||
                                message.op_case() == wire::RRefMessage::kCallMethod ||
                                message.op_case() == wire::RRefMessage::kFetch;
    const bool wrong = (m.flags & 1) != 0;
    const uint32_t handler =
        runs_user_code != wrong ? rref::kRRefHandler : rref::kRRefControlHandler;
    // A Lost notice makes the receiver release everything of its sender for good (the
    // sender speaks only for itself); it would leave the rest of the run refused, so the
    // fuzzer does not send one.
    if (parsed && message.op_case() == wire::RRefMessage::kLost) continue;
    if (parsed) {
      switch (message.op_case()) {
        case wire::RRefMessage::kCreate: {
          const wire::Create& c = message.create();
          forks.emplace(from, c.rref_id(), c.fork_id());
          asked.emplace(from, c.rref_id(), c.type_name());
          if (c.target_rref_id() != 0)
            asked.emplace(from, c.target_rref_id(), c.target_type_name());
          break;
        }
        case wire::RRefMessage::kFetch:
          asked.emplace(from, message.fetch().rref_id(), message.fetch().type_name());
          break;
        case wire::RRefMessage::kCallMethod:
          asked.emplace(from, message.call_method().rref_id(), message.call_method().type_name());
          break;
        case wire::RRefMessage::kAddFork:
          forks.emplace(from, message.add_fork().rref_id(), message.add_fork().fork_id());
          break;
        default:
          break;
      }
    }
    send(from, handler, m.payload, std::move(m.args), (m.flags & 32) != 0 ? 0ms : 20ms);
  }

  // The honest end: a reference asked about is created (by a function that does not
  // exist, so the creation fails at once and whoever awaited it is answered), then every
  // fork the sender announced, and the cleanup's own, is deleted.
  uint64_t counter = 0xffff00000000;
  for (const auto& [from, rref_id, type_name] : asked) {
    // Only the sender's own references can be created by it.
    if (static_cast<int>(rref_id >> 48) != from) continue;
    wire::RRefMessage create;
    const uint64_t fork = (uint64_t{static_cast<uint32_t>(from)} << 48) | counter++;
    create.mutable_create()->set_rref_id(rref_id);
    create.mutable_create()->set_fork_id(fork);
    create.mutable_create()->set_type_name(type_name);
    create.mutable_create()->set_name("fuzz: no such function");
    send(from, rref::kRRefHandler, serialise(create), {}, 2000ms);
    forks.emplace(from, rref_id, fork);
  }
  for (const auto& [from, rref_id, fork] : forks) {
    wire::RRefMessage del;
    del.mutable_delete_fork()->set_rref_id(rref_id);
    del.mutable_delete_fork()->set_fork_id(fork);
    send(from, rref::kRRefControlHandler, serialise(del), {}, 2000ms);
  }
  // Protocol messages the input set off (accepts, forks of references among arguments and
  // their deletes) settle within a few round trips.
  fuzz::expect_settled("rref", 10s, settled);
  return 0;
}

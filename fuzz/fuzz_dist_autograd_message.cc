// libFuzzer target: dist_autograd/'s messages (dist_autograd/proto/dist_autograd.proto) as
// worker w0's handler serves them. Three live agents run in this process. For each input
// the target first records a real graph across them, in two contexts:
//   c0, made on w0: w0 calls w1's "square" with a leaf x (a send on w0, message id c0 + 1,
//       and a recv on w1, whose reply is a send on w1 and a recv on w0);
//   c1, made on w1: w1 calls w0's "square" (a recv on w0, whose reply is a send on w0,
//       message id c0 + 2, with the mul below it and the recv below that).
// Then each message of the input (module_input.h) is sent by w1 or w2 to w0 as a real
// request: discoveries, gradients (the request's arguments: tensors that fit the send or
// not, None, other values), waits and releases, in any order — what a peer's backward pass
// would send, and what a hostile peer could. Flags of a message:
//   bit 0  ids below 16 name what this input recorded: context 1 is c0, 2 is c1, k is
//          c0 + k; message k is c0 + k (w0 mints them in that order); pass ids stay as sent
//   bit 1  w2 sends it (else w1)
//   2-4    the number of arguments
//   bit 5  do not wait for its reply before the next message
// A payload that does not parse is sent as it is (and refused).
//
// Each input ends by releasing both contexts, as their owners do (and the senders' own
// copies, see below); then no worker may hold a context, a call or a running handler: a wait that
// never ends, or a context that stays, is a leak and the target traps. Errors the handler replies
// with are expected.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/autograd/variable.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/ops.h"
#include "module_input.h"
#include "proto/dist_autograd.pb.h"

using namespace gradwire;
using namespace std::chrono_literals;
namespace da = gradwire::dist_autograd;
namespace wire = gradwire::dist_autograd::wire;

namespace {

rpc::Registry& fuzz_registry() {
  static rpc::Registry* reg = [] {
    auto* r = new rpc::Registry();
    r->def("square", [](const Tensor& x) { return mul(x, x); });
    return r;
  }();
  return *reg;
}

std::vector<std::shared_ptr<rpc::RpcAgent>>& agents() {
  static auto* all =
      new std::vector<std::shared_ptr<rpc::RpcAgent>>(fuzz::start_agents(fuzz_registry()));
  return *all;
}

Tensor leaf() {
  Tensor t = tensor(std::vector<double>{1, 2});
  t.set_requires_grad(true);
  return t;
}

// The ids this input recorded, for ids below 16 in a message.
struct Recorded {
  uint64_t c0 = 0;
  uint64_t c1 = 0;
  uint64_t context(uint64_t id) const {
    if (id == 0 || id >= 16) return id;
    return id == 1 ? c0 : id == 2 ? c1 : c0 + id;
  }
  uint64_t message(uint64_t id) const { return id == 0 || id >= 16 ? id : c0 + id; }
};

std::string rewrite(const std::string& payload, const Recorded& ids) {
  wire::DistAutogradMessage m;
  if (!m.ParseFromString(payload)) return payload;
  switch (m.op_case()) {
    case wire::DistAutogradMessage::kDiscover: {
      wire::Discover* d = m.mutable_discover();
      d->set_context_id(ids.context(d->context_id()));
      for (int i = 0; i < d->message_ids_size(); ++i)
        d->set_message_ids(i, ids.message(d->message_ids(i)));
      break;
    }
    case wire::DistAutogradMessage::kPropagate: {
      wire::Propagate* p = m.mutable_propagate();
      p->set_context_id(ids.context(p->context_id()));
      p->set_message_id(ids.message(p->message_id()));
      break;
    }
    case wire::DistAutogradMessage::kWait:
      m.mutable_wait()->set_context_id(ids.context(m.wait().context_id()));
      break;
    case wire::DistAutogradMessage::kRelease:
      m.mutable_release()->set_context_id(ids.context(m.release().context_id()));
      break;
    default:
      break;
  }
  return m.SerializeAsString();
}

void send(int from, const std::string& payload, std::vector<rpc::Value> args,
          std::chrono::milliseconds wait) {
  rpc::Request request;
  request.handler = da::kDistAutogradHandler;
  request.function = "fuzz";
  request.payload.assign(payload.begin(), payload.end());
  request.args = std::move(args);
  try {
    Future<rpc::Value> reply = agents()[from]->send("w0", std::move(request));
    if (wait.count() > 0) reply.wait(wait);
  } catch (const Error&) {
    // Refused before it left: as good as refused by w0.
  }
}

bool settled(std::string& why) {
  for (int r = 0; r < fuzz::kWorkers; ++r) {
    rpc::RpcAgent& agent = *agents()[r];
    const size_t contexts = da::num_contexts(agent);
    const rpc::AgentMetrics m = agent.metrics();
    if (contexts != 0 || m.pending_calls != 0 || m.running_handlers != 0) {
      why = "w" + std::to_string(r) + ": contexts " + std::to_string(contexts) +
            ", pending_calls " + std::to_string(m.pending_calls) + ", running_handlers " +
            std::to_string(m.running_handlers);
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
  std::vector<fuzz::Message> messages = fuzz::split(data, size);
  rpc::RpcAgent& w0 = *agents()[0];
  rpc::RpcAgent& w1 = *agents()[1];
  Recorded ids;
  {
    da::Context c0(w0);
    ids.c0 = c0.id();
    Tensor x = leaf();
    Tensor y = w0.rpc_sync<Tensor>("w1", "square", x);
    std::optional<da::Context> c1;
    c1.emplace(w1);
    ids.c1 = c1->id();
    Tensor x1 = leaf();
    Tensor y1 = w1.rpc_sync<Tensor>("w0", "square", x1);
    for (fuzz::Message& m : messages) {
      const int from = (m.flags & 2) != 0 ? 2 : 1;
      const std::string payload = (m.flags & 1) != 0 ? rewrite(m.payload, ids) : m.payload;
      send(from, payload, std::move(m.args), (m.flags & 32) != 0 ? 0ms : 20ms);
    }
    // c1 ends first: it is current on this thread, over c0.
    c1.reset();
  }
  // A sender that had w0 release a context (which w0 then tells every worker it
  // touched but the sender) still holds its own copy: as an honest sender would, it
  // releases it too. w0 gets no such help: what it keeps is a finding.
  for (int r = 1; r < fuzz::kWorkers; ++r) {
    for (uint64_t ctx : {ids.c0, ids.c1}) {
      try {
        da::release(*agents()[r], ctx);
      } catch (const InvalidArgument&) {
        // Released already, as it should be.
      }
    }
  }
  fuzz::expect_settled("dist_autograd", 15s, settled);
  return 0;
}

// rpc/ under exhaustion: envelopes built to make the receiver allocate far more than they
// weigh, a peer that queues more requests than the worker will hold, and what a caller
// outside the group may learn. Each attack is refused with a typed error and the worker
// goes on serving.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/proto_bytes.h"
#include "support/rss.h"
#include "support/sync.h"
#include "wire.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using rpc::AgentOptions;
using rpc::EnvelopeLimits;
using rpc::Registry;
using test::Agents;
using test::start_agents;

// ---- what a hostile peer sends, byte by byte (support/proto_bytes.h)

using test::proto_bytes::length_delimited;
using test::proto_bytes::tag;
using test::proto_bytes::varint;

// Envelope{version 2, request{id, function, <body>}}: `request_body` holds the request's
// extra fields.
std::string envelope_with_request(uint64_t id, const std::string& request_body) {
  std::string request;
  tag(request, 1, 0);
  varint(request, id);
  length_delimited(request, 3, "echo");
  request += request_body;
  std::string env;
  tag(env, 1, 0);
  varint(env, rpc::kEnvelopeVersion);
  length_delimited(env, 2, request);
  return env;
}

using test::peak_rss_bytes;
using test::reset_peak_rss;

std::string malformed_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

// 32 MiB of empty arguments: two bytes each on the wire, ~16 M Values if parsed (several
// GiB). The scan refuses it at the limit, before Protobuf builds anything.
TEST(RpcEnvelopeExhaustion, EmptyRepeatedValuesAreCountedBeforeParsing) {
  std::string args;
  args.reserve(32u << 20);
  while (args.size() < (32u << 20)) {
    tag(args, 4, 2);
    args.push_back('\0');
  }
  const std::string payload = envelope_with_request(7, args);
  reset_peak_rss();
  const size_t before = peak_rss_bytes();
  const std::string text = malformed_text([&] { rpc::peek_tensors(payload); });
  EXPECT_NE(text.find("more than 1048576 values (max_values"), std::string::npos) << text;
  // The header is still read, so that the refusal can be answered.
  std::optional<rpc::EnvelopeHeader> header = rpc::peek_header(payload);
  ASSERT_TRUE(header.has_value());
  EXPECT_TRUE(header->is_request);
  EXPECT_EQ(header->id, 7u);
  EXPECT_LT(peak_rss_bytes() - before, size_t{64} << 20);
}

// Map entries with nothing in them are built too: they count.
TEST(RpcEnvelopeExhaustion, EmptyMapEntriesCount) {
  std::string map;
  for (int i = 0; i < 2000; ++i) {
    tag(map, 1, 2);
    map.push_back('\0');
  }
  std::string value;
  length_delimited(value, 9, map);
  std::string arg;
  length_delimited(arg, 4, value);
  EnvelopeLimits limits;
  limits.max_values = 1000;
  const std::string text =
      malformed_text([&] { rpc::decode(envelope_with_request(1, arg), {}, limits); });
  EXPECT_NE(text.find("more than 1000 values"), std::string::npos) << text;
}

// A million dims in one packed field of a tensor description.
TEST(RpcEnvelopeExhaustion, PackedTensorDimsAreCounted) {
  std::string dims(1u << 20, '\x01');
  std::string desc;
  length_delimited(desc, 2, dims);
  std::string payload = envelope_with_request(3, "");
  length_delimited(payload, 4, desc);
  const std::string text = malformed_text([&] { rpc::peek_tensors(payload); });
  EXPECT_NE(text.find("has more than 64 dims"), std::string::npos) << text;
}

// 64 MiB of a broadcast shape (TensorDesc.expand_to, packed): one byte a dim on the wire,
// eight once parsed (512 MiB, and more as the field grows). The scan refuses it at
// max_tensor_dims, before Protobuf builds any of it.
TEST(RpcEnvelopeExhaustion, PackedExpandToIsCountedBeforeParsing) {
  std::string payload = envelope_with_request(5, "");
  {
    std::string desc;
    length_delimited(desc, 2, std::string(1, '\x01'));  // sizes {1}
    length_delimited(desc, 9, std::string((64u << 20) - 64, '\x01'));
    length_delimited(payload, 4, desc);
  }
  ASSERT_LE(payload.size(), EnvelopeLimits{}.max_payload_bytes);
  reset_peak_rss();
  const size_t before = peak_rss_bytes();
  const std::string text = malformed_text([&] { rpc::peek_tensors(payload); });
  EXPECT_NE(text.find("tensor 0 has more than 64 expand_to dims (max_tensor_dims)"),
            std::string::npos)
      << text;
  std::optional<rpc::EnvelopeHeader> header = rpc::peek_header(payload);
  ASSERT_TRUE(header.has_value());
  EXPECT_EQ(header->id, 5u);
  EXPECT_LT(peak_rss_bytes() - before, size_t{64} << 20);
}

// 5,000 levels of lists: refused at max_depth, without recursing into the rest.
TEST(RpcEnvelopeExhaustion, DeepNestingIsRefusedWithoutRecursingIntoIt) {
  std::string value;  // innermost: an empty Value
  for (int i = 0; i < 5'000; ++i) {
    std::string list;
    length_delimited(list, 1, value);
    std::string outer;
    length_delimited(outer, 8, list);
    value = std::move(outer);
  }
  std::string arg;
  length_delimited(arg, 4, value);
  const std::string text =
      malformed_text([&] { rpc::peek_tensors(envelope_with_request(2, arg)); });
  EXPECT_NE(text.find("values nest deeper than 64"), std::string::npos) << text;
}

// Lengths that run past their message, groups, and a 17th extension are each refused with
// what was wrong.
TEST(RpcEnvelopeExhaustion, MalformedWireFormatIsNamed) {
  std::string past = envelope_with_request(1, "");
  tag(past, 4, 2);
  varint(past, 1u << 30);
  EXPECT_NE(malformed_text([&] { rpc::peek_tensors(past); }).find("runs past the end"),
            std::string::npos);
  std::string group = envelope_with_request(1, "");
  tag(group, 9, 3);
  EXPECT_NE(malformed_text([&] { rpc::peek_tensors(group); }).find("wire type 3"),
            std::string::npos);
  std::string extensions;
  for (int i = 0; i < 17; ++i) {
    std::string e;
    length_delimited(e, 1, "k" + std::to_string(i));
    length_delimited(extensions, 9, e);
  }
  EXPECT_NE(malformed_text([&] {
              rpc::peek_tensors(envelope_with_request(1, extensions));
            }).find("more than 16 extensions"),
            std::string::npos);
}

// ---- the in-flight budget on live agents

// Waits (bounded) until the agent's metrics satisfy `done`: a request returns its budget
// just after its reply is written, so the caller may see the reply a moment before.
bool metrics_reach(rpc::RpcAgent& agent,
                   const std::function<bool(const rpc::AgentMetrics&)>& done) {
  return eventually([&] { return done(agent.metrics()); });  // counters: polled
}

struct Gate {
  test::CountdownLatch arrived;
  test::CountdownLatch open{1};
  explicit Gate(int64_t n) : arrived(n) {}
};

void register_gate(Registry& reg, Gate& gate) {
  reg.def("held", [&gate](int64_t x) {
    gate.arrived.count_down();
    // Bounded: a test that fails never leaves the handler blocked for long.
    gate.open.wait(20s);
    return x;
  });
  reg.def("ping", [](int64_t x) { return x + 1; });
}

TEST(RpcBusy, APeerPastItsQueuedRequestsGetsBusyErrorAndTheWorkerGoesOn) {
  Registry reg;
  Gate gate(2);
  register_gate(reg, gate);
  AgentOptions options = test::agent_options(reg);
  options.max_queued_requests_per_peer = 2;
  Agents agents = start_agents(2, options);
  auto first = agents[0]->rpc_async<int64_t>("w1", "held", int64_t{1});
  auto second = agents[0]->rpc_async<int64_t>("w1", "held", int64_t{2});
  ASSERT_TRUE(gate.arrived.wait(10s));
  try {
    agents[0]->rpc_sync<int64_t>("w1", "ping", int64_t{1});
    ADD_FAILURE() << "expected a BusyError";
  } catch (const BusyError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("worker 'w1' (rank 1) is busy"), std::string::npos) << text;
    EXPECT_NE(text.find("max_queued_requests_per_peer (2 requests)"), std::string::npos) << text;
  }
  EXPECT_EQ(agents[1]->metrics().requests_refused_busy, 1u);
  EXPECT_EQ(agents[1]->metrics().queued_requests, 2u);
  gate.open.count_down();
  EXPECT_EQ(first.get(10s), 1);
  EXPECT_EQ(second.get(10s), 2);
  // The same connection carries on.
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "ping", int64_t{41}), 42);
  EXPECT_TRUE(metrics_reach(*agents[1], [](const rpc::AgentMetrics& m) {
    return m.queued_requests == 0 && m.inflight_bytes == 0;
  }));
  test::shutdown_agents(agents);
}

TEST(RpcBusy, TheQueueIsBoundedForAllPeersTogether) {
  Registry reg;
  Gate gate(2);
  register_gate(reg, gate);
  AgentOptions options = test::agent_options(reg);
  options.max_queued_requests = 2;
  Agents agents = start_agents(3, options);
  auto from0 = agents[0]->rpc_async<int64_t>("w1", "held", int64_t{1});
  auto from2 = agents[2]->rpc_async<int64_t>("w1", "held", int64_t{2});
  ASSERT_TRUE(gate.arrived.wait(10s));
  EXPECT_THROW(agents[0]->rpc_sync<int64_t>("w1", "ping", int64_t{1}), BusyError);
  try {
    agents[2]->rpc_sync<int64_t>("w1", "ping", int64_t{1});
    ADD_FAILURE() << "expected a BusyError";
  } catch (const BusyError& e) {
    EXPECT_NE(std::string(e.what()).find("max_queued_requests (2 requests)"), std::string::npos)
        << e.what();
  }
  gate.open.count_down();
  EXPECT_EQ(from0.get(10s), 1);
  EXPECT_EQ(from2.get(10s), 2);
  EXPECT_EQ(agents[2]->rpc_sync<int64_t>("w1", "ping", int64_t{1}), 2);
  test::shutdown_agents(agents);
}

// The byte budget counts the envelope too: many small requests whose arguments travel
// inside it are bounded by max_inflight_bytes, not only tensors beside it.
TEST(RpcBusy, InlineBytesCountAgainstTheTotalBudget) {
  Registry reg;
  Gate gate(1);
  reg.def("held_text", [&gate](const std::string& s) {
    gate.arrived.count_down();
    gate.open.wait(20s);
    return static_cast<int64_t>(s.size());
  });
  AgentOptions options = test::agent_options(reg);
  options.max_inflight_bytes = 96 << 10;
  Agents agents = start_agents(2, options);
  auto held = agents[0]->rpc_async<int64_t>("w1", "held_text", std::string(64 << 10, 'x'));
  ASSERT_TRUE(gate.arrived.wait(10s));
  try {
    agents[0]->rpc_sync<int64_t>("w1", "held_text", std::string(64 << 10, 'y'));
    ADD_FAILURE() << "expected a BusyError";
  } catch (const BusyError& e) {
    EXPECT_NE(std::string(e.what()).find("max_inflight_bytes (98304 bytes)"), std::string::npos)
        << e.what();
  }
  gate.open.count_down();
  EXPECT_EQ(held.get(10s), 64 << 10);
  EXPECT_TRUE(metrics_reach(*agents[1], [](const rpc::AgentMetrics& m) {
    return m.inflight_bytes == 0 && m.queued_requests == 0;
  }));
  test::shutdown_agents(agents);
}

TEST(RpcBusy, BudgetOptionsAreValidated) {
  Registry reg;
  AgentOptions options = test::agent_options(reg);
  options.max_queued_requests = 0;
  auto store = std::make_shared<c10d::HashStore>(5s);
  try {
    rpc::make_tensorpipe_agent("w0", 0, 1, store, options);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_queued_requests must be > 0"), std::string::npos)
        << e.what();
  }
}

// A caller learns that the name it sent is unknown, not what the worker has registered;
// the name itself comes back escaped.
TEST(RpcDisclosure, UnknownFunctionsListNothingAndEscapeTheName) {
  Registry reg;
  reg.def("secret_admin_function", [](int64_t x) { return x; });
  Agents agents = start_agents(2, test::agent_options(reg));
  try {
    agents[0]->rpc_sync<int64_t>("w1", "nope\n\x1b[31m", int64_t{1});
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("no function 'nope\\x0a\\x1b[31m' is registered"), std::string::npos)
        << text;
    EXPECT_EQ(text.find("secret_admin_function"), std::string::npos) << text;
  }
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire

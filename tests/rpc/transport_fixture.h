// What the transport suites share (transport_*_test.cc, ring_test.cc): groups of real agents
// on one store with the functions they serve, raw sockets that run a client handshake, read
// until the peer closes or speak TensorPipe's first frame by hand, and shared-memory ring
// segments. Header-only.
//
// Thread-safety: call from the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"
#include "transport/handshake.h"
#include "transport/ring.h"

namespace gradwire::rpc::transport_fixture {

using namespace std::chrono_literals;
using test::Agents;

// A fresh ring segment with rings of `capacity` bytes (nullptr, and a test failure, if it
// cannot be made).
inline std::unique_ptr<transport::RingSegment> make_segment(size_t capacity) {
  std::string error;
  auto segment = transport::RingSegment::create(capacity, &error);
  EXPECT_NE(segment, nullptr) << error;
  return segment;
}

// The functions the groups below serve.
inline void register_basics(Registry& reg) {
  reg.def("concat", [](const std::string& a, const std::string& b) { return a + b; });
  reg.def("echo", [](const Tensor& t) { return t; });
}

// Agents "w0" ... started on one store, which the tests read addresses from.
struct Group {
  std::shared_ptr<c10d::HashStore> store = std::make_shared<c10d::HashStore>(20s);
  Agents agents;
};

inline Group start_group(int n, const AgentOptions& options) {
  Group g;
  g.agents = test::start_agents(n, options, g.store);
  return g;
}

using test::published_address;
using test::raw_connect;
using test::send_all;

// Reads until the peer closes the connection (true) or 10 s pass (false).
inline bool closed_by_peer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// Runs a client handshake over a raw socket, claiming `who`; returns whether it completed.
inline bool raw_handshake(int fd, const std::string& secret, transport::PeerIdentity who = {}) {
  transport::Handshake hs(transport::Handshake::Role::kClient, secret, std::move(who));
  while (hs.state() == transport::Handshake::State::kRunning) {
    send_all(fd, hs.take_output());
    uint8_t byte = 0;
    if (::recv(fd, &byte, 1, 0) != 1) return false;
    hs.feed(&byte, 1);
  }
  send_all(fd, hs.take_output());
  return hs.state() == transport::Handshake::State::kDone;
}

namespace tp = tensorpipe;

// TensorPipe's hello packet, as an intruder's first frame would carry it.
inline std::string tensorpipe_hello(const std::string& name = "intruder") {
  tp::NopHolder<tp::Packet> hello;
  hello.getObject() = tp::SpontaneousConnection{name};
  std::string bytes(hello.getSize(), '\0');
  tp::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  EXPECT_FALSE(hello.write(writer).has_error());
  return bytes;
}

// `payload` as one frame of the stream transport: its length, then its bytes.
inline std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

// Test agent options with no direct copies (every tensor travels through the transport).
inline AgentOptions options_for(Registry& reg) {
  AgentOptions o = test::agent_options(reg);
  o.direct_copy_threads = 0;
  return o;
}

// w0 still gets an answer from w1.
inline void expect_serving(Group& g) {
  EXPECT_EQ(g.agents[0]->rpc_sync<std::string>("w1", "concat", std::string("still "),
                                               std::string("here")),
            "still here");
}

}  // namespace gradwire::rpc::transport_fixture

// gradwire's transports: the handshake on its own, then hostile connections, secrets, idle
// CPU and many processes through real agents.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstring>

#include <gtest/gtest.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/auth.h"
#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/sync.h"
#include "transport/handshake.h"
#include "transport/reactor.h"
#include "transport/ring.h"
#include "transport/stream_transport.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using test::Agents;
using transport::Handshake;
using transport::RingReader;
using transport::RingSegment;
using transport::RingWriter;

// ---- the handshake alone

// Passes bytes between two handshakes until neither has anything to say.
void exchange(Handshake& client, Handshake& server, bool byte_by_byte = false) {
  for (int round = 0; round < 8; ++round) {
    bool moved = false;
    for (auto [from, to] : {std::pair{&client, &server}, std::pair{&server, &client}}) {
      const std::string out = from->take_output();
      if (out.empty() || to->state() != Handshake::State::kRunning) continue;
      moved = true;
      if (byte_by_byte) {
        for (char c : out)
          to->feed(reinterpret_cast<const uint8_t*>(&c), 1);
      } else {
        EXPECT_EQ(to->feed(reinterpret_cast<const uint8_t*>(out.data()), out.size()), out.size());
      }
    }
    if (!moved) return;
  }
}

TEST(Handshake, WithoutASecretTwoHellosOpenTheConnection) {
  Handshake client(Handshake::Role::kClient, "");
  Handshake server(Handshake::Role::kServer, "");
  exchange(client, server);
  EXPECT_EQ(client.state(), Handshake::State::kDone);
  EXPECT_EQ(server.state(), Handshake::State::kDone);
  EXPECT_FALSE(client.authenticated());
  // Bytes after the peer's hello belong to the stream: they are not consumed.
  Handshake c2(Handshake::Role::kClient, "", {"w3", 3, 2});
  Handshake s2(Handshake::Role::kServer, "");
  std::string hello = c2.take_output();
  const size_t hello_bytes = transport::kHelloBytes + transport::kIdentityHeaderBytes + 2;
  ASSERT_EQ(hello.size(), hello_bytes);
  hello += "frame";
  EXPECT_EQ(s2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size()), hello_bytes);
  EXPECT_EQ(s2.state(), Handshake::State::kDone);
  // The server knows whom the client claims to be, but nothing proves it.
  EXPECT_EQ(s2.peer().name, "w3");
  EXPECT_EQ(s2.peer().rank, 3);
  EXPECT_EQ(s2.peer().incarnation, 2);
  EXPECT_FALSE(s2.authenticated());
}

TEST(Handshake, TheSameSecretAuthenticatesBothEndsEvenByteByByte) {
  Handshake client(Handshake::Role::kClient, "correct horse battery", {"w1", 1, 0});
  Handshake server(Handshake::Role::kServer, "correct horse battery");
  exchange(client, server, /*byte_by_byte=*/true);
  EXPECT_EQ(client.state(), Handshake::State::kDone) << client.error();
  EXPECT_EQ(server.state(), Handshake::State::kDone) << server.error();
  EXPECT_TRUE(client.authenticated());
  EXPECT_TRUE(server.authenticated());
  EXPECT_EQ(server.peer().name, "w1");
  EXPECT_EQ(server.peer().rank, 1);
}

TEST(Handshake, AWrongSecretFailsOnBothEndsWithoutNamingItAndTheServerNeverProves) {
  // The client proves first: the server refuses it, and the client learns so from the
  // verdict byte, never from a proof of the server's.
  Handshake client(Handshake::Role::kClient, "alpha alpha alpha");
  Handshake server(Handshake::Role::kServer, "bravo bravo bravo");
  std::string to_client;
  for (int round = 0; round < 4; ++round) {
    const std::string out = client.take_output();
    server.feed(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    const std::string back = server.take_output();
    to_client += back;
    client.feed(reinterpret_cast<const uint8_t*>(back.data()), back.size());
  }
  EXPECT_EQ(server.state(), Handshake::State::kFailed);
  EXPECT_NE(server.error().find("does not know this job's secret"), std::string::npos);
  EXPECT_EQ(client.state(), Handshake::State::kFailed);
  EXPECT_NE(client.error().find("the peer refused this worker's secret"), std::string::npos)
      << client.error();
  // Its hello and a refusal: nothing computed from the secret.
  EXPECT_EQ(to_client.size(), transport::kHelloBytes + 1);
  EXPECT_EQ(to_client.back(), '\0');
  for (const std::string* e : {&client.error(), &server.error()}) {
    EXPECT_EQ(e->find("alpha"), std::string::npos);
    EXPECT_EQ(e->find("bravo"), std::string::npos);
  }
  // A forged proof is refused the same way.
  Handshake server2(Handshake::Role::kServer, "bravo bravo bravo");
  Handshake honest(Handshake::Role::kClient, "bravo bravo bravo");
  std::string hello = honest.take_output();
  server2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
  EXPECT_EQ(server2.take_output().size(), transport::kHelloBytes);
  const std::string forged(transport::kMacBytes, '\x5a');
  server2.feed(reinterpret_cast<const uint8_t*>(forged.data()), forged.size());
  EXPECT_EQ(server2.state(), Handshake::State::kFailed);
  EXPECT_EQ(server2.take_output(), std::string(1, '\0'));
  EXPECT_NE(server2.error().find("does not know this job's secret"), std::string::npos);
}

TEST(Handshake, TheClaimedIdentityVersionAndFlagsAreInsideTheProof) {
  // A man in the middle who rewrites any byte of the client's hello (here: its rank, then
  // its name) makes the client's proof fail at the server.
  for (const size_t at : {transport::kHelloBytes, transport::kHelloBytes + 10}) {
    Handshake client(Handshake::Role::kClient, "a secret of the job", {"w1", 1, 0});
    Handshake server(Handshake::Role::kServer, "a secret of the job");
    std::string hello = client.take_output();
    ASSERT_LT(at, hello.size());
    hello[at] = static_cast<char>(hello[at] ^ 1);
    server.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
    const std::string back = server.take_output();
    client.feed(reinterpret_cast<const uint8_t*>(back.data()), back.size());
    const std::string proof = client.take_output();
    ASSERT_EQ(proof.size(), transport::kMacBytes);
    server.feed(reinterpret_cast<const uint8_t*>(proof.data()), proof.size());
    EXPECT_EQ(server.state(), Handshake::State::kFailed) << "byte " << at;
    EXPECT_EQ(server.take_output(), std::string(1, '\0'));
  }
}

TEST(Handshake, ASecretOnOneSideOnlySaysWhichSideLacksIt) {
  {
    Handshake client(Handshake::Role::kClient, "");
    Handshake server(Handshake::Role::kServer, "a secret of the job");
    exchange(client, server);
    EXPECT_EQ(server.state(), Handshake::State::kFailed);
    EXPECT_EQ(client.state(), Handshake::State::kFailed);
    EXPECT_NE(client.error().find("requires a shared secret and none is set here"),
              std::string::npos)
        << client.error();
    EXPECT_NE(client.error().find("GRADWIRE_SECRET"), std::string::npos);
    EXPECT_NE(server.error().find("the peer has no secret set"), std::string::npos);
  }
  {
    Handshake client(Handshake::Role::kClient, "a secret of the job");
    Handshake server(Handshake::Role::kServer, "");
    exchange(client, server);
    EXPECT_EQ(server.state(), Handshake::State::kFailed);
    EXPECT_EQ(client.state(), Handshake::State::kFailed);
    EXPECT_NE(client.error().find("the peer has no secret set"), std::string::npos);
    EXPECT_NE(server.error().find("this worker has none set"), std::string::npos);
  }
}

TEST(Handshake, GarbageAndOtherVersionsAreRefusedByName) {
  Handshake server(Handshake::Role::kServer, "");
  std::string junk(transport::kHelloBytes, 'x');
  server.feed(reinterpret_cast<const uint8_t*>(junk.data()), junk.size());
  EXPECT_EQ(server.state(), Handshake::State::kFailed);
  EXPECT_NE(server.error().find("not a gradwire transport connection"), std::string::npos);
  Handshake client(Handshake::Role::kClient, "");
  std::string hello = client.take_output();
  hello[4] = 9;
  Handshake server2(Handshake::Role::kServer, "");
  server2.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
  EXPECT_EQ(server2.state(), Handshake::State::kFailed);
  EXPECT_NE(server2.error().find("version 9, this worker version 2"), std::string::npos)
      << server2.error();
  // The server still says its version, so that the other end can name the mismatch too.
  const std::string back = server2.take_output();
  ASSERT_EQ(back.size(), transport::kHelloBytes);
  EXPECT_EQ(back[4], 2);
  Handshake old_client(Handshake::Role::kClient, "");
  std::string old_hello = back;
  old_hello[4] = 1;
  old_client.feed(reinterpret_cast<const uint8_t*>(old_hello.data()), old_hello.size());
  EXPECT_EQ(old_client.state(), Handshake::State::kFailed);
  EXPECT_NE(old_client.error().find("version 1, this worker version 2"), std::string::npos)
      << old_client.error();
}

// ---- where secrets come from

TEST(Secret, GivenThenEnvironmentThenFile) {
  ::unsetenv("GRADWIRE_SECRET");
  ::unsetenv("GRADWIRE_SECRET_FILE");
  EXPECT_EQ(resolve_secret(""), "");
  const std::string given = "given in the options";
  EXPECT_EQ(resolve_secret(given), given);
  const auto file =
      std::filesystem::temp_directory_path() / ("gradwire-secret-" + std::to_string(::getpid()));
  {
    std::ofstream out(file);
    out << "from-file, sixteen bytes or more\n";
  }
  ::setenv("GRADWIRE_SECRET_FILE", file.c_str(), 1);
  // The trailing newline is dropped.
  EXPECT_EQ(resolve_secret(""), "from-file, sixteen bytes or more");
  ::setenv("GRADWIRE_SECRET", "from-env, sixteen bytes or more", 1);
  EXPECT_EQ(resolve_secret(""), "from-env, sixteen bytes or more");
  EXPECT_EQ(resolve_secret(given), given);
  // A secret short enough to guess offline is refused, naming where it came from.
  ::setenv("GRADWIRE_SECRET", "from-env", 1);
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("GRADWIRE_SECRET"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  EXPECT_THROW(resolve_secret(std::string(kMinSecretBytes - 1, 'k')), InvalidArgument);
  EXPECT_EQ(resolve_secret(std::string(kMinSecretBytes, 'k')), std::string(kMinSecretBytes, 'k'));
  ::unsetenv("GRADWIRE_SECRET");
  { std::ofstream truncate(file); }
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("is empty"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  std::filesystem::remove(file);
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  ::unsetenv("GRADWIRE_SECRET_FILE");
}

// ---- the shared-memory rings alone

std::unique_ptr<RingSegment> make_segment(size_t capacity) {
  std::string error;
  auto segment = RingSegment::create(capacity, &error);
  EXPECT_NE(segment, nullptr) << error;
  return segment;
}

TEST(Ring, BytesSurviveWrapAroundInEveryChunking) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(0), segment->data(0), kCap);
  RingReader reader(segment->control(0), segment->data(0), kCap);
  std::mt19937 rng(11);
  // 1 MB through a 4 KiB ring, in writes of 1..3000 bytes split over two iovecs and reads
  // of 1..5000: every byte arrives, in order.
  constexpr size_t kTotal = 1 << 20;
  std::vector<char> sent(kTotal);
  for (char& c : sent)
    c = static_cast<char>(rng());
  std::vector<char> got;
  size_t written = 0;
  bool corrupt = false;
  while (got.size() < kTotal) {
    const size_t want = std::min<size_t>(1 + rng() % 3000, kTotal - written);
    const size_t split = want / 2;
    iovec iov[2] = {{sent.data() + written, split}, {sent.data() + written + split, want - split}};
    written += writer.write(iov, want == 0 ? 0 : 2, &corrupt);
    ASSERT_FALSE(corrupt);
    ASSERT_LE(written - got.size(), kCap);
    char buf[5000];
    const size_t n = reader.read(buf, 1 + rng() % sizeof(buf), &corrupt);
    ASSERT_FALSE(corrupt);
    got.insert(got.end(), buf, buf + n);
  }
  EXPECT_TRUE(std::equal(got.begin(), got.end(), sent.begin()));
  EXPECT_EQ(reader.position(), kTotal);
  EXPECT_EQ(writer.position(), kTotal);
}

// Frames larger than the piece a writer publishes at a time (kRingPublishBytes), copied
// out by a reader on another thread while they are copied in: every byte arrives, in
// order, across the ring's wrap-around.
TEST(Ring, LargeFramesReadWhileTheyAreWrittenArriveWhole) {
  constexpr size_t kCap = size_t{1} << 20;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(0), segment->data(0), kCap);
  RingReader reader(segment->control(0), segment->data(0), kCap);
  constexpr size_t kTotal = size_t{24} << 20;
  std::vector<char> sent(kTotal);
  std::mt19937 rng(13);
  for (char& c : sent)
    c = static_cast<char>(rng());
  std::atomic<bool> reader_corrupt{false};
  std::vector<char> got;
  got.reserve(kTotal);
  std::thread consumer([&] {
    std::mt19937 sizes(17);
    std::vector<char> buf(900 << 10);
    bool corrupt = false;
    while (got.size() < kTotal && !corrupt) {
      const size_t n = reader.read(buf.data(), 1 + sizes() % buf.size(), &corrupt);
      got.insert(got.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
      if (n == 0) std::this_thread::yield();
    }
    reader_corrupt = corrupt;
  });
  size_t written = 0;
  bool corrupt = false;
  while (written < kTotal && !corrupt) {
    // Frames of up to 700 KiB in two iovecs: many pieces each, and a wrap-around in most.
    const size_t want = std::min<size_t>(1 + rng() % (700 << 10), kTotal - written);
    const size_t split = want / 3;
    iovec iov[2] = {{sent.data() + written, split}, {sent.data() + written + split, want - split}};
    const size_t n = writer.write(iov, 2, &corrupt);
    written += n;
    if (n == 0) std::this_thread::yield();
  }
  consumer.join();
  EXPECT_FALSE(corrupt);
  EXPECT_FALSE(reader_corrupt.load());
  ASSERT_EQ(got.size(), kTotal);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), sent.begin()));
  EXPECT_EQ(reader.position(), kTotal);
}

TEST(Ring, AFullRingTakesWhatFitsAndAsksForAWakeUp) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(1), segment->data(1), kCap);
  RingReader reader(segment->control(1), segment->data(1), kCap);
  std::string big(kCap + 100, 'x');
  iovec iov{big.data(), big.size()};
  bool corrupt = false;
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), kCap);
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), 0u);
  EXPECT_FALSE(writer.wait_for_space(&corrupt));  // still full: the producer waits
  char buf[10];
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), sizeof(buf));
  EXPECT_TRUE(reader.producer_wants_wake());   // once
  EXPECT_FALSE(reader.producer_wants_wake());  // the mark was cleared
  EXPECT_TRUE(writer.writable(&corrupt));
  // A sleeping consumer is woken once per sleep.
  EXPECT_FALSE(writer.consumer_wants_wake());
  while (reader.read(buf, sizeof(buf), &corrupt) > 0) {
  }
  EXPECT_FALSE(reader.arm(&corrupt));  // nothing waiting: it may sleep
  iovec one{big.data(), 1};
  EXPECT_EQ(writer.write(&one, 1, &corrupt), 1u);
  EXPECT_TRUE(writer.consumer_wants_wake());
  EXPECT_FALSE(writer.consumer_wants_wake());
  EXPECT_TRUE(reader.arm(&corrupt));  // armed again, but a byte is there: no sleep
  EXPECT_FALSE(corrupt);
}

TEST(Ring, PositionsThePeerCorruptsAreCaughtNeverFollowed) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  transport::RingControl* control = segment->control(0);
  RingReader reader(control, segment->data(0), kCap);
  char buf[64];
  bool corrupt = false;
  // A tail more than a ring ahead of what was read.
  control->tail = kCap + 1;
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), 0u);
  EXPECT_TRUE(corrupt);
  // A tail behind it.
  corrupt = false;
  control->tail = 10;
  ASSERT_EQ(reader.read(buf, sizeof(buf), &corrupt), 10u);
  control->tail = 5;
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), 0u);
  EXPECT_TRUE(corrupt);
  // A consumer claiming to have read more than was written.
  RingWriter writer(segment->control(1), segment->data(1), kCap);
  segment->control(1)->head = 7;
  corrupt = false;
  iovec iov{buf, sizeof(buf)};
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), 0u);
  EXPECT_TRUE(corrupt);
}

TEST(Ring, SetupMessagesAndSegmentsAreCheckedBeforeMapping) {
  auto segment = make_segment(size_t{64} << 10);
  ASSERT_NE(segment, nullptr);
  const std::string setup = segment->setup_message();
  ASSERT_EQ(setup.size(), transport::kRingSetupBytes);
  std::string error;
  EXPECT_EQ(RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(setup.data()), &error),
            size_t{64} << 10);
  auto parse_error = [](std::string bytes) {
    std::string why;
    EXPECT_EQ(RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(bytes.data()), &why), 0u);
    return why;
  };
  EXPECT_NE(parse_error("XXXX" + setup.substr(4)).find("GWRS"), std::string::npos);
  std::string v2 = setup;
  v2[4] = 2;
  EXPECT_NE(parse_error(v2).find("version 2"), std::string::npos);
  std::string huge = setup;
  huge[5] = 40;  // 1 TiB rings
  EXPECT_NE(parse_error(huge).find("outside"), std::string::npos);
  std::string reserved = setup;
  reserved[7] = 1;
  EXPECT_NE(parse_error(reserved).find("reserved"), std::string::npos);

  // The descriptor: a sealed memfd of exactly the right size, nothing else.
  const size_t cap = size_t{64} << 10;
  auto attach_error = [&](int fd) {
    std::string why;
    EXPECT_EQ(RingSegment::attach(fd, cap, &why), nullptr);
    return why;
  };
  const int unsealed = ::memfd_create("t", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, static_cast<off_t>(4096 + 2 * cap)), 0);
  EXPECT_NE(attach_error(unsealed).find("sealed"), std::string::npos);
  const int small = ::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(small, 4096), 0);
  ASSERT_EQ(::fcntl(small, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_NE(attach_error(small).find("has 4096 bytes"), std::string::npos);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  EXPECT_NE(attach_error(pipe_fds[0]).find("not a sealable memfd"), std::string::npos);
  // The real thing maps, and both ends see each other's bytes.
  const int good = segment->release_fd();
  auto peer = RingSegment::attach(good, cap, &error);
  ASSERT_NE(peer, nullptr) << error;
  std::memcpy(segment->data(0), "ring", 4);
  EXPECT_EQ(std::memcmp(peer->data(0), "ring", 4), 0);
}

// ---- hostile connections against real agents

void register_basics(Registry& reg) {
  reg.def("concat", [](const std::string& a, const std::string& b) { return a + b; });
  reg.def("echo", [](const Tensor& t) { return t; });
}

struct Group {
  std::shared_ptr<c10d::HashStore> store = std::make_shared<c10d::HashStore>(20s);
  Agents agents;
};

Group start_group(int n, const AgentOptions& options) {
  Group g;
  g.agents = test::start_agents(n, options, g.store);
  return g;
}

using test::published_address;
using test::raw_connect;
using test::send_all;

// Reads until the peer closes the connection (true) or 10 s pass (false).
bool closed_by_peer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// Runs a client handshake over a raw socket, claiming `who`; returns whether it completed.
bool raw_handshake(int fd, const std::string& secret, transport::PeerIdentity who = {}) {
  Handshake hs(Handshake::Role::kClient, secret, std::move(who));
  while (hs.state() == Handshake::State::kRunning) {
    send_all(fd, hs.take_output());
    uint8_t byte = 0;
    if (::recv(fd, &byte, 1, 0) != 1) return false;
    hs.feed(&byte, 1);
  }
  send_all(fd, hs.take_output());
  return hs.state() == Handshake::State::kDone;
}

namespace tp = tensorpipe;

// TensorPipe's hello packet, as an intruder's first frame would carry it.
std::string tensorpipe_hello(const std::string& name = "intruder") {
  tp::NopHolder<tp::Packet> hello;
  hello.getObject() = tp::SpontaneousConnection{name};
  std::string bytes(hello.getSize(), '\0');
  tp::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  EXPECT_FALSE(hello.write(writer).has_error());
  return bytes;
}

std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

AgentOptions options_for(Registry& reg) {
  AgentOptions o = test::agent_options(reg);
  o.direct_copy_threads = 0;
  return o;
}

void expect_serving(Group& g) {
  EXPECT_EQ(g.agents[0]->rpc_sync<std::string>("w1", "concat", std::string("still "),
                                               std::string("here")),
            "still here");
}

TEST(TransportHostile, RandomBytesNeverStopTheListener) {
  Registry reg;
  register_basics(reg);
  Group g = start_group(2, options_for(reg));
  const auto w1 = published_address(*g.store, 1);
  ASSERT_NE(w1.second, 0);
  std::mt19937 rng(7);
  constexpr int kJunk = 40;
  for (int i = 0; i < kJunk; ++i) {
    const int fd = raw_connect(w1);
    // At least a hello's worth, so that the handshake sees it is garbage at once (shorter
    // junk waits for the handshake deadline: AHalfHandshake... covers that).
    std::string junk(static_cast<size_t>(transport::kHelloBytes + rng() % 4096), '\0');
    for (char& c : junk)
      c = static_cast<char>(rng());
    send_all(fd, junk);
    EXPECT_TRUE(closed_by_peer(fd)) << "junk connection " << i;
    ::close(fd);
  }
  // One that connects and leaves at once, another that leaves after its first bytes.
  ::close(raw_connect(w1));
  {
    const int fd = raw_connect(w1);
    send_all(fd, "GW");
    ::close(fd);
  }
  expect_serving(g);
  // A peer that was never seen before still gets in.
  EXPECT_EQ(
      g.agents[2 - 1]->rpc_sync<std::string>("w0", "concat", std::string("a"), std::string("b")),
      "ab");
  EXPECT_GE(g.agents[1]->metrics().connections_refused, static_cast<uint64_t>(kJunk));
  test::shutdown_agents(g.agents);
}

TEST(TransportHostile, HugeLengthsAreRefusedBeforeAnythingIsAllocated) {
  Registry reg;
  register_basics(reg);
  Group g = start_group(2, options_for(reg));
  const auto w1 = published_address(*g.store, 1);
  // 1. Right after a valid handshake, a first frame claiming 2^62 bytes.
  {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, ""));
    const uint64_t huge = uint64_t{1} << 62;
    send_all(fd, std::string(reinterpret_cast<const char*>(&huge), sizeof(huge)));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  // 2. A well-formed TensorPipe hello (of a worker of the group: without a secret, a claim
  //    the store's record backs is admitted), then a control frame claiming 2^62 bytes: the
  //    pipe is closed for it, the listener is untouched.
  {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, "", {"w0", 0, 0}));
    const uint64_t huge = uint64_t{1} << 62;
    send_all(fd, frame(tensorpipe_hello("w0")) +
                     std::string(reinterpret_cast<const char*>(&huge), sizeof(huge)));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
    EXPECT_GE(g.agents[1]->metrics().frames_refused, 1u);
  }
  // 3. A first frame that is not TensorPipe's hello; an empty one, and a hello cut short
  //    by a byte (TensorPipe's decoder would read past the end of those: fuzz_transport).
  for (const std::string& first : {std::string("definitely not a nop packet"), std::string(),
                                   tensorpipe_hello().substr(0, tensorpipe_hello().size() - 1)}) {
    const int fd = raw_connect(w1);
    ASSERT_TRUE(raw_handshake(fd, ""));
    send_all(fd, frame(first));
    EXPECT_TRUE(closed_by_peer(fd)) << first.size() << " bytes";
    ::close(fd);
  }
  expect_serving(g);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, 4u);
  test::shutdown_agents(g.agents);
}

TEST(TransportHostile, AHalfHandshakeIsClosedAtTheDeadlineAndBlocksNobody) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.handshake_timeout = 300ms;
  Group g = start_group(2, options);
  const auto w1 = published_address(*g.store, 1);
  const int stalled = raw_connect(w1);
  send_all(stalled, "GWTP\x01");  // 5 of the hello's 40 bytes, then nothing
  const auto t0 = std::chrono::steady_clock::now();
  expect_serving(g);  // served while the stalled connection waits
  EXPECT_TRUE(closed_by_peer(stalled));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, 5s);
  ::close(stalled);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, 1u);
  test::shutdown_agents(g.agents);
}

// A TensorPipe context that speaks gradwire's tcp with `secret`, as an outsider would.
std::string outsider_call_error(const std::pair<std::string, int>& to, const std::string& secret) {
  auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("outsider"));
  transport::StreamOptions o;
  o.secret = secret;
  context->registerTransport(0, "tcp", transport::create_stream_context(o));
  context->registerChannel(0, "basic", tp::channel::basic::create());
  auto pipe = context->connect("tcp://" + to.first + ":" + std::to_string(to.second));
  test::CountdownLatch done(1);
  std::string error;
  tp::Message message;
  message.metadata = "hello?";
  pipe->write(std::move(message), [&](const tp::Error& e) {
    if (e) error = e.what();
    done.count_down();
  });
  EXPECT_TRUE(done.wait(10s));
  context->close();
  context->join();
  return error;
}

TEST(TransportSecret, AJobWithASecretServesItsWorkersAndRefusesOutsiders) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.secret = "the job's secret, 16+ bytes";
  Group g = start_group(3, options);
  // Workers that share it call each other as usual, tensors included.
  EXPECT_EQ(sum(g.agents[2]->rpc_sync<Tensor>("w1", "echo", ones({1000}))).item<float>(), 1000);
  expect_serving(g);
  const auto w1 = published_address(*g.store, 1);
  const uint64_t before = g.agents[1]->metrics().connections_refused;
  const std::string wrong = outsider_call_error(w1, "a guess at the secret");
  EXPECT_NE(wrong.find("authentication failed"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find("the job's secret"), std::string::npos) << wrong;
  const std::string none = outsider_call_error(w1, "");
  EXPECT_NE(none.find("requires a shared secret and none is set here"), std::string::npos) << none;
  // A raw client with the wrong secret that ignores the server's proof is refused too.
  {
    const int fd = raw_connect(w1);
    EXPECT_FALSE(raw_handshake(fd, "another guess at the secret"));
    ::close(fd);
  }
  expect_serving(g);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, before + 2);
  test::shutdown_agents(g.agents);
}

// With tracing on, each connection's set-up is one span on each end: rpc.connect on the
// dialling side, rpc.accept on the listening side (naming the worker the peer claimed), with
// the transport, the outcome and the time its handshake took; a refused one is traced too.
TEST(TransportTrace, ConnectionSetUpIsTracedOnBothEndsAndARefusalToo) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("gradwire-transport-trace-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  trace::clear();
  {
    trace::ScopedCapture capture(dir.string());
    Registry reg;
    register_basics(reg);
    Group g = start_group(2, options_for(reg));
    expect_serving(g);
    const int fd = raw_connect(published_address(*g.store, 1));
    send_all(fd, std::string(transport::kHelloBytes, 'x'));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
    test::shutdown_agents(g.agents);
  }
  const std::string path = trace::flush();
  trace::clear();
  trace::set_directory("");
  std::ifstream in(path);
  const nlohmann::json file = nlohmann::json::parse(in);
  fs::remove_all(dir);

  int opened_out = 0;
  int accepted_from_w0 = 0;
  int refused = 0;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("cat") != "rpc") continue;
    const std::string name = e.at("name");
    if (name != "rpc.connect" && name != "rpc.accept") continue;
    const auto& args = e.at("args");
    const std::string transport = args.at("transport");
    EXPECT_TRUE(transport == "tcp" || transport == "local" || transport == "unix") << e.dump();
    const std::string outcome = args.at("outcome");
    if (outcome == "open") {
      // Opened: the handshake ended within the span.
      EXPECT_GE(args.at("handshake_us").get<int64_t>(), 0) << e.dump();
      EXPECT_LE(args.at("handshake_us").get<double>(), e.at("dur").get<double>() + 1) << e.dump();
      if (name == "rpc.connect") ++opened_out;
      if (name == "rpc.accept" && args.at("peer") == "w0") ++accepted_from_w0;
    }
    if (name == "rpc.accept" && outcome == "refused") {
      ++refused;
      EXPECT_EQ(args.at("handshake_us"), -1) << e.dump();
    }
  }
  EXPECT_GE(opened_out, 1) << file.dump(1);
  EXPECT_GE(accepted_from_w0, 1) << file.dump(1);
  EXPECT_GE(refused, 1) << file.dump(1);
}

// Per thread (name and id): user+system CPU ticks, from /proc.
std::map<std::string, long> thread_ticks() {
  std::map<std::string, long> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    long utime = 0;
    long stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    out[name + "/" + entry.path().filename().string()] = utime + stime;
  }
  return out;
}

// The CPU ticks that threads not in `before` (those that appeared since) use over the next
// second, and which of them used any ("name/tid:ticks ..."); threads whose name starts with
// `skip` (when not empty) are not counted.
struct CpuUse {
  long ticks = 0;
  std::string busy;
};
CpuUse cpu_over_a_second(const std::map<std::string, long>& before, const std::string& skip = "") {
  const auto ticks0 = thread_ticks();
  std::this_thread::sleep_for(1s);  // the measured stretch itself, not a wait for an event
  CpuUse use;
  for (const auto& [thread, ticks] : thread_ticks()) {
    if (before.count(thread) != 0) continue;
    if (!skip.empty() && thread.rfind(skip, 0) == 0) continue;
    auto it = ticks0.find(thread);
    const long delta = ticks - (it == ticks0.end() ? 0 : it->second);
    use.ticks += delta;
    if (delta > 0) use.busy += " " + thread + ":" + std::to_string(delta);
  }
  return use;
}

TEST(TransportIdle, ConnectedAgentsUseNoCpuWhileIdle) {
  Registry reg;
  register_basics(reg);
  // The agents' threads are those that appear with them (BLAS and the harness have theirs).
  const auto before = thread_ticks();
  Group g = start_group(2, options_for(reg));
  expect_serving(g);
  EXPECT_EQ(g.agents[1]->rpc_sync<std::string>("w0", "concat", std::string("x"), std::string("y")),
            "xy");
  // The measurement itself is an idle stretch: two agents, connected both ways, doing
  // nothing for a second. Busy-polling transports burn about a core per agent here.
  const CpuUse use = cpu_over_a_second(before);
  // Clock ticks are 10 ms: 2 ticks in a second is 1% of a core per agent.
  EXPECT_LE(use.ticks, 2) << "ticks used by the agents' threads over an idle second:" << use.busy;
  test::shutdown_agents(g.agents);
}

// A caller whose call is being served for a long time polls its transports for
// transport_spin_awaiting after the last traffic, then sleeps: waiting costs no CPU either.
TEST(TransportIdle, ACallerWaitingOnALongCallPollsBrieflyThenSleeps) {
  Registry reg;
  register_basics(reg);
  auto release = std::make_shared<Future<void>>();
  reg.def("held", [release] {
    release->wait(10s);
    return 1;
  });
  const auto before = thread_ticks();
  rpc::AgentOptions options = options_for(reg);
  options.transport_spin_awaiting = 3ms;
  Group g = start_group(2, options);
  expect_serving(g);
  Future<int> pending = g.agents[1]->rpc_async<int>("w0", "held");
  const CpuUse use = cpu_over_a_second(before);
  EXPECT_FALSE(pending.completed());
  // Polling for the whole second would be about 100 ticks.
  EXPECT_LE(use.ticks, 3) << "ticks used by the agents' threads while a call waited:" << use.busy;
  release->try_set_value();
  EXPECT_EQ(std::move(pending).get(10s), 1);
  test::shutdown_agents(g.agents);
}

TEST(TransportIdle, SpinOptionsOutOfRangeAreRefused) {
  Registry reg;
  for (const std::string field : {"transport_spin_awaiting", "transport_spin_backoff"}) {
    for (auto spin : {std::chrono::microseconds(-1), std::chrono::microseconds(1'000'001)}) {
      rpc::AgentOptions options = options_for(reg);
      (field == "transport_spin_awaiting" ? options.transport_spin_awaiting
                                          : options.transport_spin_backoff) = spin;
      try {
        Group g = start_group(1, options);
        ADD_FAILURE() << field << " " << spin.count() << " us was taken";
        test::shutdown_agents(g.agents);
      } catch (const std::exception& e) {  // start_group names the rank that failed
        EXPECT_NE(
            std::string(e.what()).find("AgentOptions::" + field + " must be in [0, 1 s], got " +
                                       std::to_string(spin.count()) + " us"),
            std::string::npos)
            << e.what();
      }
    }
  }
}

// The rule: a yield that took the backoff or longer ends polling; the next activity
// resumes it; a backoff of 0 never ends it.
TEST(TransportIdle, SpinBackoffEndsPollingAfterALongYieldUntilTheNextActivity) {
  transport::SpinBackoff backoff(100us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(5us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(99us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(100us);
  EXPECT_FALSE(backoff.allows_polling());
  backoff.yielded(1us);
  EXPECT_FALSE(backoff.allows_polling()) << "a short yield after a long one resumed polling";
  backoff.worked();
  EXPECT_TRUE(backoff.allows_polling());
  transport::SpinBackoff never(0us);
  never.yielded(10s);
  EXPECT_TRUE(never.allows_polling());
}

// On a core shared with a thread that computes without pause, polling transport threads
// (told to poll for a whole second after traffic) find their yields taking long, stop
// polling and sleep (transport_polls_backed_off counts it), and the next call still goes
// through (traffic wakes them). With transport_spin_backoff 0 they poll on, yielding to that
// thread between looks, and the counter stays 0.
TEST(TransportIdle, PollingThreadsThatCannotGetTheirCoreSleepInstead) {
  Registry reg;
  register_basics(reg);
  // Everything below, agents' threads included, runs on the core this thread is on now.
  cpu_set_t saved;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(::sched_getcpu(), &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  struct Restore {
    cpu_set_t set;
    ~Restore() { ::sched_setaffinity(0, sizeof(set), &set); }
  } restore{saved};
  auto backed_off = [&](std::chrono::microseconds backoff) {
    rpc::AgentOptions options = options_for(reg);
    options.transport_spin = 1s;
    options.transport_spin_awaiting = 1s;
    options.transport_spin_backoff = backoff;
    Group g = start_group(2, options);
    expect_serving(g);
    std::atomic<bool> stop{false};
    std::thread busy([&stop] {
      volatile uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed))
        n = n + 1;
    });
    uint64_t count = 0;
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(
          g.agents[1]->rpc_sync<std::string>("w0", "concat", std::string("a"), std::to_string(i)),
          "a" + std::to_string(i));
    }
    for (const auto& agent : g.agents)
      count += agent->metrics().transport_polls_backed_off;
    stop = true;
    busy.join();
    test::shutdown_agents(g.agents);
    return count;
  };
  EXPECT_GT(backed_off(100us), 0u) << "no transport thread stopped polling";
  EXPECT_EQ(backed_off(0us), 0u);
}

// ---- hostile connections to a "local" listener (rings)

int raw_local_connect(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&un), len), 0) << name;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `bytes` with descriptors attached to the first byte.
void send_with_fds(int fd, const std::string& bytes, const std::vector<int>& fds) {
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  EXPECT_EQ(::sendmsg(fd, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// A local listener with its stats, and a well-behaved client context.
struct LocalListener {
  std::shared_ptr<transport::TransportStats> stats = std::make_shared<transport::TransportStats>();
  std::shared_ptr<transport::StreamContext> server;
  std::shared_ptr<tp::transport::Listener> listener;
  std::string name = transport::unique_local_name();

  LocalListener() {
    transport::StreamOptions o;
    o.family = transport::StreamOptions::Family::kLocal;
    o.stats = stats;
    o.name = "server";
    o.handshake_timeout = 1s;
    o.max_frame_bytes = 1 << 20;
    server = transport::create_stream_context(o);
    listener = server->listen(name);
    EXPECT_EQ(server->listen_error(), "");
  }
  ~LocalListener() {
    listener->close();
    server->close();
    server->join();
  }

  // The next accepted connection (nullptr if none within 10 s).
  std::shared_ptr<tp::transport::Connection> accept() {
    test::CountdownLatch done(1);
    std::shared_ptr<tp::transport::Connection> conn;
    listener->accept([&](const tp::Error& e, std::shared_ptr<tp::transport::Connection> c) {
      if (!e) conn = std::move(c);
      done.count_down();
    });
    EXPECT_TRUE(done.wait(10s));
    return conn;
  }
};

// A client of gradwire's local transport says hello and a frame; the server reads both and
// answers through the rings.
void expect_local_round_trip(LocalListener& l) {
  transport::StreamOptions o;
  o.family = transport::StreamOptions::Family::kLocal;
  o.name = "client";
  auto client = transport::create_stream_context(o);
  auto conn = client->connect(l.name);
  tp::NopHolder<tp::Packet> hello;
  hello.getObject() = tp::SpontaneousConnection{"client"};
  conn->write(hello, [](const tp::Error& e) { EXPECT_FALSE(e) << e.what(); });
  const std::string big(300'000, 'q');  // more than a ring holds: it streams through
  conn->write(big.data(), big.size(), [](const tp::Error& e) { EXPECT_FALSE(e) << e.what(); });
  auto accepted = l.accept();
  ASSERT_NE(accepted, nullptr);
  test::CountdownLatch read(2);
  tp::NopHolder<tp::Packet> got_hello;
  accepted->read(got_hello, [&](const tp::Error& e) {
    EXPECT_FALSE(e) << e.what();
    read.count_down();
  });
  std::string got;
  accepted->read([&](const tp::Error& e, const void* p, size_t n) {
    EXPECT_FALSE(e) << e.what();
    if (!e) got.assign(static_cast<const char*>(p), n);
    read.count_down();
  });
  ASSERT_TRUE(read.wait(10s));
  EXPECT_EQ(got, big);
  test::CountdownLatch answered(1);
  const std::string reply = "through the ring";
  accepted->write(reply.data(), reply.size(), [](const tp::Error& e) { EXPECT_FALSE(e); });
  std::string back;
  conn->read([&](const tp::Error& e, const void* p, size_t n) {
    EXPECT_FALSE(e) << e.what();
    if (!e) back.assign(static_cast<const char*>(p), n);
    answered.count_down();
  });
  ASSERT_TRUE(answered.wait(10s));
  EXPECT_EQ(back, reply);
  conn->close();
  accepted->close();
  client->close();
  client->join();
}

TEST(TransportLocalHostile, BadRingSetupsAreRefusedAndTheListenerServesOn) {
  LocalListener l;
  const size_t cap = size_t{64} << 10;
  // Each case: a valid handshake, then a setup message with what it passes.
  auto refused = [&](const std::string& setup, const std::vector<int>& fds) {
    const int fd = raw_local_connect(l.name);
    EXPECT_TRUE(raw_handshake(fd, ""));
    send_with_fds(fd, setup, fds);
    for (int f : fds)
      ::close(f);
    const bool closed = closed_by_peer(fd);
    ::close(fd);
    return closed;
  };
  auto segment = make_segment(cap);
  ASSERT_NE(segment, nullptr);
  const std::string setup = segment->setup_message();
  // No descriptor at all.
  EXPECT_TRUE(refused(setup, {}));
  // A memfd the sender could still shrink under the server's mapping.
  const int unsealed = ::memfd_create("t", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, static_cast<off_t>(4096 + 2 * cap)), 0);
  EXPECT_TRUE(refused(setup, {unsealed}));
  // A pipe instead of a segment.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  EXPECT_TRUE(refused(setup, {pipe_fds[0]}));
  // Two descriptors.
  int two[2];
  ASSERT_EQ(::pipe(two), 0);
  EXPECT_TRUE(refused(setup, {two[0], two[1]}));
  // A setup message that is not one.
  const int memfd = segment->release_fd();
  EXPECT_TRUE(refused(std::string("GWRS\x07\x10\x00\x00", 8), {::dup(memfd)}));
  // Half a setup message, then nothing: closed at the handshake deadline.
  EXPECT_TRUE(refused(setup.substr(0, 4), {::dup(memfd)}));
  ::close(memfd);
  EXPECT_GE(l.stats->refused.load(), 6u);
  EXPECT_EQ(l.stats->accepted.load(), 0u);
  expect_local_round_trip(l);
  EXPECT_EQ(l.stats->accepted.load(), 1u);
}

TEST(TransportLocalHostile, CorruptRingsAndHugeFramesCloseOnlyTheirConnection) {
  LocalListener l;
  const size_t cap = size_t{64} << 10;
  // 1. A valid segment whose ring position then jumps ahead of anything written.
  {
    auto segment = make_segment(cap);
    ASSERT_NE(segment, nullptr);
    const int fd = raw_local_connect(l.name);
    ASSERT_TRUE(raw_handshake(fd, ""));
    send_with_fds(fd, segment->setup_message(), {segment->release_fd()});
    std::atomic_ref<uint64_t>(segment->control(0)->tail).store(cap * 5);
    send_all(fd, "w");  // a wake-up, in case the server's loop sleeps
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_GE(l.stats->refused.load(), 1u);
  // 2. A valid hello through the ring (the connection is accepted), then a frame claiming
  //    2^62 bytes: the read fails naming the limit, nothing was allocated for it.
  {
    auto segment = make_segment(cap);
    ASSERT_NE(segment, nullptr);
    const int fd = raw_local_connect(l.name);
    ASSERT_TRUE(raw_handshake(fd, "", {"intruder", -1, 0}));
    send_with_fds(fd, segment->setup_message(), {segment->release_fd()});
    RingWriter writer(segment->control(0), segment->data(0), cap);
    const std::string hello = frame(tensorpipe_hello());
    const uint64_t huge = uint64_t{1} << 62;
    iovec iov[2] = {{const_cast<char*>(hello.data()), hello.size()},
                    {const_cast<uint64_t*>(&huge), sizeof(huge)}};
    bool corrupt = false;
    ASSERT_EQ(writer.write(iov, 2, &corrupt), hello.size() + sizeof(huge));
    send_all(fd, "w");
    auto accepted = l.accept();
    ASSERT_NE(accepted, nullptr);
    test::CountdownLatch done(2);
    tp::NopHolder<tp::Packet> got_hello;
    accepted->read(got_hello, [&](const tp::Error& e) {
      EXPECT_FALSE(e) << e.what();
      done.count_down();
    });
    std::string error;
    accepted->read([&](const tp::Error& e, const void*, size_t) {
      if (e) error = e.what();
      done.count_down();
    });
    ASSERT_TRUE(done.wait(10s));
    EXPECT_NE(error.find("over the limit"), std::string::npos) << error;
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
    EXPECT_GE(l.stats->bad_frames.load(), 1u);
  }
  expect_local_round_trip(l);
}

// ---- a peer killed outright

TEST(TransportDeadPeer, APeerKilledWithSigkillFailsPendingCallsWithinTwoSeconds) {
  Registry reg;
  register_basics(reg);
  reg.def("kill_me", []() -> int64_t {
    ::kill(::getpid(), SIGKILL);
    return 0;
  });
  for (const std::vector<std::string>& transports :
       {std::vector<std::string>{"local", "tcp"}, std::vector<std::string>{"tcp"}}) {
    AgentOptions options = options_for(reg);
    options.transports = transports;
    options.rpc_timeout = 30s;
    const std::string label = transports.front();
    test::RankResults results = test::run_agent_processes(
        "transport-kill-" + label, 2, options, [&](int rank, c10d::Store& store, RpcAgent& agent) {
          if (rank == 1) {
            // Serves until "kill_me" ends the process; the wait only bounds a broken test.
            store.wait({"never"}, 30s);
            return;
          }
          EXPECT_EQ(agent.rpc_sync<std::string>("w1", "concat", std::string("a"), std::string("b")),
                    "ab");
          const auto t0 = std::chrono::steady_clock::now();
          Future<int64_t> killed = agent.rpc_async<int64_t>("w1", "kill_me");
          ASSERT_TRUE(killed.wait(20s));
          const auto waited = std::chrono::steady_clock::now() - t0;
          EXPECT_LT(waited, 2s) << label;
          std::string text;
          try {
            killed.value();
          } catch (const NetworkError& e) {
            text = e.what();
          }
          EXPECT_NE(text.find("worker 'w1'"), std::string::npos) << label << ": " << text;
          // A later call to it fails at once too, and this worker shuts down cleanly.
          EXPECT_THROW(
              agent.rpc_sync<std::string>("w1", "concat", std::string("a"), std::string("b")),
              NetworkError);
          agent.shutdown(false);
        });
    EXPECT_TRUE(results.ranks[0].ok) << label << ": " << results.summary();
    EXPECT_EQ(results.ranks[1].term_signal, SIGKILL) << label << ": " << results.summary();
  }
}

TEST(TransportScale, SixtyFourWorkerProcessesCallEachOtherAllToAll) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.num_worker_threads = 2;
  options.channels = {"cma", "basic"};
  options.rpc_timeout = 60s;
  options.join_timeout = 60s;
  constexpr int kWorkers = 64;
  test::RankResults results = test::run_agent_processes(
      "transport-64", kWorkers, options, [&](int rank, c10d::Store&, RpcAgent& agent) {
        std::vector<Future<std::string>> calls;
        for (int to = 0; to < kWorkers; ++to) {
          if (to == rank) continue;
          calls.push_back(agent.rpc_async<std::string>(test::worker_name(to), "concat",
                                                       std::to_string(rank), std::string(">")));
        }
        for (auto& f : calls) {
          if (f.get(60s) != std::to_string(rank) + ">") throw std::runtime_error("wrong reply");
        }
        agent.shutdown();
      });
  EXPECT_PRED_FORMAT1(test::AllRanksOk, results);
}

}  // namespace
}  // namespace gradwire::rpc

// Hostile connections to a "local" listener (TransportLocalHostile): bad ring setups,
// corrupt rings and huge frames close only their own connection, and the listener serves
// on through the rings.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener.h>

#include "support/agents.h"
#include "support/sync.h"
#include "transport/ring.h"
#include "transport/stream_transport.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;
using transport::RingWriter;

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

}  // namespace
}  // namespace gradwire::rpc

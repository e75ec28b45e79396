// The store's one loop thread under a pipeline of costly requests: no request may cost
// more than its reply (or its own bytes), and a connection whose pipelined requests use up
// a turn's work budget waits for the next turn while the loop serves everyone else. Each
// test drives a real TCPStoreServer in this process through raw sockets speaking the
// protocol (c10d/src/tcp_protocol.h) and measures a bystander being served meanwhile.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "support/ports.h"
#include "support/sync.h"
#include "tcp_protocol.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using proto::FrameWriter;
using proto::Limit;
using proto::Op;
using proto::Reply;
using test::CountdownLatch;

struct Frame {
  uint8_t kind = 0;
  uint32_t id = 0;
  std::string payload;
};

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// A raw protocol peer on a loopback socket; every wait has a deadline.
class Peer {
 public:
  // `send_buffer` > 0: the socket's send buffer, so that a long pipeline is handed to the
  // kernel whole even while the server reads nothing.
  explicit Peer(uint16_t port, int send_buffer = 0)
      : fd_(test::connect_loopback(port, {.send = send_buffer})) {}
  ~Peer() { ::close(fd_); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Whether all of `bytes` reached the kernel within `timeout`.
  bool send(const std::string& bytes, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      const auto left = left_ms(deadline);
      if (left <= 0) return false;
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, static_cast<int>(left));
    }
    return true;
  }

  // The next whole frame within `timeout`; nullopt at the timeout or the end of the stream.
  std::optional<Frame> read_frame(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const size_t avail = in_.size() - pos_;
      if (avail >= 4) {
        const auto* p = reinterpret_cast<const uint8_t*>(in_.data() + pos_);
        const uint32_t len = proto::load_u32(p);
        if (len >= proto::kMinFrame && avail >= 4 + uint64_t{len}) {
          Frame f;
          f.kind = p[4];
          f.id = proto::load_u32(p + 5);
          f.payload.assign(in_, pos_ + 9, len - 5);
          pos_ += 4 + len;
          return f;
        }
      }
      const auto left = left_ms(deadline);
      if (left <= 0) return std::nullopt;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
      char buf[64 * 1024];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      in_.erase(0, pos_);
      pos_ = 0;
      in_.append(buf, static_cast<size_t>(n));
    }
  }

  // HELLO and HELLO_OK with a store without a secret.
  bool join() {
    std::string out;
    FrameWriter w(out);
    w.begin(static_cast<uint8_t>(Op::kHello), 0);
    w.u32(proto::kMagic);
    w.u16(proto::kVersion);
    w.u8(0);
    w.raw(std::string(proto::kNonceBytes, 'n'));
    w.end();
    if (!send(out, 5s)) return false;
    const auto ok = read_frame(5s);
    return ok.has_value() && ok->kind == static_cast<uint8_t>(Reply::kHelloOk);
  }

 private:
  static int64_t left_ms(Clock::time_point deadline) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  }

  int fd_ = -1;
  std::string in_;
  size_t pos_ = 0;
};

// A request without a payload (list_keys, num_keys, time).
void empty_request(std::string& out, Op op, uint32_t id) {
  FrameWriter w(out);
  w.begin(static_cast<uint8_t>(op), id);
  w.end();
}

int64_t int_of(const Frame& f) {
  proto::FrameReader r(reinterpret_cast<const uint8_t*>(f.payload.data()), f.payload.size());
  const int64_t v = r.i64();
  return r.done() ? v : -1;
}

// The attack: a million keys whose listing is past the frame limit, then 20,000 list_keys
// of 9 bytes each, pipelined on one connection that reads nothing. Were each to sum every
// key before answering with a LIMIT frame of ~170 bytes, back-pressure would never engage
// and the loop (every client of the store, every launcher's heartbeat) would stall for
// minutes.
TEST(StoreLoopFairness,
     AFreshClientIsAnsweredWithin100msWhile20000ListKeysOverAMillionKeysArePending) {
  constexpr uint32_t kKeys = 1'000'000;
  constexpr uint32_t kRequests = 20'000;
  // Values of at most 1 KiB make a frame limit of about 67 KiB; the listing is ~12 MB.
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_value_bytes = 1024});
  CountdownLatch listing(1);
  std::atomic<bool> test_over{false};
  TCPStoreServerTestPeer::set_request_hook(server, [&](uint8_t op) {
    if (op != static_cast<uint8_t>(Op::kListKeys)) return;
    // Once the test is over, a server still busy with the pipeline drops it at once.
    if (test_over.load()) throw std::runtime_error("the test is over");
    listing.count_down();
  });

  // A million keys of 8 bytes with empty values: 250 pipelined multi_set frames.
  Peer loader(server.port());
  ASSERT_TRUE(loader.join());
  std::string load;
  constexpr uint32_t kPerFrame = 4000;
  char key[16];
  for (uint32_t first = 0; first < kKeys; first += kPerFrame) {
    const uint32_t n = std::min(kPerFrame, kKeys - first);
    FrameWriter w(load);
    w.begin(static_cast<uint8_t>(Op::kMultiSet), 0);
    w.u32(n);
    for (uint32_t i = first; i < first + n; ++i) {
      std::snprintf(key, sizeof(key), "k%07u", i);
      w.str(key);
      w.str("");
    }
    w.end();
  }
  empty_request(load, Op::kNumKeys, 1);
  ASSERT_TRUE(loader.send(load, 60s));
  const auto loaded = loader.read_frame(60s);
  ASSERT_TRUE(loaded.has_value());
  ASSERT_EQ(loaded->kind, static_cast<uint8_t>(Reply::kInt));
  ASSERT_EQ(int_of(*loaded), kKeys);

  // The pipeline, handed to the kernel whole; the server is handling it once the first
  // list_keys is.
  Peer attacker(server.port(), /*send_buffer=*/1 << 20);
  ASSERT_TRUE(attacker.join());
  std::string pipeline;
  for (uint32_t id = 1; id <= kRequests; ++id)
    empty_request(pipeline, Op::kListKeys, id);
  ASSERT_TRUE(attacker.send(pipeline, 10s));
  ASSERT_TRUE(listing.wait(10s));

  // A fresh client: connect, handshake and one request.
  const auto start = Clock::now();
  int64_t keys = -1;
  std::string error;
  try {
    TCPStoreOptions options;
    options.host = "127.0.0.1";
    options.port = server.port();
    options.timeout = 3s;
    options.connect_timeout = 3s;
    TCPStore fresh(options);
    keys = fresh.num_keys();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int64_t waited_ms = ms_since(start);
  EXPECT_EQ(error, "");
  EXPECT_EQ(keys, kKeys);
  EXPECT_LT(waited_ms, 100) << "the fresh client waited " << waited_ms << " ms";
  RecordProperty("fresh_client_ms", std::to_string(waited_ms));

  // Every list_keys is answered, each with the frame limit it would pass, within seconds.
  uint32_t answered = 0;
  const auto replies_start = Clock::now();
  while (answered < kRequests) {
    const auto reply = attacker.read_frame(5s);
    if (!reply) break;
    ASSERT_EQ(reply->kind, static_cast<uint8_t>(Reply::kLimit));
    ASSERT_EQ(reply->id, answered + 1);
    ASSERT_FALSE(reply->payload.empty());
    ASSERT_EQ(static_cast<Limit>(reply->payload[0]), Limit::kReplyBytes);
    ++answered;
  }
  EXPECT_EQ(answered, kRequests) << "after " << ms_since(replies_start) << " ms";
  test_over.store(true);
}

// The work budget of a turn: while one connection's long pipeline of cheap requests is
// being handled, another connection's request is answered before the pipeline's end. The
// server is held inside the pipeline's first request until the bystander's request has
// reached it, so the order does not depend on scheduling.
TEST(StoreLoopFairness, ABystanderIsServedBetweenTheTurnsOfAnotherConnectionsPipeline) {
  constexpr uint32_t kRequests = 20'000;
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  CountdownLatch pipeline_started(1);
  CountdownLatch bystander_sent(1);
  std::atomic<uint32_t> handled{0};
  std::atomic<int64_t> handled_before_bystander{-1};
  TCPStoreServerTestPeer::set_request_hook(server, [&](uint8_t op) {
    if (op == static_cast<uint8_t>(Op::kNumKeys)) {
      if (handled.fetch_add(1) == 0) {
        pipeline_started.count_down();
        bystander_sent.wait(10s);
      }
    } else if (op == static_cast<uint8_t>(Op::kTime)) {
      handled_before_bystander.store(handled.load());
    }
  });

  Peer pipeliner(server.port(), /*send_buffer=*/1 << 20);
  Peer bystander(server.port());
  ASSERT_TRUE(pipeliner.join());
  ASSERT_TRUE(bystander.join());
  std::string pipeline;
  for (uint32_t id = 1; id <= kRequests; ++id)
    empty_request(pipeline, Op::kNumKeys, id);
  ASSERT_TRUE(pipeliner.send(pipeline, 10s));
  ASSERT_TRUE(pipeline_started.wait(10s));
  std::string request;
  empty_request(request, Op::kTime, 7);
  ASSERT_TRUE(bystander.send(request, 5s));
  bystander_sent.count_down();

  const auto reply = bystander.read_frame(5s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->kind, static_cast<uint8_t>(Reply::kInt));
  EXPECT_EQ(reply->id, 7u);
  const int64_t before = handled_before_bystander.load();
  EXPECT_GE(before, 1);
  EXPECT_LT(before, kRequests) << "the bystander was served only after the whole pipeline";

  // The pipeline is still answered whole and in order.
  uint32_t answered = 0;
  while (answered < kRequests) {
    const auto r = pipeliner.read_frame(5s);
    if (!r) break;
    ASSERT_EQ(r->kind, static_cast<uint8_t>(Reply::kInt));
    ASSERT_EQ(r->id, answered + 1);
    ++answered;
  }
  EXPECT_EQ(answered, kRequests);
}

}  // namespace
}  // namespace gradwire::c10d

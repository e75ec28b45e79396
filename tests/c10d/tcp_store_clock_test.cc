// The store's TIME request and the clock offset a traced worker records from it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;

int64_t system_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Server and client share this host's clock: the server's reading lies between a reading
// taken before the request and one taken after its reply.
TEST(TCPStoreClock, TheServersTimeIsItsSystemClockAtTheRequest) {
  TCPStore store(TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  for (int i = 0; i < 3; ++i) {
    const int64_t before = system_ns();
    const int64_t server = store.server_time_ns();
    const int64_t after = system_ns();
    EXPECT_LE(before, server);
    EXPECT_LE(server, after);
  }
  // The store itself is unchanged by it.
  EXPECT_EQ(store.num_keys(), 0);
}

// The offset maps this process's steady clock onto the server's system clock: a steady
// reading plus the offset is the system clock now, off by at most half the kept round trip.
TEST(TCPStoreClock, AProbeKeepsItsShortestRoundTripAndItsOffsetMapsSteadyToTheStore) {
  TCPStore store(TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  const ClockProbe p = store.probe_clock(8);
  EXPECT_EQ(p.samples, 8);
  EXPECT_GT(p.rtt_ns, 0);
  EXPECT_EQ(p.address, "127.0.0.1:" + std::to_string(store.port()));
  const int64_t before = system_ns();
  const int64_t steady = trace::now_ns();
  const int64_t after = system_ns();
  const int64_t mapped = steady + p.offset_ns;
  EXPECT_GE(mapped, before - p.rtt_ns / 2 - 1);
  EXPECT_LE(mapped, after + p.rtt_ns / 2 + 1);
  EXPECT_THROW(store.probe_clock(0), InvalidArgument);
  EXPECT_THROW(store.probe_clock(1001), InvalidArgument);
}

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// Reads one frame (length and all) within 5 s; empty when the server closed the connection.
std::string read_frame(int fd) {
  std::string in;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    if (in.size() >= 4) {
      const uint32_t len = static_cast<uint8_t>(in[0]) | static_cast<uint8_t>(in[1]) << 8 |
                           static_cast<uint8_t>(in[2]) << 16 |
                           static_cast<uint32_t>(static_cast<uint8_t>(in[3])) << 24;
      if (in.size() >= 4 + len) return in.substr(0, 4 + len);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "timeout";
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return "";
    in.append(buf, static_cast<size_t>(n));
  }
}

// TIME has no payload: answered by an 8-byte INT; one that carries bytes is a protocol
// violation and costs the client its connection, as any malformed request does.
TEST(TCPStoreClock, ATimeRequestWithAPayloadIsRefusedLikeAnyMalformedRequest) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(server.port());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string hello = le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
                            std::string("\x03\x00\x00", 3) + std::string(32, 'n');
  const std::string time = le32(5) + std::string(1, '\x0f') + le32(7);
  const std::string bad_time = le32(6) + std::string(1, '\x0f') + le32(8) + "x";
  ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), ssize_t(hello.size()));
  const std::string hello_ok = read_frame(fd);
  ASSERT_GT(hello_ok.size(), 4u);
  EXPECT_EQ(static_cast<uint8_t>(hello_ok[4]), 0x81);
  ASSERT_EQ(::send(fd, time.data(), time.size(), MSG_NOSIGNAL), ssize_t(time.size()));
  const std::string reply = read_frame(fd);
  ASSERT_EQ(reply.size(), 4u + 1 + 4 + 8) << reply;
  EXPECT_EQ(static_cast<uint8_t>(reply[4]), 0x84);  // INT
  EXPECT_EQ(reply.substr(5, 4), le32(7));
  ASSERT_EQ(::send(fd, bad_time.data(), bad_time.size(), MSG_NOSIGNAL), ssize_t(bad_time.size()));
  // The server says why (an ERROR frame with id 0) and closes the connection.
  std::string frame = read_frame(fd);
  while (!frame.empty() && frame != "timeout")
    frame = read_frame(fd);
  EXPECT_EQ(frame, "") << "the connection was not closed";
  ::close(fd);
  // Others are still served.
  TCPStore client(TCPStoreOptions{.host = "127.0.0.1", .port = server.port(), .timeout = 10s});
  EXPECT_GT(client.server_time_ns(), 0);
}

TEST(TCPStoreClock, TracingRecordsTheOffsetOfTheStoreUnderAPrefixOnlyWhenEnabled) {
  auto tcp = std::make_shared<TCPStore>(
      TCPStoreOptions{.host = "127.0.0.1", .is_master = true, .timeout = 10s});
  auto prefixed = std::make_shared<PrefixStore>("job", tcp);
  trace::stop();
  EXPECT_FALSE(record_trace_clock_offset(prefixed));
  trace::start();
  EXPECT_FALSE(record_trace_clock_offset(std::make_shared<HashStore>()));
  ASSERT_TRUE(record_trace_clock_offset(prefixed, 4));
  trace::stop();
  const auto j = nlohmann::json::parse(trace::metadata("clock_offset"));
  EXPECT_EQ(j["samples"], 4);
  EXPECT_EQ(j["store"], "127.0.0.1:" + std::to_string(tcp->port()));
  EXPECT_GT(j["rtt_ns"].get<int64_t>(), 0);
  EXPECT_TRUE(j["offset_ns"].is_number_integer());
  EXPECT_THROW(trace::set_metadata("clock_sync", "1"), InvalidArgument);
  EXPECT_THROW(trace::set_metadata("worker_id", "{not json"), InvalidArgument);
  EXPECT_THROW(trace::set_metadata("", "1"), InvalidArgument);
  trace::clear();
}

}  // namespace
}  // namespace gradwire::c10d

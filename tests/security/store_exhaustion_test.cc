// The store's memory budget and handshake under attack: each test drives a real
// TCPStoreServer in this process, through TCPStore clients and, where the attack needs
// bytes no client would send, through raw sockets speaking the protocol
// (c10d/src/tcp_protocol.h). Each asserts a typed refusal (or the drop of the attacker), a
// fresh client still being served, and where memory is the point, this process's resident
// size staying under kRssBound.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/auth.h"
#include "gradwire/core/error.h"
#include "support/eventually.h"
#include "support/ports.h"
#include "tcp_protocol.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using gradwire::testing::eventually;
using proto::FrameWriter;
using proto::Limit;
using proto::Op;
using proto::Reply;
using ::testing::HasSubstr;

constexpr uint64_t kRssBound = uint64_t{512} << 20;

// This process's resident set size in bytes (VmRSS of /proc/self/status).
uint64_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

TCPStoreOptions client_options(uint16_t port, std::string secret = {}) {
  TCPStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = 10s;
  options.connect_timeout = 5s;
  options.secret = std::move(secret);
  return options;
}

struct Frame {
  uint8_t kind = 0;
  uint32_t id = 0;
  std::string payload;
};

// A raw protocol peer on a loopback socket.
class Peer {
 public:
  explicit Peer(uint16_t port, int receive_buffer = 0)
      : fd_(test::connect_loopback(port, {.receive = receive_buffer})) {}
  ~Peer() { ::close(fd_); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      ASSERT_GT(n, 0) << "send: " << std::strerror(errno);
      done += static_cast<size_t>(n);
    }
  }

  // The next whole frame within `timeout`; nullopt at the timeout or the end of the stream.
  std::optional<Frame> read_frame(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (in_.size() >= 4) {
        const uint32_t len = proto::load_u32(reinterpret_cast<const uint8_t*>(in_.data()));
        if (in_.size() >= 4 + uint64_t{len}) {
          Frame f;
          f.kind = static_cast<uint8_t>(in_[4]);
          f.id = proto::load_u32(reinterpret_cast<const uint8_t*>(in_.data()) + 5);
          f.payload = in_.substr(9, len - 5);
          in_.erase(0, 4 + len);
          return f;
        }
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
      char buf[64 * 1024];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      in_.append(buf, static_cast<size_t>(n));
    }
  }

  // True once the server reset the connection (or ended it) within `timeout`, without
  // reading anything: what a server that drops an unread client leaves behind.
  bool dropped(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd pfd{fd_, POLLRDHUP, 0};
      if (::poll(&pfd, 1, static_cast<int>(left)) > 0 &&
          (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        return true;
      }
    }
  }

  // True once the server ended the stream (after any frames) within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
      char buf[64 * 1024];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
  }

  // HELLO of protocol `version` with the given flags and nonce.
  void hello(uint16_t version = proto::kVersion, uint8_t flags = 0,
             const std::string& nonce = std::string(proto::kNonceBytes, 'n')) {
    std::string out;
    FrameWriter w(out);
    w.begin(static_cast<uint8_t>(Op::kHello), 0);
    w.u32(proto::kMagic);
    w.u16(version);
    w.u8(flags);
    w.raw(nonce);
    w.end();
    send(out);
  }

  // The whole handshake with a store without a secret.
  void join() {
    hello();
    const auto ok = read_frame();
    ASSERT_TRUE(ok.has_value());
    ASSERT_EQ(ok->kind, static_cast<uint8_t>(Reply::kHelloOk));
  }

 private:
  int fd_ = -1;
  std::string in_;
};

// Request frames.
std::string get_frame(uint32_t id, const std::string& key, uint64_t timeout_ms = 10'000) {
  std::string out;
  FrameWriter w(out);
  w.begin(static_cast<uint8_t>(Op::kGet), id);
  w.str(key);
  w.u64(timeout_ms);
  w.end();
  return out;
}

std::string keys_frame(Op op, uint32_t id, const std::string& key, uint32_t times,
                       uint64_t timeout_ms) {
  std::string out;
  FrameWriter w(out);
  w.begin(static_cast<uint8_t>(op), id);
  w.u32(times);
  for (uint32_t i = 0; i < times; ++i)
    w.str(key);
  w.u64(timeout_ms);
  w.end();
  return out;
}

// The limit a kLimit frame names.
Limit limit_of(const Frame& f) {
  return static_cast<Limit>(f.payload.empty() ? 0 : static_cast<uint8_t>(f.payload[0]));
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const StoreError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a StoreError: ") + e.what();
  }
  return "no error";
}

// ---- amplification

// The attack from the issue, at 8 MiB: one value named 65,536 times in one multi_get would
// be a 512 GiB reply. It is refused naming the frame limit, before any of it is built.
TEST(StoreExhaustion, MultiGetAmplificationIsRefusedNamingTheFrameLimit) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  TCPStore store(client_options(server.port()));
  store.set("big", std::string(8u << 20, 'v'));

  Peer attacker(server.port());
  attacker.join();
  attacker.send(keys_frame(Op::kMultiGet, 7, "big", 1u << 16, 0));
  const auto reply = attacker.read_frame(10s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->kind, static_cast<uint8_t>(Reply::kLimit));
  EXPECT_EQ(reply->id, 7u);
  EXPECT_EQ(limit_of(*reply), Limit::kReplyBytes);
  EXPECT_THAT(reply->payload, HasSubstr("frame limit"));

  // The same through the client: a StoreError naming the limit.
  const std::vector<std::string> keys(1u << 16, "big");
  EXPECT_THAT(error_of([&] { store.multi_get(keys); }), HasSubstr("max_frame"));

  // The attacker is still connected and served; so is a fresh client.
  attacker.send(get_frame(8, "big"));
  const auto value = attacker.read_frame(10s);
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(value->kind, static_cast<uint8_t>(Reply::kValue));
  EXPECT_EQ(value->payload.size(), 4u + (8u << 20));
  TCPStore fresh(client_options(server.port()));
  EXPECT_EQ(fresh.get("big").size(), 8u << 20);
  EXPECT_LT(rss_bytes(), kRssBound);
}

// Duplicates are answered, one value per key named and in order, from one stored copy.
TEST(StoreExhaustion, DuplicateKeysAreAnsweredOncePerNameInOrder) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  TCPStore store(client_options(server.port()));
  store.set("a", std::string_view("1"));
  store.set("b", std::string_view("22"));
  const std::vector<Bytes> values = store.multi_get({"a", "b", "a", "a", "b"});
  ASSERT_EQ(values.size(), 5u);
  const std::vector<std::string> expected = {"1", "22", "1", "1", "22"};
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(std::string(values[i].begin(), values[i].end()), expected[i]) << i;
  EXPECT_TRUE(store.check({"a", "a", "b", "a"}));
  EXPECT_FALSE(store.check({"a", "a", "missing"}));
}

// ---- back-pressure

// A client that sends gets of a 1 MiB value and never reads the replies: the server stops
// reading it past the high water mark, serves everyone else meanwhile, and drops it at
// slow_client_timeout. Without the bound 2,000 gets would queue 2 GB.
TEST(StoreExhaustion, UnreadRepliesStopTheReadingAndTheClientIsDropped) {
  TCPStoreServer server(TCPStoreServerOptions{
      .bind_host = "127.0.0.1", .unsent_high_water_bytes = 8u << 20, .slow_client_timeout = 600ms});
  TCPStore store(client_options(server.port()));
  store.set("value", std::string(1u << 20, 'v'));
  const uint64_t refused_before = server.num_refused();

  Peer reader_that_never_reads(server.port(), /*receive_buffer=*/64 * 1024);
  reader_that_never_reads.join();
  std::string gets;
  for (uint32_t i = 1; i <= 2000; ++i)
    gets += get_frame(i, "value");
  reader_that_never_reads.send(gets);

  // Served meanwhile, by a fresh client too.
  TCPStore fresh(client_options(server.port()));
  fresh.set("other", std::string_view("x"));
  EXPECT_EQ(fresh.get_string("other"), "x");
  EXPECT_LT(rss_bytes(), kRssBound);

  EXPECT_TRUE(eventually([&] { return server.num_refused() > refused_before; }, 5s))
      << "the client that reads nothing was not dropped";
  EXPECT_TRUE(eventually([&] { return server.num_clients() == 2; }, 2s));
  EXPECT_EQ(store.get("value").size(), 1u << 20);
  EXPECT_LT(rss_bytes(), kRssBound);
}

// ---- floods

// Connections past max_connections are accepted, told why and closed; the clients that
// hold the slots are untouched, and once they go a new client is served.
TEST(StoreExhaustion, ConnectionFloodIsRefusedAndAFreshClientServedOnceItEnds) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_connections = 16});
  {
    std::vector<std::unique_ptr<Peer>> flood;
    for (int i = 0; i < 16; ++i) {
      flood.push_back(std::make_unique<Peer>(server.port()));
      flood.back()->join();
    }
    ASSERT_TRUE(eventually([&] { return server.num_clients() == 16; }, 5s));

    Peer extra(server.port());
    const auto refusal = extra.read_frame();
    ASSERT_TRUE(refusal.has_value());
    EXPECT_EQ(refusal->kind, static_cast<uint8_t>(Reply::kLimit));
    EXPECT_EQ(limit_of(*refusal), Limit::kConnections);
    EXPECT_TRUE(extra.closed_by_server());

    TCPStoreOptions options = client_options(server.port());
    options.connect_timeout = 300ms;
    const std::string error = error_of([&] { TCPStore client(options); });
    EXPECT_THAT(error, HasSubstr("max_connections"));
    EXPECT_THAT(error, HasSubstr("16"));
    EXPECT_EQ(server.num_clients(), 16);
    EXPECT_LT(rss_bytes(), kRssBound);

    // One of the flood is still served.
    flood[3]->send(get_frame(1, "missing", 0));
    const auto timeout = flood[3]->read_frame();
    ASSERT_TRUE(timeout.has_value());
    EXPECT_EQ(timeout->kind, static_cast<uint8_t>(Reply::kTimeout));
  }
  ASSERT_TRUE(eventually([&] { return server.num_clients() == 0; }, 5s));
  TCPStore fresh(client_options(server.port()));
  fresh.set("k", std::string_view("v"));
  EXPECT_EQ(fresh.get_string("k"), "v");
}

TEST(StoreExhaustion, KeyFloodIsRefusedNamingMaxKeys) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_keys = 100});
  TCPStore store(client_options(server.port()));
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 100; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(Bytes{1});
  }
  store.multi_set(keys, values);
  EXPECT_EQ(store.num_keys(), 100);
  // A refused one-way set is reported by the first call that starts after the refusal was
  // read (here the second: the first reads it); add and append are refused at once.
  store.set("one too many", std::string_view("x"));
  EXPECT_EQ(store.num_keys(), 100);
  EXPECT_THAT(error_of([&] { store.num_keys(); }), HasSubstr("max_keys = 100"));
  EXPECT_THAT(error_of([&] { store.add("counter", 1); }), HasSubstr("max_keys"));
  EXPECT_THAT(error_of([&] { store.append("log", Bytes{1}); }), HasSubstr("max_keys"));
  // A multi_set that would pass the limit changes nothing, not even its existing keys.
  store.multi_set({"k0", "new"}, {Bytes{9}, Bytes{9}});
  EXPECT_EQ(store.num_keys(), 100);
  EXPECT_THAT(error_of([&] { store.num_keys(); }), HasSubstr("max_keys"));
  EXPECT_EQ(store.get("k0"), Bytes{1});
  EXPECT_EQ(store.num_keys(), 100);
  // Existing keys may change; a delete makes room.
  store.set("k1", std::string_view("changed"));
  EXPECT_EQ(store.get_string("k1"), "changed");
  EXPECT_TRUE(store.delete_key("k2"));
  EXPECT_EQ(store.add("counter", 1), 1);
  TCPStore fresh(client_options(server.port()));
  EXPECT_EQ(fresh.num_keys(), 100);
}

TEST(StoreExhaustion, TotalBytesFloodIsRefusedNamingMaxTotalBytes) {
  TCPStoreServer server(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_total_bytes = 4u << 20});
  TCPStore store(client_options(server.port()));
  const Bytes mib(1u << 20, 7);
  for (int i = 0; i < 3; ++i)
    store.set("v" + std::to_string(i), mib);
  EXPECT_EQ(store.num_keys(), 3);
  const std::string error = error_of([&] { store.compare_set("v3", Bytes{}, mib); });
  EXPECT_THAT(error, HasSubstr("max_total_bytes = " + std::to_string(4u << 20)));
  EXPECT_FALSE(store.check({"v3"}));
  EXPECT_THAT(error_of([&] { store.append("v0", mib); }), HasSubstr("max_total_bytes"));
  EXPECT_EQ(store.get("v0").size(), mib.size());
  // Replacing a value by one of the same size adds nothing; deleting frees room.
  store.set("v1", Bytes(1u << 20, 8));
  EXPECT_EQ(store.get("v1")[0], 8);
  EXPECT_TRUE(store.delete_key("v2"));
  store.set("v3", mib);
  EXPECT_EQ(TCPStore(client_options(server.port())).get("v3").size(), mib.size());
}

// Waits parked by all clients together are bounded: past max_parked_waits a wait is refused
// at once (typed), the parked ones still complete, and the store serves everyone.
TEST(StoreExhaustion, WaiterFloodHitsTheGlobalParkedLimit) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_parked_waits = 100});
  Peer a(server.port());
  a.join();
  Peer b(server.port());
  b.join();
  std::string waits;
  for (uint32_t i = 1; i <= 60; ++i)
    waits += keys_frame(Op::kWait, i, "gate", 1, 60'000);
  a.send(waits);
  // A check after them: its answer means that the 60 waits before it are parked.
  std::string check;
  FrameWriter w(check);
  w.begin(static_cast<uint8_t>(Op::kCheck), 100);
  w.u32(1);
  w.str("gate");
  w.end();
  a.send(check);
  const auto parked = a.read_frame();
  ASSERT_TRUE(parked.has_value());
  ASSERT_EQ(parked->kind, static_cast<uint8_t>(Reply::kBool));
  b.send(waits);
  int refused = 0;
  while (refused < 20) {
    const auto f = b.read_frame();
    ASSERT_TRUE(f.has_value()) << "only " << refused << " refusals";
    ASSERT_EQ(f->kind, static_cast<uint8_t>(Reply::kLimit));
    EXPECT_EQ(limit_of(*f), Limit::kParkedWaits);
    ++refused;
  }
  TCPStore store(client_options(server.port()));
  EXPECT_THAT(error_of([&] { store.wait({"gate"}, 10s); }), HasSubstr("max_parked_waits = 100"));
  store.set("gate", std::string_view("open"));
  int done = 0;
  while (done < 60) {
    const auto f = a.read_frame();
    ASSERT_TRUE(f.has_value()) << "only " << done << " waits completed";
    EXPECT_EQ(f->kind, static_cast<uint8_t>(Reply::kOk));
    ++done;
  }
  store.wait({"gate"}, 1s);
  EXPECT_LT(rss_bytes(), kRssBound);
}

// A wait naming one key 65,536 times is parked once: the loop keeps answering others at
// once, the set that completes it is quick, and its timeout lists the key once.
TEST(StoreExhaustion, AWaitNamingOneKey65536TimesDoesNotStallTheLoop) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  Peer waiter(server.port());
  waiter.join();
  for (uint32_t id = 1; id <= 8; ++id)
    waiter.send(keys_frame(Op::kWait, id, "gate", 1u << 16, 60'000));
  waiter.send(keys_frame(Op::kMultiGet, 9, "late", 1u << 16, 300));

  TCPStore other(client_options(server.port()));
  auto t0 = Clock::now();
  other.set("x", std::string_view("1"));
  EXPECT_EQ(other.get_string("x"), "1");
  EXPECT_LT(Clock::now() - t0, 1s);

  t0 = Clock::now();
  other.set("gate", std::string_view("open"));
  EXPECT_EQ(other.get_string("gate"), "open");
  EXPECT_LT(Clock::now() - t0, 1s);
  for (int i = 0; i < 8; ++i) {
    const auto f = waiter.read_frame(2s);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->kind, static_cast<uint8_t>(Reply::kOk));
  }
  const auto timeout = waiter.read_frame(3s);
  ASSERT_TRUE(timeout.has_value());
  EXPECT_EQ(timeout->kind, static_cast<uint8_t>(Reply::kTimeout));
  EXPECT_EQ(timeout->id, 9u);
  // u32 count 1, then "late" once.
  EXPECT_EQ(timeout->payload, std::string("\x01\x00\x00\x00\x04\x00\x00\x00late", 12));
}

// ---- the same attacks against the gradwire-store program

// The gradwire-store program of this build tree (beside tests/, in c10d/), if there is one.
std::optional<std::filesystem::path> store_program() {
  std::error_code ec;
  const auto self = std::filesystem::canonical("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  const auto program = self.parent_path().parent_path() / "c10d" / "gradwire-store";
  if (!std::filesystem::exists(program, ec)) return std::nullopt;
  return program;
}

// gradwire-store running as a child process; stopped with SIGTERM when destroyed.
class StoreProcess {
 public:
  StoreProcess(const std::filesystem::path& program, const std::vector<std::string>& flags) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<std::string> args = {program.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (rc != 0) {
      ::close(out[0]);
      throw std::runtime_error("posix_spawn failed");
    }
    // "gradwire-store listening on port N"
    std::string line;
    const auto deadline = Clock::now() + 10s;
    while (line.find('\n') == std::string::npos && Clock::now() < deadline) {
      pollfd pfd{out[0], POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    const auto at = line.find("port ");
    if (at == std::string::npos) throw std::runtime_error("gradwire-store did not start: " + line);
    port_ = static_cast<uint16_t>(std::stoi(line.substr(at + 5)));
  }
  ~StoreProcess() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;

  uint16_t port() const { return port_; }
  bool running() { return ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // The program's resident set size in bytes.
  uint64_t rss() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return UINT64_MAX;
  }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// The three attacks on the standalone program: each leaves it answering a fresh
// client with its RSS under 512 MiB.
TEST(StoreExhaustion, GradwireStoreSurvivesAmplificationUnreadRepliesAndAConnectionFlood) {
  const auto program = store_program();
  if (!program) GTEST_SKIP() << "no gradwire-store beside this test binary";
  StoreProcess store(*program, {"--host", "127.0.0.1", "--port", "0", "--max-connections", "24",
                                "--unsent-high-water-bytes", std::to_string(16u << 20),
                                "--slow-client-timeout-ms", "600"});
  TCPStore client(client_options(store.port()));
  client.set("big", std::string(8u << 20, 'v'));

  // Amplification.
  {
    Peer attacker(store.port());
    attacker.join();
    attacker.send(keys_frame(Op::kMultiGet, 1, "big", 1u << 16, 0));
    const auto reply = attacker.read_frame(10s);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->kind, static_cast<uint8_t>(Reply::kLimit));
    EXPECT_EQ(limit_of(*reply), Limit::kReplyBytes);
  }
  EXPECT_EQ(TCPStore(client_options(store.port())).get("big").size(), 8u << 20);
  EXPECT_LT(store.rss(), kRssBound);

  // Unread replies: 500 gets of 8 MiB (4 GB of replies) that are never read. The server
  // stops reading and then drops the connection (a reset: it leaves requests unread).
  {
    Peer reader_that_never_reads(store.port(), /*receive_buffer=*/64 * 1024);
    reader_that_never_reads.join();
    std::string gets;
    for (uint32_t i = 1; i <= 500; ++i)
      gets += get_frame(i, "big");
    reader_that_never_reads.send(gets);
    EXPECT_EQ(TCPStore(client_options(store.port())).get("big").size(), 8u << 20);
    EXPECT_LT(store.rss(), kRssBound);
    EXPECT_TRUE(reader_that_never_reads.dropped(5s));
  }
  EXPECT_LT(store.rss(), kRssBound);

  // A connection flood past max_connections (24, `client` included): connections are
  // opened until one is refused.
  {
    std::vector<std::unique_ptr<Peer>> flood;
    std::optional<Frame> refusal;
    while (!refusal && flood.size() < 30) {
      auto peer = std::make_unique<Peer>(store.port());
      peer->hello();
      auto answer = peer->read_frame();
      ASSERT_TRUE(answer.has_value());
      if (answer->kind == static_cast<uint8_t>(Reply::kHelloOk)) {
        flood.push_back(std::move(peer));
      } else {
        refusal = std::move(answer);
      }
    }
    ASSERT_TRUE(refusal.has_value()) << flood.size() << " connections were all accepted";
    EXPECT_EQ(flood.size(), 23u);
    EXPECT_EQ(refusal->kind, static_cast<uint8_t>(Reply::kLimit));
    EXPECT_EQ(limit_of(*refusal), Limit::kConnections);
    EXPECT_EQ(client.get("big").size(), 8u << 20) << "a client connected before is served";
  }
  EXPECT_TRUE(eventually(
      [&] {
        try {
          TCPStoreOptions options = client_options(store.port());
          options.connect_timeout = 200ms;
          return TCPStore(options).get("big").size() == (8u << 20);
        } catch (const StoreError&) {
          return false;  // the flood's connections are still being closed
        }
      },
      5s));
  EXPECT_LT(store.rss(), kRssBound);
  EXPECT_TRUE(store.running());
}

// ---- a handler that throws

TEST(StoreExhaustion, AnExceptionInAHandlerClosesOnlyThatConnection) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  TCPStoreServerTestPeer::set_request_hook(server, [](uint8_t op) {
    if (op == static_cast<uint8_t>(Op::kNumKeys)) throw std::bad_alloc();
  });
  TCPStore victim(client_options(server.port()));
  TCPStore bystander(client_options(server.port()));
  victim.set("k", std::string_view("v"));
  try {
    victim.num_keys();
    ADD_FAILURE() << "num_keys succeeded";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory"));
  }
  EXPECT_EQ(bystander.get_string("k"), "v");
  // The victim reconnects on its next call.
  EXPECT_EQ(victim.get_string("k"), "v");
  EXPECT_TRUE(eventually([&] { return server.num_clients() == 2; }, 5s));
}

// ---- the journal

std::filesystem::path fresh_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-exhaustion-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string contents(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(StoreExhaustion, TheJournalIsNeverWrittenThroughASymbolicLink) {
  const auto dir = fresh_dir("symlink");
  const auto victim = dir / "victim";
  std::ofstream(victim) << "precious";
  const auto journal = dir / "store.journal";

  // A symbolic link planted where the compaction writes its temporary file.
  std::filesystem::create_symlink(victim, journal.string() + ".tmp");
  try {
    TCPStoreServer server(
        TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal.string()});
    ADD_FAILURE() << "the server wrote its journal through a planted link";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("symbolic link"));
  }
  EXPECT_EQ(contents(victim), "precious");

  // The journal itself a symbolic link.
  std::filesystem::remove(journal.string() + ".tmp");
  std::filesystem::create_symlink(victim, journal);
  try {
    TCPStoreServer server(
        TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal.string()});
    ADD_FAILURE() << "the server followed a journal that is a link";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("symbolic link"));
  }
  EXPECT_EQ(contents(victim), "precious");

  // A stale temporary file (a compaction cut short) is a regular file: replaced.
  std::filesystem::remove(journal);
  std::ofstream(journal.string() + ".tmp") << "half a compaction";
  TCPStoreServer server(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal.string()});
  TCPStore(client_options(server.port())).set("k", std::string_view("v"));
  std::filesystem::remove_all(dir);
}

// A journal that cannot be written (here: the file size limit) makes the store refuse
// writes, typed, instead of holding them in memory; reads go on; once it can be written
// again, writes are accepted and a restarted store has them.
TEST(StoreExhaustion, AJournalThatCannotBeWrittenMakesWritesRefused) {
  const auto dir = fresh_dir("full");
  const auto journal = dir / "store.journal";
  auto server = std::make_unique<TCPStoreServer>(TCPStoreServerOptions{
      .bind_host = "127.0.0.1", .journal = journal.string(), .journal_fsync = true});
  TCPStore store(client_options(server->port()));
  store.set("before", std::string_view("1"));
  EXPECT_EQ(store.get_string("before"), "1");

  // Writes past the journal's current size fail with EFBIG (SIGXFSZ ignored).
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto previous = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = std::filesystem::file_size(journal) + 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string first;
  std::string second;
  std::string read_back;
  {
    // The change whose record fails was applied; the ones after it are refused.
    first = error_of([&] { store.compare_set("during", Bytes{}, Bytes(4096, 1)); });
    second = error_of([&] { store.add("counter", 1); });
    read_back = store.get_string("before");
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, previous);
  EXPECT_EQ(first, "no error");
  EXPECT_THAT(second, HasSubstr("journal"));
  EXPECT_THAT(second, HasSubstr("cannot be written"));
  EXPECT_EQ(read_back, "1");

  // Writable again: the next turn writes what was kept, and writes are accepted.
  EXPECT_TRUE(
      eventually([&] { return error_of([&] { store.add("counter", 1); }) == "no error"; }, 5s));
  server.reset();
  TCPStoreServer restarted(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal.string()});
  TCPStore again(client_options(restarted.port()));
  EXPECT_EQ(again.get_string("before"), "1");
  EXPECT_EQ(again.get("during").size(), 4096u);
  EXPECT_EQ(again.add("counter", 0), 1);
  std::filesystem::remove_all(dir);
}

// ---- the handshake

constexpr const char* kSecret = "the store's secret, 16+ bytes";

// A stranger without the secret never receives a proof: HELLO_OK carries none, and a
// wrong proof is answered by REFUSED without one. With the right proof the server proves
// itself over the same transcript.
TEST(StoreExhaustion, TheClientProvesFirstAndStrangersGetNoProof) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = kSecret});
  const std::string nonce(proto::kNonceBytes, 'c');
  auto hello_ok = [&](Peer& peer) {
    peer.hello(proto::kVersion, proto::kFlagSecret, nonce);
    const auto f = peer.read_frame();
    EXPECT_TRUE(f.has_value());
    return f.value_or(Frame{});
  };
  auto auth_frame = [](const std::string& proof) {
    std::string out;
    FrameWriter w(out);
    w.begin(static_cast<uint8_t>(Op::kAuth), 0);
    w.raw(proof);
    w.end();
    return out;
  };
  // The transcript as the server sees it, from its HELLO_OK.
  auto transcript_of = [&](const Frame& f) {
    proto::FrameReader r(reinterpret_cast<const uint8_t*>(f.payload.data()), f.payload.size());
    proto::Transcript t;
    EXPECT_EQ(r.u16(), proto::kVersion);
    t.max_key = r.u32();
    t.max_value = r.u32();
    t.max_keys = r.u32();
    t.max_frame = r.u32();
    t.server_flags = r.u8();
    t.server_nonce = std::string(r.raw(proto::kNonceBytes, "server nonce"));
    EXPECT_TRUE(r.done()) << "HELLO_OK carries more than version, limits, flags and nonce";
    t.client_flags = proto::kFlagSecret;
    t.client_nonce = nonce;
    return t;
  };
  auto mac = [](std::string_view label, const proto::Transcript& t, std::string_view secret) {
    const Digest256 d = hmac_sha256(secret, proto::transcript(label, t));
    return std::string(reinterpret_cast<const char*>(d.data()), d.size());
  };

  {
    Peer stranger(server.port());
    const Frame f = hello_ok(stranger);
    ASSERT_EQ(f.kind, static_cast<uint8_t>(Reply::kHelloOk));
    EXPECT_EQ(f.payload.size(), 2u + 16u + 1u + proto::kNonceBytes);
    const proto::Transcript t = transcript_of(f);
    stranger.send(auth_frame(mac(proto::kClientProofLabel, t, "a guess of sixteen bytes")));
    const auto answer = stranger.read_frame();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->kind, static_cast<uint8_t>(Reply::kRefused));
    // u32 length + the message, and nothing else: no proof.
    ASSERT_GE(answer->payload.size(), 4u);
    EXPECT_EQ(proto::load_u32(reinterpret_cast<const uint8_t*>(answer->payload.data())) + 4u,
              answer->payload.size());
    EXPECT_EQ(answer->payload.find(mac(proto::kServerProofLabel, t, kSecret)), std::string::npos);
    EXPECT_TRUE(stranger.closed_by_server());
  }
  {
    Peer member(server.port());
    const Frame f = hello_ok(member);
    const proto::Transcript t = transcript_of(f);
    member.send(auth_frame(mac(proto::kClientProofLabel, t, kSecret)));
    const auto answer = member.read_frame();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->kind, static_cast<uint8_t>(Reply::kOk));
    EXPECT_EQ(answer->payload, mac(proto::kServerProofLabel, t, kSecret));
    // A proof over other limits (a man in the middle changing HELLO_OK) would not match.
    proto::Transcript changed = t;
    changed.max_value += 1;
    EXPECT_NE(answer->payload, mac(proto::kServerProofLabel, changed, kSecret));
    member.send(get_frame(5, "missing", 0));
    const auto timeout = member.read_frame();
    ASSERT_TRUE(timeout.has_value());
    EXPECT_EQ(timeout->kind, static_cast<uint8_t>(Reply::kTimeout));
  }
  TCPStore good(client_options(server.port(), kSecret));
  good.set("k", std::string_view("v"));
  EXPECT_EQ(good.get_string("k"), "v");
}

TEST(StoreExhaustion, AVersion2HelloIsRefusedForGood) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  Peer old(server.port());
  old.hello(2);
  const auto answer = old.read_frame();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->kind, static_cast<uint8_t>(Reply::kRefused));
  EXPECT_THAT(answer->payload, HasSubstr("unsupported protocol version 2"));
  EXPECT_THAT(answer->payload, HasSubstr("version 3"));
  EXPECT_TRUE(old.closed_by_server());
  TCPStore fresh(client_options(server.port()));
  fresh.set("k", std::string_view("v"));
  EXPECT_EQ(fresh.get_string("k"), "v");
}

TEST(StoreExhaustion, SecretsShorterThan16BytesAreRefused) {
  EXPECT_THROW(TCPStoreServer(TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = "short"}),
               InvalidArgument);
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = kSecret});
  EXPECT_THROW(TCPStore(client_options(server.port(), "fifteen bytes!!")), InvalidArgument);
  TCPStore(client_options(server.port(), kSecret)).set("k", std::string_view("v"));
}

// Keys in the server's errors are escaped and cut: a key of control bytes cannot forge
// lines, and a 64 KiB key does not make a 64 KiB message.
TEST(StoreExhaustion, KeysInErrorsAreEscapedAndCut) {
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  TCPStore store(client_options(server.port()));
  const std::string key = "line\nERROR forged\x1b[31m" + std::string(60'000, 'k');
  store.set(key, std::string_view("not a number"));
  const std::string error = error_of([&] { store.add(key, 1); });
  EXPECT_THAT(error, HasSubstr("line\\x0aERROR forged\\x1b[31m"));
  EXPECT_EQ(error.find('\n'), std::string::npos);
  EXPECT_LT(error.size(), 1024u);
}

// The last line of defence: a frame or string whose length would not fit the protocol's
// u32 is refused, never cut to 32 bits.
TEST(StoreExhaustion, FrameLengthsPastFourGiBAreRefusedNotTruncated) {
  std::string out;
  FrameWriter w(out);
  w.begin(static_cast<uint8_t>(Reply::kValue), 1);
  EXPECT_THROW(w.bytes("x", (uint64_t{1} << 32) + 1), std::length_error);
  EXPECT_EQ(out.size(), 9u) << "nothing of the refused string was written";
}

}  // namespace
}  // namespace gradwire::c10d

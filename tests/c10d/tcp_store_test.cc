// TCPStore beyond the shared suite: ports, many clients, threads sharing one client, a
// server that dies or is restarted, hostile bytes on the server port, limits and options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "c10d_test_util.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "support/harness.h"
#include "support/log_capture.h"
#include "support/sync.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;

TCPStoreOptions client_options(uint16_t port) {
  TCPStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = 10s;
  options.connect_timeout = 10s;
  return options;
}

TEST(TCPStoreTest, PortZeroReportsTheRealPort) {
  TCPStore master(TCPStoreOptions{.is_master = true, .timeout = 10s});
  ASSERT_NE(master.port(), 0);
  ASSERT_NE(master.server(), nullptr);
  EXPECT_EQ(master.server()->port(), master.port());
  TCPStore client(client_options(master.port()));
  EXPECT_FALSE(client.is_master());
  client.set("hello", std::string_view("world"));
  EXPECT_EQ(master.get_string("hello"), "world");
}

TEST(TCPStoreTest, OptionsAreValidated) {
  EXPECT_THROW(TCPStore(TCPStoreOptions{.port = 0}), InvalidArgument);
  EXPECT_THROW(TCPStore(TCPStoreOptions{.port = 1, .listen_fd = 3}), InvalidArgument);
  EXPECT_THROW(TCPStore(TCPStoreOptions{.is_master = true, .timeout = 0ms}), InvalidArgument);
  EXPECT_THROW(TCPStore(TCPStoreOptions{.is_master = true, .wait_for_workers = true}),
               InvalidArgument);
  EXPECT_THROW(TCPStore(TCPStoreOptions{.is_master = true, .max_value_bytes = 0}), InvalidArgument);
  EXPECT_THROW(TCPStoreServer(TCPStoreServerOptions{.max_key_bytes = 0}), InvalidArgument);
}

TEST(TCPStoreTest, UnreachableServerIsNetworkErrorNamingTheAddress) {
  uint16_t port = 0;
  const int fd = test::bound_socket(port, /*listen=*/false);  // bound, not listening: refused
  TCPStoreOptions options = client_options(port);
  options.connect_timeout = 300ms;
  const auto start = Clock::now();
  try {
    TCPStore store(options);
    ADD_FAILURE() << "connected to a port nobody listens on";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port)));
  }
  EXPECT_LT(Clock::now() - start, 3s);
  ::close(fd);
}

TEST(TCPStoreTest, BindingAPortInUseIsNetworkError) {
  TCPStoreServer first(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  EXPECT_THROW(
      TCPStoreServer(TCPStoreServerOptions{.bind_host = "127.0.0.1", .port = first.port()}),
      NetworkError);
}

TEST(TCPStoreTest, ThreadsShareOneClientWithoutBlockingEachOther) {
  TCPStore store(TCPStoreOptions{.is_master = true, .timeout = 10s});
  // A thread parked in get must not hold up another thread's set on the same client.
  std::thread getter([&] { EXPECT_EQ(store.get_string("late", 10s), "value"); });
  std::thread waiter([&] { store.wait({"late", "later"}, 10s); });
  store.set("late", std::string_view("value"));
  store.set("later", std::string_view("value"));
  getter.join();
  waiter.join();

  constexpr int kThreads = 8;
  constexpr int kAdds = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        store.add("shared", 1);
        store.set("t" + std::to_string(t), std::to_string(i));
        EXPECT_EQ(store.get_string("t" + std::to_string(t)), std::to_string(i));
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(store.add("shared", 0), kThreads * kAdds);
}

TEST(TCPStoreTest, WaitForWorkersReturnsOnceAllConnected) {
  uint16_t port = 0;
  const int fd = test::bound_socket(port, true);
  test::CountdownLatch master_ready(1);
  std::atomic<bool> master_done{false};
  std::thread master([&] {
    TCPStoreOptions options;
    options.is_master = true;
    options.listen_fd = fd;
    options.world_size = 3;
    options.wait_for_workers = true;
    options.timeout = 10s;
    TCPStore store(options);
    master_done = true;
    master_ready.count_down();
    store.wait({"release"}, 10s);
  });
  TCPStoreOptions options = client_options(port);
  options.world_size = 3;
  options.wait_for_workers = true;
  TCPStore first(options);
  EXPECT_FALSE(master_done.load());  // two of three have joined
  TCPStore second(options);
  EXPECT_TRUE(master_ready.wait(10s));
  second.set("release", std::string_view("1"));
  master.join();
}

TEST(TCPStoreTest, ThousandClientsPassABarrier) {
  const rlim_t limit = test::raise_fd_limit();
  // Each client costs two descriptors here (client and server side), plus some slack.
  int clients = 1024;
  if (limit < rlim_t{2 * 1024 + 64}) {
    clients = static_cast<int>((limit - 64) / 2);
    GTEST_LOG_(INFO) << "descriptor limit " << limit << " allows only " << clients << " clients";
  }
  TCPStore master(TCPStoreOptions{.is_master = true, .timeout = 30s});
  const uint16_t port = master.port();
  const auto start = Clock::now();
  test::RankResults results = test::run_ranks_as_threads(
      clients,
      [&](int rank) {
        TCPStoreOptions options = client_options(port);
        options.timeout = 40s;
        options.connect_timeout = 40s;
        TCPStore store(options);
        barrier(store, "thousand", clients, 40s);
      },
      60s);
  EXPECT_ALL_RANKS_OK(results);
  EXPECT_EQ(master.add("thousand", 0), clients);
  GTEST_LOG_(INFO) << clients << " clients connected and passed a barrier in "
                   << std::chrono::duration<double>(Clock::now() - start).count() << " s";
}

// Runs a TCPStoreServer in a forked child (call before this process starts threads).
// Returns the child's pid and the server's port.
pid_t fork_server(uint16_t& port,
                  TCPStoreServerOptions options = TCPStoreServerOptions{.bind_host = "127.0.0.1"}) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      TCPStoreServer server(options);
      const uint16_t p = server.port();
      if (::write(fds[1], &p, sizeof(p)) != sizeof(p)) ::_exit(1);
      ::pause();  // serves until killed
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(fds[1]);
  if (::read(fds[0], &port, sizeof(port)) != sizeof(port)) port = 0;
  ::close(fds[0]);
  return pid;
}

TEST(TCPStoreTest, KilledServerFailsPendingCallsAndRestartedServerServesAgain) {
  uint16_t port = 0;
  const pid_t server = fork_server(port);
  ASSERT_NE(port, 0) << "the server child did not start";

  constexpr int kClients = 4;
  std::vector<std::unique_ptr<TCPStore>> stores;
  for (int i = 0; i < kClients; ++i) {
    TCPStoreOptions options = client_options(port);
    options.timeout = 30s;
    options.connect_timeout = 1s;  // bounds the reconnection attempt after the kill
    stores.push_back(std::make_unique<TCPStore>(options));
  }
  // Each client parks a call that the server holds. Whether or not a call reached the
  // server before the kill, it must fail fast: a parked call sees the connection end, a
  // later one finds it dead and cannot reconnect within connect_timeout.
  test::CountdownLatch parked(kClients);
  std::vector<std::string> failures(kClients);
  std::vector<double> seconds_after_kill(kClients, -1);
  std::atomic<int64_t> kill_time_ns{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      stores[i]->add("alive", 1);
      parked.count_down();
      try {
        if (i % 2 == 0) {
          stores[i]->get("never", 30s);
        } else {
          stores[i]->wait({"never", "either"}, 30s);
        }
        failures[i] = "returned";
      } catch (const NetworkError& e) {
        failures[i] = e.what();
      } catch (const std::exception& e) {
        failures[i] = std::string("wrong error: ") + e.what();
      }
      const auto now = Clock::now().time_since_epoch().count();
      seconds_after_kill[i] = (now - kill_time_ns.load()) / 1e9;
    });
  }
  ASSERT_TRUE(parked.wait(10s));
  // A round trip on each client, pipelined behind its parked call in the usual case.
  for (auto& s : stores)
    EXPECT_FALSE(s->check({"never"}));
  kill_time_ns = Clock::now().time_since_epoch().count();
  ::kill(server, SIGKILL);
  for (auto& t : threads)
    t.join();
  int status = 0;
  ::waitpid(server, &status, 0);
  for (int i = 0; i < kClients; ++i) {
    EXPECT_THAT(failures[i], HasSubstr("127.0.0.1:" + std::to_string(port))) << "client " << i;
    EXPECT_LT(seconds_after_kill[i], 2.0) << "client " << i;
  }

  // A new server on the same port: the same client objects reconnect on their next call.
  TCPStoreServer restarted(TCPStoreServerOptions{.bind_host = "127.0.0.1", .port = port});
  EXPECT_EQ(restarted.port(), port);
  for (int i = 0; i < kClients; ++i) {
    stores[i]->set("back/" + std::to_string(i), std::string_view("yes"));
    EXPECT_EQ(stores[i]->get_string("back/" + std::to_string(i)), "yes");
  }
  EXPECT_EQ(stores[0]->add("after", 2), 2);
  TCPStore fresh(client_options(port));
  EXPECT_EQ(fresh.num_keys(), kClients + 1);
}

TEST(TCPStoreTest, StoppingAnInProcessServerFailsPendingCallsAtOnce) {
  auto server = std::make_unique<TCPStoreServer>(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  TCPStoreOptions options = client_options(server->port());
  options.connect_timeout = 200ms;
  TCPStore client(options);
  EXPECT_FALSE(client.check({"k"}));
  std::string failure;
  std::thread waiter([&] {
    try {
      client.get("never", 30s);
    } catch (const NetworkError& e) {
      failure = e.what();
    }
  });
  // Usually pipelined behind the parked get; either way the get must fail fast.
  EXPECT_FALSE(client.check({"never"}));
  const auto start = Clock::now();
  server.reset();
  waiter.join();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_THAT(failure, HasSubstr("127.0.0.1:"));
}

// A raw TCP connection for sending hostile bytes.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("raw connect failed");
    }
  }
  ~RawSocket() { ::close(fd_); }
  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // True once the server closed the connection (end of file or reset), within timeout.
  bool closed_by_server(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;  // 0: end of file; <0: reset
    }
  }

 private:
  int fd_ = -1;
};

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// HELLO (protocol version 3): length 44: op 1, id 0, magic "GWST", version, flags, a nonce.
std::string hello_frame(uint8_t flags = 0, uint16_t version = 3) {
  return le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
         std::string(1, static_cast<char>(version & 0xff)) +
         std::string(1, static_cast<char>(version >> 8)) +
         std::string(1, static_cast<char>(flags)) + std::string(32, 'n');
}

TEST(TCPStoreTest, ServerSurvivesGarbageAndKeepsServing) {
  test::LogCapture log;
  auto server_holder = std::make_unique<TCPStoreServer>(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_value_bytes = 1024});
  TCPStoreServer& server = *server_holder;
  const uint16_t port = server.port();
  TCPStore good(client_options(port));
  good.set("before", std::string_view("1"));

  struct Attack {
    std::string name;
    std::string bytes;
  };
  std::mt19937 rng(1234);
  std::vector<Attack> attacks;
  for (int i = 0; i < 20; ++i) {
    std::string junk(1 + rng() % 2000, '\0');
    for (char& ch : junk)
      ch = static_cast<char>(rng());
    attacks.push_back({"random bytes " + std::to_string(i), junk});
  }
  attacks.push_back({"huge length before the handshake", le32(0xFFFFFFFFu)});
  attacks.push_back({"bad magic", le32(11) + std::string(1, '\x01') + le32(0) + le32(0xDEADBEEF) +
                                      std::string("\x01\x00", 2)});
  attacks.push_back({"wrong version", hello_frame(0, 99)});
  attacks.push_back({"version 2 (the server proved first)", hello_frame(0, 2)});
  attacks.push_back({"version 1 (no nonce)", le32(11) + std::string(1, '\x01') + le32(0) +
                                                 le32(0x54535747) + std::string("\x01\x00", 2)});
  attacks.push_back({"unknown flags", hello_frame(0x80)});
  attacks.push_back({"a secret this store does not have", hello_frame(1)});
  attacks.push_back({"huge length after the handshake", hello_frame() + le32(0xFFFFFFF0u)});
  attacks.push_back({"zero length", hello_frame() + le32(0)});
  attacks.push_back({"unknown opcode", hello_frame() + le32(5) + std::string(1, '\x7f') + le32(9)});
  // SET whose key length claims more bytes than the frame holds.
  attacks.push_back(
      {"key runs past the frame",
       hello_frame() + le32(5 + 4 + 3) + std::string(1, '\x02') + le32(1) + le32(1000000) + "abc"});
  // SET with a value over the server's 1 KiB limit (the frame itself is within bounds).
  attacks.push_back({"oversized value", hello_frame() + le32(5 + 4 + 1 + 4 + 2000) +
                                            std::string(1, '\x02') + le32(1) + le32(1) + "k" +
                                            le32(2000) + std::string(2000, 'v')});
  attacks.push_back({"trailing bytes", hello_frame() + le32(5 + 4 + 1 + 4 + 1 + 3) +
                                           std::string(1, '\x02') + le32(1) + le32(1) + "k" +
                                           le32(1) + "v" + "xyz"});
  attacks.push_back({"second handshake", hello_frame() + hello_frame()});
  attacks.push_back({"wait count beyond the frame", hello_frame() + le32(5 + 4 + 8) +
                                                        std::string(1, '\x06') + le32(1) +
                                                        le32(0x7FFFFFFF) + std::string(8, '\0')});

  for (const Attack& attack : attacks) {
    RawSocket raw(port);
    raw.send(attack.bytes);
    // Random bytes may happen to form an incomplete frame: then the server is waiting
    // for the rest, which is fine; every other attack must get the client dropped.
    const bool random = attack.name.rfind("random", 0) == 0;
    if (!random) {
      EXPECT_TRUE(raw.closed_by_server(2s)) << attack.name;
    }
    EXPECT_EQ(good.get_string("before"), "1") << "after " << attack.name;
  }

  // A truncated frame: the client goes away mid-frame; and one that stalls mid-frame
  // while another client is served.
  {
    RawSocket raw(port);
    raw.send(hello_frame() + le32(100) + std::string(10, 'x'));
  }
  RawSocket stalled(port);
  stalled.send(hello_frame() + le32(100) + std::string(10, 'x'));

  good.set("after", std::string_view("2"));
  EXPECT_EQ(good.get_string("after"), "2");
  EXPECT_EQ(good.add("count", 3), 3);
  TCPStore another(client_options(port));
  EXPECT_EQ(another.get_string("after"), "2");

  // Every dropped client was counted; the log has the first in full and then, once the
  // server stops (or every 10 s), one line for the rest.
  const uint64_t refused = server.num_refused();
  EXPECT_GE(refused, attacks.size() - 20);
  server_holder.reset();
  int full = 0;
  std::string summary;
  for (const std::string& line : log.lines()) {
    if (line.find("dropping client") != std::string::npos) ++full;
    if (line.find("more connections in the last 10 s") != std::string::npos) summary = line;
  }
  EXPECT_EQ(full, 1);
  EXPECT_THAT(summary, HasSubstr("dropped " + std::to_string(refused - 1) + " more connections"));
  EXPECT_THAT(summary, HasSubstr("(the last: client "));
}

// ---- authentication

TCPStoreOptions client_with_secret(uint16_t port, std::string secret) {
  TCPStoreOptions options = client_options(port);
  options.secret = std::move(secret);
  return options;
}

// The NetworkError a client gets from a server that refuses it, and how long it took.
std::string refusal(const TCPStoreOptions& options, std::chrono::milliseconds* took = nullptr) {
  const auto t0 = Clock::now();
  std::string text;
  try {
    TCPStore client(options);
  } catch (const NetworkError& e) {
    text = e.what();
  }
  if (took != nullptr) {
    *took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }
  return text;
}

TEST(TCPStoreAuth, ClientsWithTheSecretAreServedOthersAreRefusedOnBothSides) {
  test::LogCapture log;
  auto server = std::make_unique<TCPStoreServer>(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = "store secret number one"});
  EXPECT_TRUE(server->authenticated());
  const uint16_t port = server->port();
  TCPStore good(client_with_secret(port, "store secret number one"));
  good.set("k", std::string_view("v"));
  TCPStore other(client_with_secret(port, "store secret number one"));
  EXPECT_EQ(other.get_string("k"), "v");

  std::chrono::milliseconds took{};
  const std::string wrong = refusal(client_with_secret(port, "a guess of sixteen bytes"), &took);
  EXPECT_THAT(wrong, HasSubstr("authentication failed"));
  EXPECT_THAT(wrong, HasSubstr("does not know this job's secret"));
  EXPECT_THAT(wrong, ::testing::Not(HasSubstr("store secret number one")));
  EXPECT_THAT(wrong, ::testing::Not(HasSubstr("a guess of sixteen bytes")));
  EXPECT_LT(took, 5s) << "a refusal is final: it must not be retried until connect_timeout";
  const std::string none = refusal(client_options(port));
  EXPECT_THAT(none, HasSubstr("authentication failed"));
  EXPECT_THAT(none, HasSubstr("requires a shared secret and the client has none"));
  EXPECT_EQ(server->num_refused(), 2u);
  EXPECT_EQ(good.get_string("k"), "v");
  server.reset();
  // The server's side says so too, without the secret.
  bool logged = false;
  for (const std::string& line : log.lines()) {
    EXPECT_THAT(line, ::testing::Not(HasSubstr("store secret number one")));
    if (line.find("authentication failed") != std::string::npos) logged = true;
  }
  EXPECT_TRUE(logged);
}

TEST(TCPStoreAuth, AClientWithASecretRefusesAServerWithout) {
  TCPStoreServer plain(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  EXPECT_FALSE(plain.authenticated());
  const std::string text = refusal(client_with_secret(plain.port(), "mine, sixteen bytes long"));
  EXPECT_THAT(text, HasSubstr("authentication failed"));
  EXPECT_THAT(text, HasSubstr("has a secret"));
  // Without secrets on either side, nothing changes.
  TCPStore client(client_options(plain.port()));
  client.set("x", std::string_view("1"));
  EXPECT_EQ(client.get_string("x"), "1");
}

TEST(TCPStoreAuth, NoRequestIsParsedBeforeTheClientsProof) {
  TCPStoreServer server(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = "secret s3 of the store"});
  const uint16_t port = server.port();
  const std::string set_x =
      le32(5 + 4 + 1 + 4 + 1) + std::string(1, '\x02') + le32(7) + le32(1) + "x" + le32(1) + "1";
  struct Attack {
    std::string name;
    std::string bytes;
  };
  const std::vector<Attack> attacks = {
      {"a request instead of the proof", hello_frame(1) + set_x},
      {"a wrong proof",
       hello_frame(1) + le32(5 + 32) + std::string(1, '\x0e') + le32(0) + std::string(32, 'p')},
      {"a short proof",
       hello_frame(1) + le32(5 + 8) + std::string(1, '\x0e') + le32(0) + std::string(8, 'p')},
      {"a huge frame before the proof", hello_frame(1) + le32(1u << 30)},
  };
  for (const Attack& attack : attacks) {
    RawSocket raw(port);
    raw.send(attack.bytes);
    EXPECT_TRUE(raw.closed_by_server(2s)) << attack.name;
  }
  EXPECT_EQ(server.num_refused(), attacks.size());
  TCPStore good(client_with_secret(port, "secret s3 of the store"));
  EXPECT_FALSE(good.check({"x"})) << "a request sent before authentication was applied";
  // The master's own client and server share the secret given once.
  TCPStoreOptions master = client_with_secret(0, "secret s4 of the store");
  master.is_master = true;
  TCPStore hosted(master);
  hosted.set("m", std::string_view("1"));
  EXPECT_EQ(TCPStore(client_with_secret(hosted.port(), "secret s4 of the store")).get_string("m"),
            "1");
}

// A client that stops half-way through the handshake (before HELLO is whole, or after it
// without the proof the store's secret requires) is dropped at the deadline; everyone else
// is served meanwhile.
TEST(TCPStoreAuth, AClientStalledInTheHandshakeIsDroppedAtTheDeadline) {
  TCPStoreServer server(TCPStoreServerOptions{
      .bind_host = "127.0.0.1", .handshake_timeout = 200ms, .secret = "secret s5 of the store"});
  const uint16_t port = server.port();
  RawSocket half_hello(port);
  half_hello.send(hello_frame(1).substr(0, 20));
  RawSocket no_proof(port);
  no_proof.send(hello_frame(1));
  const auto t0 = Clock::now();
  TCPStore good(client_with_secret(port, "secret s5 of the store"));
  good.set("k", std::string_view("v"));
  EXPECT_EQ(good.get_string("k"), "v");
  EXPECT_TRUE(half_hello.closed_by_server(5s));
  EXPECT_TRUE(no_proof.closed_by_server(5s));
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_EQ(server.num_refused(), 2u);
  // The authenticated client is past its handshake: an idle one stays connected.
  EXPECT_EQ(good.get_string("k"), "v");
  EXPECT_THROW(TCPStoreServer(TCPStoreServerOptions{.handshake_timeout = 0ms}), InvalidArgument);
}

// Junk connections cannot flood the log, and a log nobody drains cannot stop the store.
TEST(TCPStoreTest, AStuckLogNeverStopsTheServer) {
  test::CountdownLatch release(1);
  std::atomic<int> lines{0};
  const LogSink previous = set_log_sink([&](LogLevel, std::string_view) {
    ++lines;
    release.wait(30s);  // a pipe nobody reads
  });
  {
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
    const uint16_t port = server.port();
    for (int i = 0; i < 300; ++i) {
      RawSocket raw(port);
      raw.send(le32(0xFFFFFFFFu));
      ASSERT_TRUE(raw.closed_by_server(5s)) << "junk connection " << i;
    }
    TCPStore good(client_options(port));
    good.set("still", std::string_view("serving"));
    EXPECT_EQ(good.get_string("still"), "serving");
    EXPECT_EQ(server.num_refused(), 300u);
    release.count_down();
  }
  set_log_sink(previous);
  // 300 refusals, one line in full (the summary follows at the end of the period).
  EXPECT_LE(lines.load(), 2);
}

// ---- the journal

std::filesystem::path fresh_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-journal-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Bytes bytes_of(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

// Every kind of change, acknowledged by a round trip (set and multi_set are one-way).
void change_everything(TCPStore& store) {
  store.set("plain", std::string_view("1"));
  store.add("counter", 5);
  store.add("counter", 2);
  store.compare_set("cas", {}, bytes_of("first"));
  store.append("log", std::string_view("a"));
  store.append("log", std::string_view("b"));
  store.multi_set({"m1", "m2"}, {bytes_of("x"), bytes_of("y")});
  store.set("gone", std::string_view("soon"));
  EXPECT_TRUE(store.delete_key("gone"));
  EXPECT_EQ(store.num_keys(), 6);
}

void expect_everything(TCPStore& store) {
  EXPECT_EQ(store.get_string("plain"), "1");
  EXPECT_EQ(store.add("counter", 1), 8);
  EXPECT_EQ(store.get_string("cas"), "first");
  EXPECT_EQ(store.get_string("log"), "ab");
  EXPECT_EQ(store.get_string("m1"), "x");
  EXPECT_EQ(store.get_string("m2"), "y");
  EXPECT_FALSE(store.check({"gone"}));
  EXPECT_EQ(store.num_keys(), 6);
}

TEST(TCPStoreJournal, AKilledServerRestartedWithItsJournalHasEveryKeyBack) {
  const auto dir = fresh_dir("kill");
  const std::string journal = (dir / "store.journal").string();
  uint16_t port = 0;
  pid_t server = fork_server(port, {.bind_host = "127.0.0.1", .journal = journal});
  ASSERT_NE(port, 0);
  TCPStoreOptions options = client_options(port);
  options.connect_timeout = 20s;  // the client waits for the restarted server
  TCPStore client(options);
  change_everything(client);
  ::kill(server, SIGKILL);
  int status = 0;
  ::waitpid(server, &status, 0);
  uint16_t again = 0;
  server = fork_server(again, {.bind_host = "127.0.0.1", .port = port, .journal = journal});
  ASSERT_EQ(again, port);
  // The same client object reconnects on its next call and finds every change.
  expect_everything(client);
  // What the restarted server changes is journaled too.
  client.set("later", std::string_view("2"));
  EXPECT_TRUE(client.check({"later"}));
  ::kill(server, SIGKILL);
  ::waitpid(server, &status, 0);
  TCPStoreServer third(TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal});
  TCPStore reader(client_options(third.port()));
  EXPECT_EQ(reader.get_string("later"), "2");
  EXPECT_EQ(reader.add("counter", 0), 8);
  std::filesystem::remove_all(dir);
}

TEST(TCPStoreJournal, ATornLastRecordIsDroppedAndCorruptionIsRefused) {
  const auto dir = fresh_dir("torn");
  const std::string journal = (dir / "store.journal").string();
  {
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal});
    TCPStore client(client_options(server.port()));
    change_everything(client);
  }
  const auto size = std::filesystem::file_size(journal);
  // A write the dying process did not finish: the start of one more record.
  {
    std::ofstream out(journal, std::ios::binary | std::ios::app);
    out << std::string("\x40\x00\x00\x00\x01\x03\x00", 7);
  }
  {
    test::LogCapture log;
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal});
    TCPStore client(client_options(server.port()));
    expect_everything(client);
    bool warned = false;
    for (const std::string& line : log.lines())
      warned = warned || line.find("dropped an incomplete last record") != std::string::npos;
    EXPECT_TRUE(warned);
  }
  // A complete record whose bytes changed: refused, naming the file and the offset.
  {
    std::fstream f(journal, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(8 + 4 + 6));
    f.put('#');
  }
  std::string error;
  try {
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal});
  } catch (const StoreError& e) {
    error = e.what();
  }
  EXPECT_THAT(error, HasSubstr(journal));
  EXPECT_THAT(error, HasSubstr("is corrupt at offset 8"));
  // Not a journal at all.
  std::ofstream(journal, std::ios::binary | std::ios::trunc) << "hello";
  error.clear();
  try {
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .journal = journal});
  } catch (const StoreError& e) {
    error = e.what();
  }
  EXPECT_THAT(error, HasSubstr("is not a gradwire store journal"));
  EXPECT_GT(size, 8u);
  std::filesystem::remove_all(dir);
}

TEST(TCPStoreTest, LimitsAreEnforcedOnTheClientWithTheServersValues) {
  TCPStoreServer server(
      TCPStoreServerOptions{.bind_host = "127.0.0.1", .max_key_bytes = 16, .max_value_bytes = 64});
  TCPStore store(client_options(server.port()));
  EXPECT_THROW(store.set(std::string(17, 'k'), std::string_view("v")), InvalidArgument);
  try {
    store.set("k", std::string(65, 'v'));
    ADD_FAILURE() << "oversized value accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("64"));
  }
  store.set("k", std::string(64, 'v'));
  // append beyond the limit is refused by the server, which knows the current size.
  EXPECT_THROW(store.append("k", std::string_view("v")), InvalidArgument);
  EXPECT_EQ(store.get("k").size(), 64u);
}

TEST(TCPStoreTest, DeletedKeyIsAwaitedAgainByMultiGet) {
  TCPStore store(TCPStoreOptions{.is_master = true, .timeout = 10s});
  TCPStore other(client_options(store.port()));
  std::vector<Bytes> values;
  std::thread getter([&] { values = store.multi_get({"a", "b"}, 10s); });
  // Whenever the multi_get reaches the server, it must answer with the final values:
  // parked before "a" was deleted, it sees "a" missing again and keeps waiting for it.
  other.set("a", std::string_view("1"));
  EXPECT_TRUE(other.delete_key("a"));
  other.set("b", std::string_view("2"));
  other.set("a", std::string_view("3"));
  getter.join();
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(to_string(values[0]), "3");
  EXPECT_EQ(to_string(values[1]), "2");
}

}  // namespace
}  // namespace gradwire::c10d

// A peer speaks only for itself: attacks on the rpc transports' handshake and on the
// identity a connection claims, each against live agents (or a live listener), each
// followed by a legitimate call that must still succeed, and none allowed to make a
// worker report another as lost.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/listener.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/printable.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/log_capture.h"
#include "support/sync.h"
#include "transport/handshake.h"
#include "transport/stream_transport.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using rref::RRef;
using transport::Handshake;
using transport::PeerIdentity;
namespace tp = tensorpipe;

constexpr char kSecret[] = "the identity tests' job secret";

// Every loss an agent reports.
class LossRecorder : public AgentListener {
 public:
  void on_worker_lost(const WorkerInfo& worker, const std::string& why) override {
    MutexLock lock(mutex_);
    losses_.push_back(worker.describe() + ": " + why);
  }
  std::vector<std::string> losses() {
    MutexLock lock(mutex_);
    return losses_;
  }

 private:
  Mutex mutex_;
  std::vector<std::string> losses_ GRADWIRE_GUARDED_BY(mutex_);
};

struct Group {
  std::shared_ptr<c10d::HashStore> store = std::make_shared<c10d::HashStore>(20s);
  test::Agents agents;
  std::vector<std::shared_ptr<LossRecorder>> recorders;

  ~Group() {
    if (!agents.empty()) test::shutdown_agents(agents);
  }

  // Every worker calls every other one and gets its answer.
  void expect_serving() { test::expect_every_pair_answers(agents); }

  // No worker has reported any worker lost.
  void expect_no_loss() {
    for (size_t r = 0; r < recorders.size(); ++r) {
      const std::vector<std::string> losses = recorders[r]->losses();
      EXPECT_TRUE(losses.empty()) << "w" << r << " reported: " << losses.front();
    }
  }

  uint64_t refused(int rank) const {
    return agents[static_cast<size_t>(rank)]->metrics().connections_refused;
  }
  uint64_t accepted(int rank) const {
    return agents[static_cast<size_t>(rank)]->metrics().connections_accepted;
  }
};

Registry& test_registry() {
  static Registry* reg = [] {
    auto* r = new Registry();
    r->def("concat", [](const std::string& a, const std::string& b) { return a + b; });
    r->def("make", [](int64_t n) { return ones({n}); });
    return r;
  }();
  return *reg;
}

AgentOptions identity_options(const std::string& secret,
                              std::chrono::milliseconds handshake_timeout = 10s) {
  AgentOptions o = test::agent_options(test_registry());
  o.direct_copy_threads = 0;
  o.secret = secret;
  o.handshake_timeout = handshake_timeout;
  return o;
}

std::unique_ptr<Group> start_group(int n, const AgentOptions& options) {
  auto g = std::make_unique<Group>();
  g->agents = test::start_agents(n, options, g->store);
  for (auto& agent : g->agents) {
    g->recorders.push_back(std::make_shared<LossRecorder>());
    agent->add_listener(g->recorders.back());
  }
  return g;
}

using test::published_address;
using test::raw_connect;
using test::send_all;

// What the peer sends until it closes the connection; `closed` says whether it did within
// `timeout`.
std::string read_until_closed(int fd, bool* closed, std::chrono::milliseconds timeout = 10s) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  *closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return got;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return got;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(n));
  }
}

// Runs a client handshake claiming `who` over a raw socket; whether it completed.
bool raw_handshake(int fd, const std::string& secret, PeerIdentity who) {
  Handshake hs(Handshake::Role::kClient, secret, std::move(who));
  while (hs.state() == Handshake::State::kRunning) {
    send_all(fd, hs.take_output());
    uint8_t byte = 0;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) != 1 || ::recv(fd, &byte, 1, 0) != 1) return false;
    hs.feed(&byte, 1);
  }
  send_all(fd, hs.take_output());
  return hs.state() == Handshake::State::kDone;
}

std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

// TensorPipe's hello packet naming `name`, as the first frame of a connection.
std::string tensorpipe_hello(const std::string& name) {
  tp::NopHolder<tp::Packet> hello;
  hello.getObject() = tp::SpontaneousConnection{name};
  std::string bytes(hello.getSize(), '\0');
  tp::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  EXPECT_FALSE(hello.write(writer).has_error());
  return frame(bytes);
}

// A raw connection to worker `rank` of `g` that claims `who` in its handshake and `hello`
// in TensorPipe's hello: true when the worker refused it (closed it within 10 s, having
// counted a refusal).
bool refused_claim(Group& g, int rank, const std::string& secret, const PeerIdentity& who,
                   const std::string& hello) {
  const uint64_t before = g.refused(rank);
  const int fd = raw_connect(published_address(*g.store, rank));
  if (raw_handshake(fd, secret, who)) send_all(fd, tensorpipe_hello(hello));
  // The worker counts a refusal before it closes the connection.
  bool closed = false;
  read_until_closed(fd, &closed);
  ::close(fd);
  return closed && g.refused(rank) > before;
}

// Polls the captured log (lines go through a background thread) until a line contains
// `needle`, for at most 10 s; that line, or "".
std::string wait_for_line(test::LogCapture& log, const std::string& needle) {
  std::string found;
  eventually([&] {
    for (const std::string& line : log.lines()) {
      if (line.find(needle) != std::string::npos) {
        found = line;
        return true;
      }
    }
    return false;
  });
  return found;
}

// A value w2 owns that w1 references: w1 would drop it, were w2 lost to it.
RRef<Tensor> held_by_w1_from_w2(Group& g) {
  return rref::remote<Tensor>(*g.agents[1], "w2", "make", int64_t{5});
}

void expect_still_held(RRef<Tensor>& r) {
  EXPECT_EQ(sum(r.to_here()).item<float>(), 5);
}

TEST(RpcIdentity, WithoutASecretAClaimTheStoreDoesNotBackIsRefusedAndNobodyIsLost) {
  auto g = start_group(3, identity_options(""));
  g->expect_serving();
  RRef<Tensor> held = held_by_w1_from_w2(*g);
  expect_still_held(held);
  const uint64_t accepted = g->accepted(1);
  // w2's name under another rank and under none, incarnations the store does not hold
  // (newer, which makes w1 re-read the record, and older), and a rank under a name outside
  // the group.
  const std::vector<PeerIdentity> claims = {{"w2", 0, 0},  {"w2", -1, 0}, {"w2", 2, 3},
                                            {"w2", 2, -1}, {"w9", 9, 0},  {"w9", 2, 0}};
  for (const PeerIdentity& claim : claims) {
    EXPECT_TRUE(refused_claim(*g, 1, "", claim, claim.name))
        << claim.name << " rank " << claim.rank << " incarnation " << claim.incarnation;
    g->expect_serving();
  }
  // A handshake that claims nobody, followed by a hello that names w2.
  EXPECT_TRUE(refused_claim(*g, 1, "", {"", -1, 0}, "w2"));
  g->expect_serving();
  // None of them reached TensorPipe (the calls above opened no new connection to w1).
  EXPECT_EQ(g->accepted(1), accepted);
  g->expect_no_loss();
  expect_still_held(held);
}

TEST(RpcIdentity, AFloodOfClaimsOfANewerIncarnationIsRefusedWithoutStoppingTheWorker) {
  auto g = start_group(3, identity_options(""));
  g->expect_serving();
  const uint64_t before = g->refused(1);
  // Each makes w1 check w2's record in the store; claims that arrive together share a read.
  constexpr int kClaims = 32;
  const auto w1 = published_address(*g->store, 1);
  std::vector<int> fds;
  for (int i = 0; i < kClaims; ++i) {
    fds.push_back(raw_connect(w1));
    ASSERT_TRUE(raw_handshake(fds.back(), "", {"w2", 2, 1 + i}));
  }
  for (int fd : fds)
    send_all(fd, tensorpipe_hello("w2"));
  for (int fd : fds) {
    bool closed = false;
    read_until_closed(fd, &closed);
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  EXPECT_EQ(g->refused(1), before + kClaims);
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, AnOutsiderIsServedAsNobodyAndItsLossIsNobodys) {
  auto g = start_group(2, identity_options(""));
  g->expect_serving();
  const uint64_t accepted = g->accepted(1);
  // Without a secret anyone may connect; a connection that claims no worker's name (and no
  // rank) reaches TensorPipe as an outsider.
  const int fd = raw_connect(published_address(*g->store, 1));
  ASSERT_TRUE(raw_handshake(fd, "", {"", -1, 0}));
  send_all(fd, tensorpipe_hello("visitor"));
  eventually([&] { return g->accepted(1) != accepted; });
  EXPECT_EQ(g->accepted(1), accepted + 1);
  // It goes away: no worker of the group is lost by it.
  ::close(fd);
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, WithASecretNeitherAStrangerNorAMemberCanSpeakForAnotherWorker) {
  auto g = start_group(3, identity_options(kSecret));
  g->expect_serving();
  RRef<Tensor> held = held_by_w1_from_w2(*g);
  expect_still_held(held);
  // A stranger claiming w2: refused at its proof.
  EXPECT_TRUE(refused_claim(*g, 1, "a guess at the job's secret", {"w2", 2, 0}, "w2"));
  g->expect_serving();
  // A holder of the secret that claims w0 in its handshake and w2 in TensorPipe's hello.
  EXPECT_TRUE(refused_claim(*g, 1, kSecret, {"w0", 0, 0}, "w2"));
  g->expect_serving();
  // One that claims w2 in an incarnation the store does not hold.
  EXPECT_TRUE(refused_claim(*g, 1, kSecret, {"w2", 2, 4}, "w2"));
  g->expect_serving();
  // A whole TensorPipe stack named "w2" that does not know the secret.
  {
    auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("w2"));
    transport::StreamOptions o;
    o.secret = "a guess at the job's secret";
    o.name = "w2";
    o.identity = [] { return PeerIdentity{"w2", 2, 0}; };
    context->registerTransport(0, "tcp", transport::create_stream_context(o));
    context->registerChannel(0, "basic", tp::channel::basic::create());
    const auto w1 = published_address(*g->store, 1);
    auto pipe = context->connect("tcp://" + w1.first + ":" + std::to_string(w1.second));
    test::CountdownLatch done(1);
    std::string error;
    tp::Message message;
    message.metadata = "a forged message";
    pipe->write(std::move(message), [&](const tp::Error& e) {
      if (e) error = e.what();
      done.count_down();
    });
    ASSERT_TRUE(done.wait(10s));
    EXPECT_NE(error.find("authentication failed"), std::string::npos) << error;
    context->close();
    context->join();
  }
  g->expect_serving();
  g->expect_no_loss();
  expect_still_held(held);
}

// The trust model among holders of the one job secret, stated as a test: the secret proves
// membership of the job, not which worker a connection is. A holder that repeats a claim
// the store backs is admitted as that worker (docs/security.md, "Who can do what").
TEST(RpcIdentity, ASecretHolderThatRepeatsAWorkersClaimIsAdmittedAsThatWorker) {
  auto g = start_group(3, identity_options(kSecret));
  g->expect_serving();
  const uint64_t accepted = g->accepted(1);
  const int fd = raw_connect(published_address(*g->store, 1));
  ASSERT_TRUE(raw_handshake(fd, kSecret, {"w2", 2, 0}));
  send_all(fd, tensorpipe_hello("w2"));
  eventually([&] { return g->accepted(1) != accepted; });
  EXPECT_EQ(g->accepted(1), accepted + 1);
  g->expect_serving();
  // Its connection ending is w2's, as far as w1 can tell.
  ::close(fd);
  eventually([&] { return !g->recorders[1]->losses().empty(); });
  const std::vector<std::string> losses = g->recorders[1]->losses();
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].rfind("'w2'", 0), 0u) << losses[0];
}

TEST(RpcIdentity, AClientThatSaysNothingNeverGetsAServerMac) {
  auto g = start_group(2, identity_options(kSecret, 300ms));
  const auto w1 = published_address(*g->store, 1);
  const uint64_t before = g->refused(1);
  // Silent: nothing at all comes back, and the connection goes at the deadline.
  {
    const int fd = raw_connect(w1);
    bool closed = false;
    EXPECT_EQ(read_until_closed(fd, &closed), "");
    EXPECT_TRUE(closed);
    ::close(fd);
  }
  // A hello and then silence: the server's hello (its nonce), nothing computed from the
  // secret.
  {
    const int fd = raw_connect(w1);
    Handshake hs(Handshake::Role::kClient, kSecret, {"w0", 0, 0});
    send_all(fd, hs.take_output());
    bool closed = false;
    const std::string got = read_until_closed(fd, &closed);
    EXPECT_TRUE(closed);
    ASSERT_EQ(got.size(), transport::kHelloBytes);
    EXPECT_EQ(got.substr(0, 4), "GWTP");
    ::close(fd);
  }
  EXPECT_GE(g->refused(1), before + 2);
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, AWrongSecretIsRefusedBeforeTheServerProvesAnything) {
  auto g = start_group(2, identity_options(kSecret));
  const auto w1 = published_address(*g->store, 1);
  const uint64_t before = g->refused(1);
  const int fd = raw_connect(w1);
  Handshake hs(Handshake::Role::kClient, "not the job's secret at all", {"w0", 0, 0});
  send_all(fd, hs.take_output());
  // The server's hello, fed whole: the client then sends its (wrong) proof.
  std::string hello;
  while (hello.size() < transport::kHelloBytes) {
    char buf[transport::kHelloBytes];
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10'000), 1);
    const ssize_t n = ::recv(fd, buf, transport::kHelloBytes - hello.size(), 0);
    ASSERT_GT(n, 0);
    hello.append(buf, static_cast<size_t>(n));
  }
  hs.feed(reinterpret_cast<const uint8_t*>(hello.data()), hello.size());
  const std::string proof = hs.take_output();
  ASSERT_EQ(proof.size(), transport::kMacBytes);
  send_all(fd, proof);
  bool closed = false;
  // One byte, the refusal, and the end: no proof of the server's to guess secrets against.
  EXPECT_EQ(read_until_closed(fd, &closed), std::string(1, '\0'));
  EXPECT_TRUE(closed);
  ::close(fd);
  EXPECT_EQ(g->refused(1), before + 1);
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, TheOldHandshakeVersionIsRefusedWithAClearError) {
  test::LogCapture log;
  auto g = start_group(2, identity_options(""));
  const auto w1 = published_address(*g->store, 1);
  // Version 1's hello: magic, version, flags, two zero bytes, a nonce.
  const std::string old_hello = std::string("GWTP\x01\x00\x00\x00", 8) + std::string(32, 'n');
  const int fd = raw_connect(w1);
  send_all(fd, old_hello);
  bool closed = false;
  const std::string got = read_until_closed(fd, &closed);
  EXPECT_TRUE(closed);
  // The server says its version, so that an old client can say what differs.
  ASSERT_EQ(got.size(), transport::kHelloBytes);
  EXPECT_EQ(got[4], static_cast<char>(transport::kHandshakeVersion));
  ::close(fd);
  const std::string line = wait_for_line(log, "transport protocol version 1");
  EXPECT_NE(line.find("this worker version 2"), std::string::npos) << line;
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, ATensorPipeHelloNamingAnotherWorkerThanTheHandshakeIsRefused) {
  test::LogCapture log;
  auto g = start_group(3, identity_options(""));
  g->expect_serving();
  // The handshake's claim is w0's, true to the store; the hello speaks for w2.
  EXPECT_TRUE(refused_claim(*g, 1, "", {"w0", 0, 0}, "w2"));
  const std::string line = wait_for_line(log, "refused a connection");
  EXPECT_NE(line.find("names worker 'w2', but its handshake claimed 'w0'"), std::string::npos)
      << line;
  g->expect_serving();
  g->expect_no_loss();
}

TEST(RpcIdentity, APeerSuppliedNameIsEscapedAndTruncatedInTheLog) {
  // 64 KiB less the frame's own bytes, of every control byte in turn.
  std::string name(65'000, '\0');
  for (size_t i = 0; i < name.size(); ++i)
    name[i] = static_cast<char>(1 + i % 31);
  // (A captured line may end with its newline.)
  auto no_raw_control_bytes = [](std::string line) {
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return std::none_of(line.begin(), line.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  };
  {
    test::LogCapture log;
    auto g = start_group(2, identity_options(""));
    EXPECT_TRUE(refused_claim(*g, 1, "", {"w0", 0, 0}, name));
    const std::string line = wait_for_line(log, "refused a connection");
    ASSERT_FALSE(line.empty());
    EXPECT_TRUE(no_raw_control_bytes(line)) << line;
    EXPECT_NE(line.find("\\x01\\x02\\x03"), std::string::npos) << line;
    EXPECT_NE(line.find("(+" + std::to_string(name.size() - kPrintableDefaultBytes) + " bytes)"),
              std::string::npos)
        << line;
    EXPECT_LT(line.size(), 2048u);
    g->expect_serving();
    g->expect_no_loss();
  }
  // The handshake's own claim, as long as it may be (255 bytes), is escaped too.
  {
    test::LogCapture log;
    auto g = start_group(2, identity_options(""));
    const std::string claimed = name.substr(0, transport::kMaxIdentityNameBytes);
    EXPECT_TRUE(refused_claim(*g, 1, "", {claimed, 0, 0}, claimed));
    const std::string line = wait_for_line(log, "refused a connection");
    ASSERT_FALSE(line.empty());
    EXPECT_TRUE(no_raw_control_bytes(line)) << line;
    EXPECT_NE(line.find("claiming worker '\\x01\\x02"), std::string::npos) << line;
    EXPECT_LT(line.size(), 2048u);
    g->expect_serving();
    g->expect_no_loss();
  }
}

// ---- the local transport's users (SO_PEERCRED)

// A local listener whose connections are accepted (and dropped) as they come.
struct LocalServer {
  std::shared_ptr<transport::TransportStats> stats = std::make_shared<transport::TransportStats>();
  std::shared_ptr<transport::StreamContext> context;
  std::shared_ptr<tp::transport::Listener> listener;
  std::string name = transport::unique_local_name();

  explicit LocalServer(bool allow_other_uids) {
    transport::StreamOptions o;
    o.family = transport::StreamOptions::Family::kLocal;
    o.stats = stats;
    o.name = "server";
    o.handshake_timeout = 2s;
    o.allow_other_uids = allow_other_uids;
    context = transport::create_stream_context(o);
    listener = context->listen(name);
    EXPECT_EQ(context->listen_error(), "");
  }
  ~LocalServer() {
    listener->close();
    context->close();
    context->join();
  }
};

// In a child process that runs as `uid`: connects to the local listener `name` and sends a
// client hello. Exit status: 0 when the server's hello came back, 1 when the connection was
// closed without a byte, 2 for anything else. Only system calls after fork().
int hello_as_user(const std::string& name, uid_t uid) {
  Handshake hs(Handshake::Role::kClient, "", {"w0", 0, 0});
  const std::string hello = hs.take_output();
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&un), len) != 0) ::_exit(4);
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) < 0) ::_exit(1);
    char buf[transport::kHelloBytes];
    size_t got = 0;
    while (got < sizeof(buf)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10'000) != 1) ::_exit(2);
      const ssize_t n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
      if (n <= 0) ::_exit(got == 0 ? 1 : 2);
      got += static_cast<size_t>(n);
    }
    ::_exit(std::memcmp(buf, "GWTP", 4) == 0 ? 0 : 2);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(RpcIdentity, ALocalPeerOfAnotherUserIsRefusedUnlessOtherUsersAreAllowed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a peer as another user";
  constexpr uid_t kNobody = 65534;
  {
    LocalServer server(/*allow_other_uids=*/false);
    EXPECT_EQ(hello_as_user(server.name, kNobody), 1);
    // Counted by the listener's thread just after it closed the connection: the child may
    // see the close first.
    eventually([&] { return server.stats->refused.load() != 0; });
    EXPECT_EQ(server.stats->refused.load(), 1u);
    // This process's own user is still served.
    EXPECT_EQ(hello_as_user(server.name, ::geteuid()), 0);
  }
  {
    LocalServer server(/*allow_other_uids=*/true);
    EXPECT_EQ(hello_as_user(server.name, kNobody), 0);
  }
}

TEST(RpcIdentity, AgentsOnTheLocalTransportStillServeWithTheUserCheck) {
  AgentOptions options = identity_options(kSecret);
  options.transports = {"local", "tcp"};
  auto g = start_group(2, options);
  g->expect_serving();
  options.local_allow_other_uids = true;
  auto allowed = start_group(2, options);
  allowed->expect_serving();
  g->expect_no_loss();
  allowed->expect_no_loss();
}

}  // namespace
}  // namespace gradwire::rpc

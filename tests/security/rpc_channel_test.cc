// No peer chooses how a worker touches memory, nor joins another peer's pipe: attacks on
// TensorPipe's negotiation (brochures that pick a memory-reading channel, connection
// requests and mpt lanes taken by an outsider, control frames that decode to far more than
// they weigh), each from the attacker's side of the wire, each followed by legitimate calls
// that must still succeed.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <tensorpipe/channel/basic/factory.h>
#include <tensorpipe/channel/channel.h>
#include <tensorpipe/channel/cma/factory.h>
#include <tensorpipe/channel/context.h>
#include <tensorpipe/channel/mpt/nop_types.h>
#include <tensorpipe/channel/xth/factory.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/net.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/rss.h"
#include "support/sync.h"
#include "tensorpipe/verified_channels.h"
#include "transport/handshake.h"
#include "transport/nop_scan.h"
#include "transport/stream_core.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using transport::Handshake;
using transport::PeerIdentity;
namespace tp = tensorpipe;

// ---- the target: a group whose "swallow" function records what reaches it

// Set when "swallow" is handed bytes that spell kVictimText: memory of this process that
// no message carried.
std::atomic<bool> victim_bytes_served{false};
std::atomic<int> swallowed{0};
constexpr char kVictimText[] = "memory a peer must never make a worker copy out";
alignas(64) char victim_memory[64] = "memory a peer must never make a worker copy out";

Registry& channel_registry() {
  static Registry* reg = [] {
    auto* r = new Registry();
    r->def("concat", [](const std::string& a, const std::string& b) { return a + b; });
    r->def("swallow", [](const Tensor& t) {
      swallowed.fetch_add(1);
      const std::string bytes(static_cast<const char*>(t.data_ptr()), t.nbytes());
      if (bytes.find(kVictimText) != std::string::npos) victim_bytes_served = true;
      return static_cast<int64_t>(t.nbytes());
    });
    return r;
  }();
  return *reg;
}

struct Target {
  std::shared_ptr<c10d::HashStore> store = std::make_shared<c10d::HashStore>(20s);
  test::Agents agents;

  explicit Target(int n, int direct_copy_threads = 0) {
    AgentOptions o = test::agent_options(channel_registry());
    // Workers of one host, over the local transport: xth and cma are registered beside it.
    o.transports = {"local", "tcp"};
    o.direct_copy_threads = direct_copy_threads;
    agents = test::start_agents(n, o, store);
  }
  ~Target() { test::shutdown_agents(agents); }

  void expect_serving() {
    test::expect_every_pair_answers(agents);
    // A tensor large enough to travel beside the payload, through a channel.
    Tensor big = ones({1 << 16});
    EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "swallow", big), int64_t{4} << 16);
  }
  AgentMetrics metrics(int rank) const { return agents[static_cast<size_t>(rank)]->metrics(); }
  std::string url(int rank) const {
    const auto [host, port] = test::published_address(*store, rank);
    return "tcp://" + host + ":" + std::to_string(port);
  }
};

// ---- the attacker's TensorPipe stack

class ForgedError final : public tp::BaseError {
 public:
  std::string what() const override { return "the forging channel receives nothing"; }
};

// Writes, for every tensor sent, the control object `forge` makes on the channel's first
// connection: what the real channel's receiver reads to know where to copy from.
using Forge = std::function<void(tp::transport::Connection&, tp::channel::TSendCallback)>;

class ForgingChannel final : public tp::channel::Channel {
 public:
  ForgingChannel(std::vector<std::shared_ptr<tp::transport::Connection>> connections, Forge forge)
      : connections_(std::move(connections)), forge_(std::move(forge)) {}
  void send(tp::Buffer /*buffer*/, size_t /*length*/, tp::channel::TSendCallback cb) override {
    forge_(*connections_.at(0), std::move(cb));
  }
  void recv(tp::Buffer /*buffer*/, size_t /*length*/, tp::channel::TRecvCallback cb) override {
    cb(tp::Error(std::make_shared<ForgedError>(), "test", 0));
  }
  void setId(std::string /*id*/) override {}
  void close() override {
    for (auto& c : connections_)
      c->close();
  }

 private:
  std::vector<std::shared_ptr<tp::transport::Connection>> connections_;
  Forge forge_;
};

// A channel that claims `descriptor` for the CPU and accepts any peer's.
class ForgingContext final : public tp::channel::Context {
 public:
  ForgingContext(std::string descriptor, size_t connections, Forge forge)
      : descriptors_{{tp::Device{tp::kCpuDeviceType, 0}, std::move(descriptor)}},
        connections_(connections),
        forge_(std::move(forge)) {}
  bool isViable() const override { return true; }
  size_t numConnectionsNeeded() const override { return connections_; }
  const std::unordered_map<tp::Device, std::string>& deviceDescriptors() const override {
    return descriptors_;
  }
  bool canCommunicateWithRemote(const std::string&, const std::string&) const override {
    return true;
  }
  std::shared_ptr<tp::channel::Channel> createChannel(
      std::vector<std::shared_ptr<tp::transport::Connection>> connections,
      tp::channel::Endpoint) override {
    return std::make_shared<ForgingChannel>(std::move(connections), forge_);
  }
  void setId(std::string) override {}
  void close() override {}
  void join() override {}

 private:
  std::unordered_map<tp::Device, std::string> descriptors_;
  size_t connections_;
  Forge forge_;
};

// xth's and cma's per-tensor descriptors, laid out as those channels read them.
struct XthDescriptor {
  uint64_t ptr;
  NOP_STRUCTURE(XthDescriptor, ptr);
};
struct CmaDescriptor {
  uint32_t pid;
  uint64_t ptr;
  NOP_STRUCTURE(CmaDescriptor, pid, ptr);
};

template <typename T>
Forge forge_object(T object) {
  return [object](tp::transport::Connection& c, tp::channel::TSendCallback cb) {
    auto holder = std::make_shared<tp::NopHolder<T>>();
    holder->getObject() = object;
    c.write(*holder, [holder, cb = std::move(cb)](const tp::Error& e) { cb(e); });
  };
}

// An outsider (no secret, claiming no worker) with gradwire's tcp transport and one forged
// channel named `channel`, whose brochure offers nothing else.
struct Attacker {
  std::shared_ptr<tp::Context> context;

  Attacker(const std::string& channel, std::shared_ptr<tp::channel::Context> forged) {
    context = std::make_shared<tp::Context>(tp::ContextOptions().name("visitor"));
    transport::StreamOptions o;
    o.name = "";
    o.identity = [] { return PeerIdentity{"", -1, 0}; };
    context->registerTransport(0, "tcp", transport::create_stream_context(o));
    context->registerChannel(0, channel, std::move(forged));
  }
  ~Attacker() {
    context->close();
    context->join();
  }

  // Calls "swallow" on `url` with a tensor whose bytes go through the forged channel; the
  // pipe's write outcome ("" when written).
  std::string send_swallow(const std::string& url) {
    auto pipe = context->connect(url, tp::PipeOptions().remoteName("w1"));
    Tensor arg = zeros({1024}, DType::kUInt8);
    Request request;
    request.id = 1;
    request.function = "swallow";
    request.args.push_back(Value(arg));
    EncodedMessage m = encode(Envelope{std::move(request)}, nullptr, /*inline_tensor_bytes=*/0);
    EXPECT_EQ(m.tensors.size(), 1u);
    tp::Message message;
    message.metadata = m.payload;
    tp::Message::Tensor t;
    t.buffer = tp::CpuBuffer{m.tensors[0].data_ptr()};
    t.length = m.tensors[0].nbytes();
    t.targetDevice = tp::Device{tp::kCpuDeviceType, 0};
    message.tensors.push_back(t);
    test::CountdownLatch done(1);
    std::string error;
    pipe->write(std::move(message), [&](const tp::Error& e) {
      if (e) error = e.what();
      done.count_down();
    });
    EXPECT_TRUE(done.wait(10s));
    // The target has read the message (and refused or served it) once the pipe closes or a
    // reply comes; either way, reading the reply's descriptor ends the exchange.
    test::CountdownLatch replied(1);
    pipe->readDescriptor([&](const tp::Error&, tp::Descriptor) { replied.count_down(); });
    replied.wait(10s);
    pipe->close();
    return error;
  }
};

std::string xth_descriptor_as_tensorpipe_makes_it() {
  return tp::channel::xth::create()->deviceDescriptors().begin()->second;
}
std::string cma_descriptor_as_tensorpipe_makes_it() {
  return tp::channel::cma::create()->deviceDescriptors().begin()->second;
}

// The descriptors the target registers now (white box: what an attacker that learnt them
// would send).
std::string xth_descriptor_of_this_process() {
  auto refusals = std::make_shared<detail::ChannelRefusals>();
  return detail::same_process_channel(tp::channel::xth::create(), refusals)
      ->deviceDescriptors()
      .begin()
      ->second;
}
std::string cma_descriptor_of_this_worker() {
  auto refusals = std::make_shared<detail::ChannelRefusals>();
  std::string host = net::host_id();
  for (char& c : host) {
    if (std::isspace(static_cast<unsigned char>(c))) c = '_';
  }
  return detail::verified_process_channel(
             tp::channel::cma::create(),
             detail::namespace_suffix(host, net::network_namespace_id()), refusals)
      ->deviceDescriptors()
      .begin()
      ->second;
}

// An address in no mapping: a memcpy from it is a SIGSEGV on the copying thread.
constexpr uint64_t kUnmapped = 0x10;

TEST(RpcChannelForgery, AForgedXthBrochureLeavesTheTargetAliveAndServing) {
  Target g(2);
  g.expect_serving();
  const int before = swallowed.load();
  // The descriptor as TensorPipe computes it (boot id, namespace, pid: all published), and
  // the one the target registers now, as an attacker that learnt it would send it. The
  // tensor's "address" is unmapped: a target that copied from it would die.
  for (const std::string& descriptor :
       {xth_descriptor_as_tensorpipe_makes_it(), xth_descriptor_of_this_process()}) {
    Attacker attacker("xth", std::make_shared<ForgingContext>(
                                 descriptor, 2, forge_object(XthDescriptor{kUnmapped})));
    attacker.send_swallow(g.url(1));
    g.expect_serving();
  }
  // No forged tensor was served; the known descriptor was chosen and then refused.
  EXPECT_EQ(swallowed.load(), before + 2);
  EXPECT_GE(g.metrics(1).channels_refused, 1u);
}

TEST(RpcChannelForgery, AForgedCmaBrochureMakesNoWorkerCopyAnyProcessesMemory) {
  Target g(2);
  g.expect_serving();
  // The descriptor names this very process and the address of memory no message carried.
  const CmaDescriptor forged{static_cast<uint32_t>(::getpid()),
                             reinterpret_cast<uint64_t>(victim_memory)};
  for (const std::string& descriptor :
       {cma_descriptor_as_tensorpipe_makes_it(), cma_descriptor_of_this_worker()}) {
    Attacker attacker("cma", std::make_shared<ForgingContext>(descriptor, 2, forge_object(forged)));
    attacker.send_swallow(g.url(1));
    g.expect_serving();
  }
  EXPECT_FALSE(victim_bytes_served.load());
  EXPECT_GE(g.metrics(1).channels_refused, 1u);
  EXPECT_EQ(std::string(victim_memory), kVictimText);
}

TEST(RpcChannelForgery, AWorkersRecordPublishesNoPidAndItsLoansStillTravel) {
  Target g(2, /*direct_copy_threads=*/2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string record =
        c10d::to_string(g.store->get("rpc/1/worker/" + std::to_string(rank)));
    std::istringstream lines(record);
    std::string line;
    bool loans = false;
    while (std::getline(lines, line)) {
      if (line.rfind("loans ", 0) != 0) continue;
      loans = true;
      // The boot id, the probe's address and value, the table's address and size: no pid.
      std::istringstream words(line.substr(6));
      std::vector<std::string> fields;
      for (std::string w; words >> w;)
        fields.push_back(w);
      EXPECT_EQ(fields.size(), 5u) << line;
      for (const std::string& f : fields)
        EXPECT_NE(f, std::to_string(::getpid())) << line;
    }
    EXPECT_TRUE(loans) << record;
  }
  // A tensor large enough to be lent is read from the process the local connection names.
  Tensor big = ones({4 << 20});
  const uint64_t before = g.metrics(1).tensors_copied_in;
  EXPECT_EQ(g.agents[0]->rpc_sync<int64_t>("w1", "swallow", big), int64_t{16} << 20);
  EXPECT_EQ(g.metrics(1).tensors_copied_in, before + 1);
}

TEST(RpcChannelForgery, LocalTransportsWithoutTcpAreRefusedAtStart) {
  AgentOptions o = test::agent_options(channel_registry());
  o.transports = {"uv", "local"};
  try {
    test::Agents agents = test::start_agents(1, o);
    ADD_FAILURE() << "uv + local was taken";
    test::shutdown_agents(agents);
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("has \"local\" or \"unix\" without \"tcp\""),
              std::string::npos)
        << e.what();
  }
}

// ---- requested connections and mpt lanes

std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

template <typename T>
std::string nop_bytes(const T& object) {
  tp::NopHolder<T> holder;
  holder.getObject() = object;
  std::string bytes(holder.getSize(), '\0');
  tp::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  EXPECT_FALSE(holder.write(writer).has_error());
  return bytes;
}

bool raw_handshake(int fd, const std::string& secret, PeerIdentity who) {
  Handshake hs(Handshake::Role::kClient, secret, std::move(who));
  while (hs.state() == Handshake::State::kRunning) {
    test::send_all(fd, hs.take_output());
    uint8_t byte = 0;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) != 1 || ::recv(fd, &byte, 1, 0) != 1) return false;
    hs.feed(&byte, 1);
  }
  test::send_all(fd, hs.take_output());
  return hs.state() == Handshake::State::kDone;
}

// Reads one frame (u64 length, then its bytes) within 10 s; nullopt if the peer closed.
std::optional<std::string> read_frame(int fd) {
  auto read_exact = [fd](char* into, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10'000) != 1) return false;
      const ssize_t r = ::recv(fd, into + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  uint64_t n = 0;
  if (!read_exact(reinterpret_cast<char*>(&n), sizeof(n)) || n > (1u << 20)) return std::nullopt;
  std::string bytes(n, '\0');
  if (!read_exact(bytes.data(), n)) return std::nullopt;
  return bytes;
}

// Whether the peer closes `fd` within 10 s (reading and dropping what it sends).
bool closed_by_peer(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

// Opens a pipe to `to` as `who` by hand: the handshake, TensorPipe's hello and a brochure
// offering tcp and the basic channel; returns the socket and the target's BrochureAnswer.
std::pair<int, tp::BrochureAnswer> open_pipe_by_hand(const std::pair<std::string, int>& to,
                                                     const PeerIdentity& who) {
  const int fd = test::raw_connect(to);
  EXPECT_TRUE(raw_handshake(fd, "", who));
  tp::Packet hello;
  hello = tp::SpontaneousConnection{who.name.empty() ? "visitor" : who.name};
  test::send_all(fd, frame(nop_bytes(hello)));
  tp::Brochure brochure;
  brochure.transportDomainDescriptors["tcp"] = "gradwire-tcp";
  brochure.channelDeviceDescriptors["basic"] = tp::channel::basic::create()->deviceDescriptors();
  test::send_all(fd, frame(nop_bytes(brochure)));
  tp::BrochureAnswer answer;
  std::optional<std::string> bytes = read_frame(fd);
  EXPECT_TRUE(bytes.has_value());
  if (bytes) {
    tp::NopHolder<tp::BrochureAnswer> holder;
    tp::NopReader reader(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    EXPECT_FALSE(holder.read(reader).has_error());
    answer = holder.getObject();
  }
  return {fd, answer};
}

// A connection claiming `who` whose first frame asks for registration `id`.
int request_connection(const std::pair<std::string, int>& to, const PeerIdentity& who,
                       uint64_t id) {
  const int fd = test::raw_connect(to);
  EXPECT_TRUE(raw_handshake(fd, "", who));
  tp::Packet request;
  request = tp::RequestedConnection{id};
  test::send_all(fd, frame(nop_bytes(request)));
  return fd;
}

TEST(RpcConnectionHijack, AnOutsidersRequestForAnotherPeersConnectionIsRefused) {
  Target g(3);
  g.expect_serving();
  const auto w1 = test::published_address(*g.store, 1);
  // w0 (no secret: a claim the store backs) opens a pipe to w1 by hand and holds back the
  // connections its BrochureAnswer registered.
  auto [pipe_fd, answer] = open_pipe_by_hand(w1, PeerIdentity{"w0", 0, 0});
  ASSERT_EQ(answer.transportRegistrationIds.count(1), 1u);
  const uint64_t reply_id = answer.transportRegistrationIds.at(1);
  // An outsider asks for it: refused, counted, closed.
  const uint64_t refused = g.metrics(1).connections_refused;
  const int hijack = request_connection(w1, PeerIdentity{"", -1, 0}, reply_id);
  EXPECT_TRUE(closed_by_peer(hijack));
  ::close(hijack);
  EXPECT_EQ(g.metrics(1).connections_refused, refused + 1);
  // So is another worker of the group (w2's claim, true to the store).
  const int sibling = request_connection(w1, PeerIdentity{"w2", 2, 0}, reply_id);
  EXPECT_TRUE(closed_by_peer(sibling));
  ::close(sibling);
  // The pipe's own peer still gets it: the request was not used up by the refusals.
  const uint64_t accepted = g.metrics(1).connections_accepted;
  const int own = request_connection(w1, PeerIdentity{"w0", 0, 0}, reply_id);
  eventually([&] { return g.metrics(1).connections_accepted != accepted; });
  EXPECT_EQ(g.metrics(1).connections_accepted, accepted + 1);
  ::close(own);
  ::close(pipe_fd);
  g.expect_serving();
}

TEST(RpcConnectionHijack, ARequestForAnIdNobodyWasOfferedIsRefused) {
  Target g(2);
  g.expect_serving();
  const auto w1 = test::published_address(*g.store, 1);
  const uint64_t refused = g.metrics(1).connections_refused;
  for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1} << 40}) {
    const int fd = request_connection(w1, PeerIdentity{"", -1, 0}, id);
    EXPECT_TRUE(closed_by_peer(fd)) << id;
    ::close(fd);
  }
  EXPECT_EQ(g.metrics(1).connections_refused, refused + 4);
  g.expect_serving();
}

// The mpt channel's lanes: a lane listener of gradwire's tcp transport admits a lane hello
// only for a lane the PeerBook holds an offer of, to the claim it was offered to.
TEST(RpcConnectionHijack, AnMptLaneHelloIsAdmittedOnlyForItsOwnPeersOffer) {
  auto book = std::make_shared<transport::PeerBook>();
  auto stats = std::make_shared<transport::TransportStats>();
  transport::StreamOptions o;
  o.name = "lanes";
  o.book = book;
  o.stats = stats;
  o.first_frame = transport::StreamOptions::FirstFrame::kMptLaneHello;
  o.handshake_timeout = 5s;
  auto context = transport::create_stream_context(o);
  auto listener = context->listen("127.0.0.1:0");
  ASSERT_EQ(context->listen_error(), "");
  const std::string address = listener->addr();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::atomic<int> handed_over{0};
  std::function<void(const tp::Error&, std::shared_ptr<tp::transport::Connection>)> on_accept;
  on_accept = [&](const tp::Error& e, std::shared_ptr<tp::transport::Connection>) {
    if (e) return;
    handed_over.fetch_add(1);
    listener->accept(on_accept);
  };
  listener->accept(on_accept);
  auto lane_hello = [&](const PeerIdentity& who, uint64_t id) {
    const int fd = test::raw_connect({"127.0.0.1", port});
    EXPECT_TRUE(raw_handshake(fd, "", who));
    tp::channel::mpt::Packet hello;
    hello = tp::channel::mpt::ClientHello{id};
    test::send_all(fd, frame(nop_bytes(hello)));
    return fd;
  };
  // Nothing offered: refused.
  int fd = lane_hello({"w0", 0, 0}, 3);
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(stats->refused.load(), 1u);
  // Offered to w0: another claim is refused, w0 is admitted, and only once.
  book->offer(address, {3}, PeerIdentity{"w0", 0, 0});
  fd = lane_hello({"w2", 2, 0}, 3);
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  EXPECT_EQ(stats->refused.load(), 2u);
  fd = lane_hello({"w0", 0, 0}, 3);
  eventually([&] { return handed_over.load() != 0; });
  EXPECT_EQ(handed_over.load(), 1);
  const int again = lane_hello({"w0", 0, 0}, 3);
  EXPECT_TRUE(closed_by_peer(again));
  ::close(again);
  ::close(fd);
  // The offer went with its use; dropping its owner leaves the book empty.
  book->forget(42);
  EXPECT_EQ(book->size(), 0u);
  listener->close();
  context->close();
  context->join();
}

// ---- control frames that decode to far more than they weigh

using test::peak_rss_bytes;
using test::reset_peak_rss;

// A Descriptor of `count` empty payload entries (5 bytes each on the wire, a 40-byte struct
// each in memory), written by hand in libnop's encoding.
std::string descriptor_of_empty_payloads(size_t count) {
  std::string out;
  out += '\xb9';  // Descriptor: a structure of three members
  out += '\x03';
  out += '\xbd';  // metadata: an empty string
  out += '\x00';
  out += '\xba';  // payloads: an array of `count`
  out += '\x83';
  const uint64_t n = count;
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out.reserve(out.size() + 5 * count + 2);
  for (size_t i = 0; i < count; ++i)
    out.append("\xb9\x02\x00\xbd\x00", 5);
  out += '\xba';  // tensors: none
  out += '\x00';
  return out;
}

TEST(RpcControlFrames, ADescriptorThatWouldTakeAGigabyteToDecodeIsRefusedUnread) {
  // 12 M entries: 60 MiB on the wire, under the frame limit; 480 MiB decoded, and ~1 GiB at
  // once while libnop's vector grows past 8 M entries into room for 16 M.
  const std::string bytes = descriptor_of_empty_payloads(12u << 20);
  // It is well-formed: with no limit, the scan passes it.
  EXPECT_EQ(
      transport::scan_nop(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), SIZE_MAX),
      "");
  reset_peak_rss();
  const size_t before = peak_rss_bytes();
  tp::NopHolder<tp::Descriptor> holder;
  const std::string why =
      transport::detail::decode_nop(holder, bytes.data(), bytes.size(), 16 * 65536 + 4096);
  EXPECT_NE(why.find("more than 1052672 values"), std::string::npos) << why;
  EXPECT_LT(peak_rss_bytes() - before, size_t{64} << 20);
  EXPECT_TRUE(holder.getObject().payloads.empty());
}

TEST(RpcControlFrames, ALiveWorkerRefusesSuchADescriptorAndServesOn) {
  Target g(2);
  g.expect_serving();
  const auto w1 = test::published_address(*g.store, 1);
  // A pipe opened by hand as an outsider; tcp was chosen, so this connection carries the
  // pipe's descriptors.
  const PeerIdentity visitor{"", -1, 0};
  auto [fd, answer] = open_pipe_by_hand(w1, visitor);
  EXPECT_EQ(answer.transport, "tcp");
  // The pipe is established once every connection it registered is there.
  std::vector<int> requested;
  for (const auto& [connection, id] : answer.transportRegistrationIds)
    requested.push_back(request_connection(w1, visitor, id));
  for (const auto& [channel, ids] : answer.channelRegistrationIds) {
    for (uint64_t id : ids)
      requested.push_back(request_connection(w1, visitor, id));
  }
  const std::string forged = frame(descriptor_of_empty_payloads(8u << 20));
  const uint64_t bad_frames = g.metrics(1).frames_refused;
  reset_peak_rss();
  const size_t before = peak_rss_bytes();
  test::send_all(fd, forged);
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  for (int r : requested)
    ::close(r);
  // The 40 MiB frame is read whole before it is refused: nothing is decoded from it.
  EXPECT_LT(peak_rss_bytes() - before, size_t{64} << 20);
  EXPECT_EQ(g.metrics(1).frames_refused, bad_frames + 1);
  g.expect_serving();
}

TEST(RpcControlFrames, TheScanRefusesWhatNoControlMessageUsesAndLiesAboutSizes) {
  auto scan = [](const std::string& b, size_t max = 1000) {
    return transport::scan_nop(reinterpret_cast<const uint8_t*>(b.data()), b.size(), max);
  };
  // Every control message TensorPipe sends passes.
  tp::BrochureAnswer answer;
  answer.transport = "tcp";
  answer.channelRegistrationIds["basic"] = {1, 2};
  EXPECT_EQ(scan(nop_bytes(answer)), "");
  tp::Descriptor d;
  d.metadata = "envelope";
  d.tensors.resize(3);
  EXPECT_EQ(scan(nop_bytes(d)), "");
  // An array that claims more elements than there are bytes left.
  EXPECT_NE(scan(std::string("\xba\x83\xff\xff\xff\xff\xff\xff\xff\x7f", 10)).find("claims"),
            std::string::npos);
  // A string longer than the frame.
  EXPECT_NE(scan(std::string("\xbd\x10"
                             "abc",
                             5))
                .find("claims 16 bytes"),
            std::string::npos);
  // Tables, handles, errors, extensions and reserved prefixes.
  for (char prefix : {'\xb5', '\xb6', '\xb7', '\xbf', '\x8a', '\xb4'}) {
    EXPECT_NE(scan(std::string(1, prefix) + std::string(8, '\0')).find("which no TensorPipe"),
              std::string::npos)
        << static_cast<int>(static_cast<unsigned char>(prefix));
  }
  // Nesting beyond the limit, in a frame of a few bytes.
  std::string deep;
  for (int i = 0; i < 64; ++i)
    deep += "\xba\x01";
  deep += '\x00';
  EXPECT_NE(scan(deep).find("nests deeper"), std::string::npos);
  // An empty binary (a vector of integers), which libnop would read into a null pointer.
  // (Written by hand: libnop's own writer would memcpy from the null data too.)
  EXPECT_NE(scan(std::string("\xbb\x01\xbd\x05"
                             "basic"
                             "\xbc\x00",
                             11))
                .find("empty binary"),
            std::string::npos);
  // Trailing bytes.
  EXPECT_NE(scan(std::string("\x01\x02", 2)).find("follow its value"), std::string::npos);
}

}  // namespace
}  // namespace gradwire::rpc

// The TensorPipe agent: the transports and channels it registers in its TensorPipe context,
// and the adapters that bind some of them to one host and network namespace.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "gradwire/core/logging.h"
#include "text.h"

namespace gradwire::rpc::detail {

// Transports: TensorPipe picks, per peer, the highest-priority one both ends can use.
constexpr int64_t kUvPriority = 0;
constexpr int64_t kTcpPriority = 50;
constexpr int64_t kShmPriority = 100;
constexpr int64_t kUnixPriority = 120;
constexpr int64_t kLocalPriority = 150;
constexpr int64_t kBasicPriority = 0;
constexpr int64_t kMptPriority = 100;
constexpr int64_t kCmaPriority = 200;
constexpr int64_t kRingPriority = 250;
constexpr int64_t kXthPriority = 300;

std::string unique_shm_name() {
  static std::atomic<uint64_t> counter{0};
  return "gradwire-rpc-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

namespace {

bool wants(const std::vector<std::string>& list, const char* name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// "host:port", with an IPv6 host in brackets.
std::string host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

transport::StreamOptions TensorPipeAgent::stream_options(
    transport::StreamOptions::Family family) const {
  transport::StreamOptions o;
  o.family = family;
  o.secret = secret_;
  o.handshake_timeout = options_.handshake_timeout;
  o.spin = options_.transport_spin;
  o.spin_awaiting = options_.transport_spin_awaiting;
  o.spin_backoff = options_.transport_spin_backoff;
  o.awaiting = [count = calls_.pending_count()] {
    return count->load(std::memory_order_relaxed) != 0;
  };
  // TensorPipe's control frames carry a message's payload plus its tensors' descriptions.
  o.max_frame_bytes = options_.limits.max_payload_bytes + (size_t{16} << 20);
  // A Descriptor holds a few values per tensor; the other control frames hold a few dozen.
  o.max_frame_values = 16 * options_.limits.max_tensors + 4096;
  o.book = book_;
  // Weak: the negotiation holds the transports, whose options hold these.
  std::weak_ptr<const Negotiation> negotiation = negotiation_;
  o.check_answer = [negotiation](const tp::BrochureAnswer& answer) -> std::string {
    auto n = negotiation.lock();
    return n ? n->check(answer) : "this worker is closing";
  };
  o.check_brochure = [negotiation](const tp::Brochure& brochure) -> std::string {
    auto n = negotiation.lock();
    return n ? n->check_brochure(brochure) : "this worker is closing";
  };
  const bool mpt = std::find(options_.channels.begin(), options_.channels.end(), "mpt") !=
                       options_.channels.end() ||
                   std::find(options_.channels.begin(), options_.channels.end(), "mpt_uv") !=
                       options_.channels.end();
  o.mpt_lanes = mpt ? static_cast<size_t>(options_.mpt_lanes) : 0;
  o.stats = family == transport::StreamOptions::Family::kTcp ? transport_stats_ : local_stats_;
  o.name = self_.name;
  // Each connection claims this worker in its handshake, and incoming ones are admitted
  // only as the worker they claim (group.h, PeerAdmission).
  std::weak_ptr<const TensorPipeAgent> weak = weak_from_this();
  o.identity = [weak, name = self_.name, rank = self_.id] {
    auto self = weak.lock();
    return transport::PeerIdentity{name, rank, self ? self->group_.incarnation() : 0};
  };
  o.verify_peer = [weak](const transport::PeerIdentity& peer,
                         transport::StreamOptions::VerifyDone done) {
    auto self = weak.lock();
    if (self == nullptr) {
      done("this worker is shutting down");
      return;
    }
    self->admission_.verify({peer.name, peer.rank, peer.incarnation}, std::move(done));
  };
  o.allow_other_uids =
      options_.local_allow_other_uids || env_bool("GRADWIRE_RPC_LOCAL_ALLOW_OTHER_UIDS", false);
  return o;
}

namespace {

// A transport whose connections exist only within one network namespace of one host
// (abstract Unix sockets, and what is passed over them), registered with a domain
// descriptor that adds this worker's host id and namespace inode to its own. TensorPipe
// offers a transport to a pair of workers only when their descriptors are equal, so such
// a transport is used between two workers exactly when they share host and namespace (what
// GroupDirectory::same_namespace says from the store), whatever its priority, and tcp
// otherwise: two containers of one host never try each other's abstract sockets.
class NamespaceBound final : public tp::transport::Context {
 public:
  NamespaceBound(std::shared_ptr<tp::transport::Context> inner, const std::string& host_id,
                 uint64_t netns)
      : inner_(std::move(inner)),
        domain_(inner_->domainDescriptor() + namespace_suffix(host_id, netns)) {}

  std::shared_ptr<tp::transport::Connection> connect(std::string addr) override {
    return inner_->connect(std::move(addr));
  }
  std::shared_ptr<tp::transport::Listener> listen(std::string addr) override {
    return inner_->listen(std::move(addr));
  }
  bool isViable() const override { return inner_->isViable(); }
  const std::string& domainDescriptor() const override { return domain_; }
  bool canCommunicateWithRemote(const std::string& remote) const override {
    return remote == domain_;
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }
  void join() override { inner_->join(); }

 private:
  const std::shared_ptr<tp::transport::Context> inner_;
  const std::string domain_;
};

// A channel of the "ring" channel's context (below): counts what it sends
// (AgentMetrics::tensors_through_rings) and otherwise is the channel it wraps.
class CountingChannel final : public tp::channel::Channel {
 public:
  CountingChannel(std::shared_ptr<tp::channel::Channel> inner,
                  std::shared_ptr<RingCounters> counters)
      : inner_(std::move(inner)), counters_(std::move(counters)) {}
  void send(tp::Buffer buffer, size_t length, tp::channel::TSendCallback callback) override {
    counters_->tensors.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes.fetch_add(length, std::memory_order_relaxed);
    inner_->send(buffer, length, std::move(callback));
  }
  void recv(tp::Buffer buffer, size_t length, tp::channel::TRecvCallback callback) override {
    inner_->recv(buffer, length, std::move(callback));
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }

 private:
  const std::shared_ptr<tp::channel::Channel> inner_;
  const std::shared_ptr<RingCounters> counters_;
};

// The "ring" channel: TensorPipe's basic channel (tensors written through a connection of
// the pipe's own transport) registered with device descriptors that, like NamespaceBound,
// carry this worker's host id and namespace inode. It is registered only with the local
// transport, so TensorPipe picks it exactly for pipes that run over local: a tensor then
// goes through that transport's shared-memory rings (a copy in on the sender, one out on
// the receiver) instead of a process_vm_readv of the sender's memory (cma).
class NamespaceBoundChannel final : public tp::channel::Context {
 public:
  NamespaceBoundChannel(std::shared_ptr<tp::channel::Context> inner, const std::string& host_id,
                        uint64_t netns, std::shared_ptr<RingCounters> counters)
      : inner_(std::move(inner)),
        suffix_(namespace_suffix(host_id, netns)),
        counters_(std::move(counters)) {
    for (const auto& [device, descriptor] : inner_->deviceDescriptors())
      descriptors_.emplace(device, descriptor + suffix_);
  }

  bool isViable() const override { return inner_->isViable(); }
  size_t numConnectionsNeeded() const override { return inner_->numConnectionsNeeded(); }
  const std::unordered_map<tp::Device, std::string>& deviceDescriptors() const override {
    return descriptors_;
  }
  bool canCommunicateWithRemote(const std::string& local,
                                const std::string& remote) const override {
    return suffixed_descriptors_match(*inner_, suffix_, local, remote);
  }
  std::shared_ptr<tp::channel::Channel> createChannel(
      std::vector<std::shared_ptr<tp::transport::Connection>> connections,
      tp::channel::Endpoint endpoint) override {
    return std::make_shared<CountingChannel>(
        inner_->createChannel(std::move(connections), endpoint), counters_);
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }
  void join() override { inner_->join(); }

 private:
  const std::shared_ptr<tp::channel::Context> inner_;
  const std::string suffix_;
  const std::shared_ptr<RingCounters> counters_;
  std::unordered_map<tp::Device, std::string> descriptors_;
};

}  // namespace

std::shared_ptr<tp::transport::Context> TensorPipeAgent::namespace_bound(
    std::shared_ptr<tp::transport::Context> inner) const {
  return std::make_shared<NamespaceBound>(std::move(inner), descriptor_host_id(), netns_);
}

std::string TensorPipeAgent::descriptor_host_id() const {
  std::string host = host_id_;
  for (char& c : host) {
    if (std::isspace(static_cast<unsigned char>(c))) c = '_';
  }
  return host;
}

std::string TensorPipeAgent::transport_to(const Destination& worker) const {
  const WorkerInfo peer = get_worker_info(worker);
  const bool same = group_.same_namespace(peer.id);
  const std::vector<std::string> theirs = group_.transports_of(peer.id);
  for (const std::string& t : transports_) {
    const bool per_namespace = t == "local" || t == "unix" || t == "shm";
    if (per_namespace && !same) continue;
    if (std::find(theirs.begin(), theirs.end(), t) != theirs.end()) return t;
  }
  // Unreachable in a group that started: every worker registers tcp or uv.
  return "none";
}

void TensorPipeAgent::register_transport(int64_t priority, const std::string& name,
                                         std::shared_ptr<tp::transport::Context> context) {
  negotiation_->add_transport(name, context);
  context_->registerTransport(priority, name, std::move(context));
}

void TensorPipeAgent::register_channel(int64_t priority, const std::string& name,
                                       std::shared_ptr<tp::channel::Context> context) {
  negotiation_->add_channel(priority, name, context);
  context_->registerChannel(priority, name, std::move(context));
}

std::vector<std::string> TensorPipeAgent::register_transports_and_channels(
    const std::string& host) {
  std::vector<std::string> urls = register_transports(host);
  register_channels(host);
  negotiation_->set_first_transport(tcp_ != nullptr ? "tcp" : "uv");
  return urls;
}

std::vector<std::string> TensorPipeAgent::register_transports(const std::string& host) {
  // The first connection to every peer goes over tcp (or, without it, TensorPipe's uv):
  // its URL comes first and is the one announced.
  std::vector<std::string> urls;
  if (wants(options_.transports, "tcp")) {
    tcp_ = transport::create_stream_context(stream_options(transport::StreamOptions::Family::kTcp));
    register_transport(kTcpPriority, "tcp", tcp_);
    urls.push_back("tcp://" + host_port(host, 0));
  }
  if (wants(options_.transports, "local")) {
    local_ =
        transport::create_stream_context(stream_options(transport::StreamOptions::Family::kLocal));
    if (local_->isViable()) {
      register_transport(kLocalPriority, "local", namespace_bound(local_));
      urls.push_back("local://" + transport::unique_local_name());
    } else {
      GRADWIRE_LOG(kWarning) << "rpc agent " << self_.describe()
                             << ": the local transport needs memfd segments, which this "
                                "kernel refuses; peers on this host use the next transport";
      local_.reset();
    }
  }
  if (wants(options_.transports, "unix")) {
    unix_ =
        transport::create_stream_context(stream_options(transport::StreamOptions::Family::kUnix));
    register_transport(kUnixPriority, "unix", namespace_bound(unix_));
    urls.push_back("unix://" + transport::unique_local_name());
  }
  if (wants(options_.transports, "uv")) {
    register_transport(kUvPriority, "uv", tp::transport::uv::create());
    urls.push_back("uv://" + host_port(host, 0));
  }
  bool shm_registered = false;
  if (wants(options_.transports, "shm")) {
    auto shm = tp::transport::shm::create();
    if (shm->isViable()) {
      register_transport(kShmPriority, "shm", namespace_bound(shm));
      shm_registered = true;
      urls.push_back("shm://" + unique_shm_name());
    }
  }
  // In TensorPipe's order of preference (the priorities above).
  if (local_ != nullptr) transports_.push_back("local");
  if (unix_ != nullptr) transports_.push_back("unix");
  if (shm_registered) transports_.push_back("shm");
  if (tcp_ != nullptr) transports_.push_back("tcp");
  if (wants(options_.transports, "uv")) transports_.push_back("uv");
  return urls;
}

void TensorPipeAgent::register_channels(const std::string& host) {
  if (wants(options_.channels, "basic")) {
    register_channel(kBasicPriority, "basic", tp::channel::basic::create());
  }
  if (wants(options_.channels, "mpt") || wants(options_.channels, "mpt_uv")) register_mpt(host);
  if (wants(options_.channels, "ring") && local_ != nullptr) {
    register_channel(
        kRingPriority, "ring",
        std::make_shared<NamespaceBoundChannel>(tp::channel::basic::create(), descriptor_host_id(),
                                                netns_, ring_counters_));
  }
  // xth and cma read memory by address: they are registered wrapped (verified_channels.h),
  // and only beside a transport over Unix sockets, whose connections name their process.
  const bool unix_sockets = local_ != nullptr || unix_ != nullptr;
  channel_refusals_->worker = self_.name;
  if (wants(options_.channels, "cma") && unix_sockets) {
    auto cma = tp::channel::cma::create();
    if (cma->isViable()) {
      register_channel(kCmaPriority, "cma",
                       verified_process_channel(cma, namespace_suffix(descriptor_host_id(), netns_),
                                                channel_refusals_));
    }
  }
  if (wants(options_.channels, "xth") && unix_sockets) {
    auto xth = tp::channel::xth::create();
    if (xth->isViable()) {
      register_channel(kXthPriority, "xth", same_process_channel(xth, channel_refusals_));
    }
  }
}

// mpt opens connections of its own, on one listener per lane: over gradwire's tcp (with the
// handshake) as "mpt", or over TensorPipe's uv as "mpt_uv".
void TensorPipeAgent::register_mpt(const std::string& host) {
  const bool ours = wants(options_.channels, "mpt");
  std::vector<std::shared_ptr<tp::transport::Context>> lanes;
  std::vector<std::shared_ptr<tp::transport::Listener>> listeners;
  for (int i = 0; i < options_.mpt_lanes; ++i) {
    std::shared_ptr<tp::transport::Context> lane;
    if (ours) {
      transport::StreamOptions o = stream_options(transport::StreamOptions::Family::kTcp);
      o.first_frame = transport::StreamOptions::FirstFrame::kMptLaneHello;
      auto stream = transport::create_stream_context(std::move(o));
      listeners.push_back(stream->listen(host_port(host, 0)));
      if (std::string error = stream->listen_error(); !error.empty()) {
        throw NetworkError("rpc agent " + self_.describe() + ": the mpt channel's lane " +
                           std::to_string(i) + ": " + error);
      }
      lane = std::move(stream);
    } else {
      lane = tp::transport::uv::create();
      listeners.push_back(lane->listen(host));
    }
    lanes.push_back(std::move(lane));
  }
  register_channel(kMptPriority, ours ? "mpt" : "mpt_uv",
                   tp::channel::mpt::create(std::move(lanes), std::move(listeners)));
}

}  // namespace gradwire::rpc::detail

#include "tensorpipe/verified_channels.h"

#include <unistd.h>

#include <tensorpipe/channel/channel.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/transport/connection.h>

#include <chrono>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "gradwire/core/logging.h"
#include "transport/stream_transport.h"

namespace gradwire::rpc::detail {

namespace {

namespace tp = tensorpipe;

constexpr auto kLogPeriod = std::chrono::seconds(10);

class RefusedError final : public tp::BaseError {
 public:
  explicit RefusedError(std::string message) : message_(std::move(message)) {}
  std::string what() const override { return message_; }

 private:
  std::string message_;
};

tp::Error refused_error(const std::string& why) {
  return tp::Error(std::make_shared<RefusedError>(why), "gradwire channel", 0);
}

// Counts a refusal and logs it, at most once per period (a peer may open pipe after pipe).
void note_refusal(ChannelRefusals& refusals, const std::string& why) {
  const uint64_t n = refusals.count.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = refusals.last_logged_ns.load(std::memory_order_relaxed);
  const int64_t period = std::chrono::duration_cast<std::chrono::nanoseconds>(kLogPeriod).count();
  if (last != 0 && now - last < period) return;
  if (!refusals.last_logged_ns.compare_exchange_strong(last, now)) return;
  GRADWIRE_LOG(kWarning) << "rpc worker '" << refusals.worker << "' refused a channel: " << why
                         << " (" << n << " refused so far)";
}

// A channel that carries nothing: every transfer fails with why it was refused, so the pipe
// fails and is closed.
class RefusedChannel final : public tp::channel::Channel {
 public:
  explicit RefusedChannel(std::string why) : why_(std::move(why)) {}
  void send(tp::Buffer /*buffer*/, size_t /*length*/,
            tp::channel::TSendCallback callback) override {
    callback(refused_error(why_));
  }
  void recv(tp::Buffer /*buffer*/, size_t /*length*/,
            tp::channel::TRecvCallback callback) override {
    callback(refused_error(why_));
  }
  void setId(std::string /*id*/) override {}
  void close() override {}

 private:
  const std::string why_;
};

// cma's per-transfer descriptor: the sender's pid and the address to read (the same layout
// as the channel's own, so libnop decodes it alike).
struct CmaDescriptor {
  uint32_t pid;
  uint64_t ptr;
  NOP_STRUCTURE(CmaDescriptor, pid, ptr);
};

// cma's descriptor connection: every descriptor read is checked to name the verified
// process before the channel sees it.
class PidCheckedConnection final : public tp::transport::Connection {
 public:
  PidCheckedConnection(std::shared_ptr<tp::transport::Connection> inner, pid_t pid,
                       std::shared_ptr<ChannelRefusals> refusals)
      : inner_(std::move(inner)), pid_(pid), refusals_(std::move(refusals)) {}

  void read(read_callback_fn fn) override { inner_->read(std::move(fn)); }
  void read(void* ptr, size_t length, read_callback_fn fn) override {
    inner_->read(ptr, length, std::move(fn));
  }
  void write(const void* ptr, size_t length, write_callback_fn fn) override {
    inner_->write(ptr, length, std::move(fn));
  }
  void write(const tp::AbstractNopHolder& object, write_callback_fn fn) override {
    inner_->write(object, std::move(fn));
  }
  void read(tp::AbstractNopHolder& object, read_nop_callback_fn fn) override {
    inner_->read(object, [this_pid = pid_, refusals = refusals_, &object,
                          fn = std::move(fn)](const tp::Error& error) {
      if (error) {
        fn(error);
        return;
      }
      const std::string why = check(object, this_pid);
      if (!why.empty()) {
        note_refusal(*refusals, why);
        fn(refused_error(why));
        return;
      }
      fn(error);
    });
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }

 private:
  // "" when `object` is a cma descriptor naming process `pid`, else why not.
  static std::string check(const tp::AbstractNopHolder& object, pid_t pid) {
    std::vector<uint8_t> bytes(object.getSize());
    tp::NopWriter writer(bytes.data(), bytes.size());
    if (object.write(writer).has_error()) return "a cma descriptor does not encode";
    tp::NopHolder<CmaDescriptor> mirror;
    tp::NopReader reader(bytes.data(), bytes.size());
    if (mirror.read(reader).has_error()) return "a cma descriptor does not decode";
    const uint32_t named = mirror.getObject().pid;
    if (static_cast<pid_t>(named) == pid) return "";
    return "a cma descriptor names process " + std::to_string(named) +
           ", but the connection's process is " + std::to_string(pid) +
           " (SO_PEERCRED): this worker reads no other process's memory";
  }

  const std::shared_ptr<tp::transport::Connection> inner_;
  const pid_t pid_;
  const std::shared_ptr<ChannelRefusals> refusals_;
};

// The process every connection reaches, when they all reach one that the kernel reported;
// else nullopt with `why`.
std::optional<pid_t> one_verified_process(
    const std::vector<std::shared_ptr<tp::transport::Connection>>& connections, std::string& why) {
  std::optional<pid_t> pid;
  for (const auto& c : connections) {
    const std::optional<transport::PeerProcess> p =
        c == nullptr ? std::nullopt : transport::peer_process(*c);
    if (!p) {
      why =
          "its connections are not gradwire local connections, so their process is "
          "not known (the pipe runs over another transport)";
      return std::nullopt;
    }
    if (pid && *pid != p->pid) {
      why = "its connections reach two processes (" + std::to_string(*pid) + " and " +
            std::to_string(p->pid) + ")";
      return std::nullopt;
    }
    pid = p->pid;
  }
  if (!pid) why = "it has no connection";
  return pid;
}

std::string random_hex(size_t bytes) {
  std::random_device device;
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = device() & 0xff;
    out += digits[v >> 4];
    out += digits[v & 15];
  }
  return out;
}

// One process's xth descriptor: random, so that it says nothing about the process.
const std::string& process_token() {
  static const std::string token = "gradwire-xth:" + random_hex(16);
  return token;
}

class VerifiedChannelContext final : public tp::channel::Context {
 public:
  enum class Mode { kSameProcess, kVerifiedProcess };

  VerifiedChannelContext(std::shared_ptr<tp::channel::Context> inner, Mode mode,
                         const std::string& suffix, std::shared_ptr<ChannelRefusals> refusals)
      : inner_(std::move(inner)), mode_(mode), refusals_(std::move(refusals)) {
    for (const auto& [device, descriptor] : inner_->deviceDescriptors()) {
      descriptors_.emplace(device,
                           mode_ == Mode::kSameProcess ? process_token() : descriptor + suffix);
    }
    suffix_ = suffix;
  }

  bool isViable() const override { return inner_->isViable(); }
  size_t numConnectionsNeeded() const override { return inner_->numConnectionsNeeded(); }
  const std::unordered_map<tp::Device, std::string>& deviceDescriptors() const override {
    return descriptors_;
  }
  bool canCommunicateWithRemote(const std::string& local,
                                const std::string& remote) const override {
    if (mode_ == Mode::kSameProcess) return local == remote && local == process_token();
    return suffixed_descriptors_match(*inner_, suffix_, local, remote);
  }

  std::shared_ptr<tp::channel::Channel> createChannel(
      std::vector<std::shared_ptr<tp::transport::Connection>> connections,
      tp::channel::Endpoint endpoint) override {
    std::string why;
    const std::optional<pid_t> pid = one_verified_process(connections, why);
    if (pid && mode_ == Mode::kSameProcess && *pid != ::getpid()) {
      why = "its connections reach process " + std::to_string(*pid) +
            ", not this one, and xth copies only within one process";
    }
    if (!why.empty()) {
      why = std::string(mode_ == Mode::kSameProcess ? "xth" : "cma") + " was chosen for a pipe, " +
            "but " + why;
      note_refusal(*refusals_, why);
      for (const auto& c : connections) {
        if (c != nullptr) c->close();
      }
      return std::make_shared<RefusedChannel>(why);
    }
    if (mode_ == Mode::kVerifiedProcess && !connections.empty()) {
      // cma reads its descriptors on the first connection.
      connections[0] =
          std::make_shared<PidCheckedConnection>(std::move(connections[0]), *pid, refusals_);
    }
    return inner_->createChannel(std::move(connections), endpoint);
  }

  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }
  void join() override { inner_->join(); }

 private:
  const std::shared_ptr<tp::channel::Context> inner_;
  const Mode mode_;
  const std::shared_ptr<ChannelRefusals> refusals_;
  std::string suffix_;
  std::unordered_map<tp::Device, std::string> descriptors_;
};

}  // namespace

std::string namespace_suffix(const std::string& host_id, uint64_t netns) {
  return "|host=" + host_id + "|netns=" + std::to_string(netns);
}

bool suffixed_descriptors_match(const tp::channel::Context& inner, const std::string& suffix,
                                const std::string& local, const std::string& remote) {
  if (local != remote || local.size() < suffix.size() ||
      local.compare(local.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string unsuffixed = local.substr(0, local.size() - suffix.size());
  return inner.canCommunicateWithRemote(unsuffixed, unsuffixed);
}

std::shared_ptr<tp::channel::Context> same_process_channel(
    std::shared_ptr<tp::channel::Context> xth, std::shared_ptr<ChannelRefusals> refusals) {
  return std::make_shared<VerifiedChannelContext>(
      std::move(xth), VerifiedChannelContext::Mode::kSameProcess, "", std::move(refusals));
}

std::shared_ptr<tp::channel::Context> verified_process_channel(
    std::shared_ptr<tp::channel::Context> cma, const std::string& suffix,
    std::shared_ptr<ChannelRefusals> refusals) {
  return std::make_shared<VerifiedChannelContext>(
      std::move(cma), VerifiedChannelContext::Mode::kVerifiedProcess, suffix, std::move(refusals));
}

}  // namespace gradwire::rpc::detail

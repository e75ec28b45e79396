#include "transport/stream_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensorpipe/transport/error.h>

#include <cerrno>

#include "gradwire/core/auth.h"
#include "gradwire/core/mutex.h"
#include "transport/stream_connection.h"
#include "transport/stream_core.h"
#include "transport/stream_listener.h"

// The context: what TensorPipe registers, making connections and listeners (the parts are
// described in stream_core.h).
namespace gradwire::rpc::transport {

namespace {

namespace tp = tensorpipe;
using detail::Address;
using detail::ConnHandle;
using detail::ConnImpl;
using detail::Core;
using detail::errno_text;
using detail::family_name;
using detail::format_address;
using detail::ListenerHandle;
using detail::ListenerImpl;
using detail::parse_address;
using detail::read_first_line;
using detail::unix_socket;
using tp::transport::Connection;
using tp::transport::Listener;

std::string host_domain(StreamOptions::Family family) {
  // Abstract Unix sockets (and the descriptors passed over them) are shared by the
  // processes of one host and network namespace.
  struct stat st {};
  std::string netns = "0";
  if (::stat("/proc/self/ns/net", &st) == 0) netns = std::to_string(st.st_ino);
  return std::string("gradwire-") + family_name(family) + ":" +
         read_first_line("/proc/sys/kernel/random/boot_id") + ":" + netns;
}

class ContextImpl final : public StreamContext {
 public:
  explicit ContextImpl(StreamOptions options)
      : core_(std::make_shared<Core>(std::move(options))),
        domain_(unix_socket(core_->options.family) ? host_domain(core_->options.family)
                                                   : std::string("gradwire-tcp")),
        viable_(core_->options.family != StreamOptions::Family::kLocal || RingSegment::viable()) {}

  ~ContextImpl() override {
    close();
    join();
  }

  std::shared_ptr<Connection> connect(std::string addr) override {
    const bool tcp = !unix_socket(core_->options.family);
    int fd = -1;
    int err = 0;
    std::string bad_address;
    try {
      const Address a = parse_address(core_->options.family, addr);
      fd = ::socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        err = errno;
      } else {
        if (tcp) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0 &&
            errno != EINPROGRESS) {
          err = errno;
        }
      }
    } catch (const std::exception& e) {
      bad_address = e.what();
    }
    if (fd >= 0 && err != 0) {
      ::close(fd);
      fd = -1;
    }
    auto conn = std::make_shared<ConnImpl>(core_, fd, ConnImpl::Role::kClient, addr);
    // A closed context runs nothing more: the connection's operations then fail at once.
    core_->run_on_loop([conn, err, bad_address] { conn->start(true, err, nullptr, bad_address); });
    return std::make_shared<ConnHandle>(std::move(conn));
  }

  std::shared_ptr<Listener> listen(std::string addr) override {
    std::string error;
    std::string bound = addr;
    int fd = -1;
    try {
      if (unix_socket(core_->options.family) && addr.empty()) {
        addr = unique_local_name();
      }
      const Address a = parse_address(core_->options.family, addr);
      fd = ::socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) throw std::runtime_error(std::string("socket: ") + errno_text(errno));
      const int one = 1;
      if (!unix_socket(core_->options.family)) {
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      }
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
        throw std::runtime_error("bind: " + errno_text(errno));
      }
      if (::listen(fd, 1024) != 0) throw std::runtime_error("listen: " + errno_text(errno));
      sockaddr_storage got{};
      socklen_t got_len = sizeof(got);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &got_len);
      bound = format_address(core_->options.family, got, got_len);
    } catch (const std::exception& e) {
      error = "listening on '" + addr + "' failed: " + e.what();
      if (fd >= 0) ::close(fd);
      fd = -1;
      MutexLock lock(mutex_);
      if (listen_error_.empty()) listen_error_ = error;
    }
    auto impl = std::make_shared<ListenerImpl>(core_, fd, bound, error);
    core_->run_on_loop([impl] { impl->start(); });
    return std::make_shared<ListenerHandle>(std::move(impl));
  }

  // "local" needs memfd segments (Linux 3.17 and a kernel that allows them).
  bool isViable() const override { return viable_; }
  const std::string& domainDescriptor() const override { return domain_; }
  void setId(std::string /*id*/) override {}

  void close() override {
    if (core_->closing.exchange(true)) return;
    std::shared_ptr<Core> core = core_;
    core->reactor.defer([core] {
      core->closed = true;
      auto listeners = core->listeners;
      for (auto& l : listeners)
        l->close_now();
      auto conns = core->conns;
      for (auto& c : conns)
        c->fail(tp::Error(std::make_shared<tp::transport::ContextClosedError>(),
                          "gradwire transport", 0));
      core->flush_refusals();
    });
    core->reactor.close();
  }

  void join() override {
    close();
    core_->reactor.join();
  }

  std::string listen_error() const override {
    MutexLock lock(mutex_);
    return listen_error_;
  }

 private:
  std::shared_ptr<Core> core_;
  const std::string domain_;
  const bool viable_;
  mutable Mutex mutex_;
  std::string listen_error_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace

std::shared_ptr<StreamContext> create_stream_context(StreamOptions options) {
  return std::make_shared<ContextImpl>(std::move(options));
}

std::string unique_local_name() {
  static std::atomic<uint64_t> counter{0};
  static const char* const kHex = "0123456789abcdef";
  std::string random;
  for (const char c : random_bytes(8)) {
    random.push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
    random.push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
  }
  return "gradwire-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) +
         "-" + random;
}

std::optional<PeerProcess> peer_process(const tp::transport::Connection& connection) {
  const auto* ours = dynamic_cast<const ConnHandle*>(&connection);
  if (ours == nullptr) return std::nullopt;
  return ours->impl().process();
}

}  // namespace gradwire::rpc::transport

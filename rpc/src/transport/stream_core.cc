#include "transport/stream_core.h"

#include "transport/nop_scan.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include <tensorpipe/transport/error.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace gradwire::rpc::transport::detail {

namespace {

class TransportError final : public tp::BaseError {
 public:
  explicit TransportError(std::string message) : message_(std::move(message)) {}
  std::string what() const override { return message_; }

 private:
  std::string message_;
};

constexpr size_t kNopGuardBytes = 4096;
const uint8_t* nop_guard() {
  static const std::vector<uint8_t> guard(kNopGuardBytes, 0x8a);
  return guard.data();
}

}  // namespace

tp::Error make_error(std::string message) {
  return tp::Error(std::make_shared<TransportError>(std::move(message)), "gradwire transport", 0);
}

tp::Error closed_error() {
  return tp::Error(std::make_shared<tp::transport::ConnectionClosedError>(), "gradwire transport",
                   0);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string decode_nop(tp::AbstractNopHolder& holder, const char* data, size_t size,
                       size_t max_values) {
  if (std::string why = scan_nop(reinterpret_cast<const uint8_t*>(data), size, max_values);
      !why.empty()) {
    return why;
  }
  tp::NopReader reader(reinterpret_cast<const uint8_t*>(data), size, nop_guard(), kNopGuardBytes);
  nop::Status<void> status = holder.read(reader);
  if (status.has_error()) return status.GetErrorMessage();
  if (holder.getSize() != size) {
    return "it holds " + std::to_string(size) + " bytes where its content takes " +
           std::to_string(holder.getSize());
  }
  return "";
}

bool unix_socket(StreamOptions::Family family) {
  return family != StreamOptions::Family::kTcp;
}

const char* family_name(StreamOptions::Family family) {
  switch (family) {
    case StreamOptions::Family::kTcp:
      return "tcp";
    case StreamOptions::Family::kLocal:
      return "local";
    case StreamOptions::Family::kUnix:
      return "unix";
  }
  return "?";
}

Address parse_address(StreamOptions::Family family, const std::string& addr) {
  Address out;
  if (unix_socket(family)) {
    auto* un = reinterpret_cast<sockaddr_un*>(&out.storage);
    un->sun_family = AF_UNIX;
    if (addr.empty() || addr.size() + 1 > sizeof(un->sun_path)) {
      throw std::runtime_error("a local transport name must have 1 to " +
                               std::to_string(sizeof(un->sun_path) - 1) + " characters");
    }
    // The abstract namespace: a leading NUL, no file.
    un->sun_path[0] = '\0';
    std::memcpy(un->sun_path + 1, addr.data(), addr.size());
    out.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + addr.size());
    return out;
  }
  std::string host;
  std::string port;
  if (!addr.empty() && addr.front() == '[') {
    const size_t close = addr.find(']');
    if (close == std::string::npos || close + 1 >= addr.size() || addr[close + 1] != ':') {
      throw std::runtime_error("'" + addr + "' is not [host]:port");
    }
    host = addr.substr(1, close - 1);
    port = addr.substr(close + 2);
  } else {
    const size_t colon = addr.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("'" + addr + "' is not host:port");
    host = addr.substr(0, colon);
    port = addr.substr(colon + 1);
  }
  if (host.empty() || port.empty()) throw std::runtime_error("'" + addr + "' is not host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw std::runtime_error("cannot resolve '" + addr + "': " + ::gai_strerror(rc));
  }
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

std::string format_address(StreamOptions::Family family, const sockaddr_storage& storage,
                           socklen_t length) {
  if (unix_socket(family)) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&storage);
    const size_t base = offsetof(sockaddr_un, sun_path);
    if (length <= base + 1) return "a local peer";
    return std::string(un->sun_path + 1, length - base - 1);
  }
  char text[INET6_ADDRSTRLEN] = {0};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "an unknown address";
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

void Core::note_refused(const std::string& peer, const std::string& why) {
  options.stats->refused.fetch_add(1, std::memory_order_relaxed);
  if (refusals.note("from " + peer + ": " + why)) {
    log.log(LogLevel::kWarning, prefix() + "refused a connection from " + peer + ": " + why +
                                    " (further refusals are summarised every " +
                                    std::to_string(kRefusalLogPeriod.count()) + " s)");
    return;
  }
  if (!summary_armed) {
    summary_armed = true;
    std::weak_ptr<Core> weak = weak_from_this();
    reactor.add_timer(refusals.due(), [weak] {
      if (auto self = weak.lock()) self->flush_refusals();
    });
  }
}

void Core::flush_refusals() {
  summary_armed = false;
  if (auto line = refusals.summarise("connections refused")) {
    log.log(LogLevel::kWarning, prefix() + *line);
  }
}

std::string Core::check_peer_user(int fd) const {
  if (!unix_socket(options.family) || options.allow_other_uids) return "";
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return std::string("cannot learn the peer's user (SO_PEERCRED): ") + errno_text(errno);
  }
  const uid_t mine = ::geteuid();
  if (cred.uid == mine) return "";
  return "its process (pid " + std::to_string(cred.pid) + ") runs as uid " +
         std::to_string(cred.uid) + ", this one as uid " + std::to_string(mine) + "; the " +
         kind() +
         " transport admits only the same user unless other users are allowed "
         "(AgentOptions::local_allow_other_uids, GRADWIRE_RPC_LOCAL_ALLOW_OTHER_UIDS)";
}

}  // namespace gradwire::rpc::transport::detail

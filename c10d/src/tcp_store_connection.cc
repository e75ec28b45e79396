// TCPStore's connection: the reader role, reply dispatch and failure reporting (see
// tcp_store_connection.h).
#include "tcp_store_connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "gradwire/core/check.h"
#include "tcp_protocol.h"

namespace gradwire::c10d::store_client {

using proto::FrameReader;
using proto::Reply;

namespace {

// A connection that received a reply this recently is not probed (see probe()).
constexpr int64_t kProbeIdleNs = 1'000'000;

}  // namespace

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string limit_message(const std::string& payload) {
  FrameReader r(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  const auto limit = static_cast<proto::Limit>(r.u8());
  const uint64_t value = r.u64();
  const std::string text(r.bytes(UINT32_MAX, "message"));
  return "refused by the store's limit " + std::string(proto::limit_name(limit)) + " = " +
         std::to_string(value) + ": " + text;
}

void Connection::probe() {
  const int64_t now = Clock::now().time_since_epoch().count();
  if (now - last_reply_ns_.load(std::memory_order_relaxed) < kProbeIdleNs) return;
  char byte;
  const ssize_t n = ::recv(fd_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    mark_broken("the server closed the connection");
  } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    mark_broken(errno_text(errno));
  }
}

Response Connection::call(const std::string& frame, uint32_t id, bool reply,
                          Clock::time_point deadline, std::string_view what) {
  Slot slot;
  {
    MutexLock lock(mutex_);
    throw_if_broken_locked(what);
    throw_deferred_locked();
    if (reply) pending_.emplace(id, &slot);
  }
  if (!send_all(frame)) {
    if (reply) forget(id);
    throw_broken(what);
  }
  if (!reply) return {};
  return wait_for(slot, id, deadline, what);
}

bool Connection::send_all(const std::string& frame) {
  MutexLock lock(write_mutex_);
  const char* p = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    const ssize_t n = ::send(fd_.get(), p, left, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      mark_broken("send failed: " + errno_text(errno));
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

void Connection::throw_broken(std::string_view what) {
  MutexLock lock(mutex_);
  throw_if_broken_locked(what);
  GRADWIRE_THROW(NetworkError) << "TCPStore " << what << ": connection to " << address_ << " lost";
}

void Connection::throw_if_broken_locked(std::string_view what) {
  if (broken_) {
    GRADWIRE_THROW(NetworkError) << "TCPStore " << what << ": connection to the server at "
                                 << address_ << " lost: " << *broken_;
  }
}

void Connection::throw_deferred_locked() {
  if (deferred_.empty()) return;
  std::string message = std::move(deferred_);
  deferred_.clear();
  throw_error(deferred_kind_, "TCPStore: an earlier write was rejected by the server at " +
                                  address_ + ": " + message);
}

Response Connection::wait_for(Slot& slot, uint32_t id, Clock::time_point deadline,
                              std::string_view what) {
  for (;;) {
    {
      MutexLock lock(mutex_);
      for (;;) {
        if (slot.done) return std::move(slot.response);
        if (broken_) {
          pending_.erase(id);
          throw_if_broken_locked(what);
        }
        if (Clock::now() >= deadline) {
          pending_.erase(id);
          GRADWIRE_THROW(TimeoutError) << "TCPStore " << what << ": no reply from the server at "
                                       << address_ << " before the deadline";
        }
        if (!reader_active_) {
          reader_active_ = true;
          break;
        }
        lock.wait_until(changed_, deadline);
      }
    }
    read_and_dispatch();
  }
}

void Connection::read_and_dispatch() {
  // A blocking receive: the socket's SO_RCVTIMEO (kReceiveSlice) bounds it, so a reader
  // whose deadline passed gives the role up soon after; no poll() call per reply.
  std::string failure;
  char buf[64 * 1024];
  const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
  if (n == 0) {
    failure = "the server closed the connection";
  } else if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
    failure = "receive failed: " + errno_text(errno);
  } else if (n > 0) {
    inbuf_.append(buf, static_cast<size_t>(n));
    last_reply_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Complete frames, cut out of inbuf_ before taking the lock.
  std::vector<std::pair<uint32_t, Response>> frames;
  size_t used = 0;
  while (inbuf_.size() - used >= proto::kLengthBytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(inbuf_.data() + used);
    const uint32_t len = proto::load_u32(p);
    if (len < proto::kMinFrame) {
      failure = "malformed reply from the server (frame length " + std::to_string(len) + ")";
      break;
    }
    if (inbuf_.size() - used < proto::kLengthBytes + len) break;
    Response r;
    r.kind = p[4];
    const uint32_t id = proto::load_u32(p + 5);
    r.payload.assign(inbuf_, used + proto::kLengthBytes + proto::kMinFrame, len - proto::kMinFrame);
    frames.emplace_back(id, std::move(r));
    used += proto::kLengthBytes + len;
  }
  inbuf_.erase(0, used);

  MutexLock lock(mutex_);
  for (auto& [id, response] : frames) {
    auto it = pending_.find(id);
    if (it != pending_.end()) {
      it->second->response = std::move(response);
      it->second->done = true;
      pending_.erase(it);
      continue;
    }
    ErrorKind kind = ErrorKind::kStore;
    std::string message;
    if (response.kind == static_cast<uint8_t>(Reply::kLimit)) {
      message = limit_message(response.payload);
    } else if (response.kind == static_cast<uint8_t>(Reply::kError)) {
      FrameReader er(reinterpret_cast<const uint8_t*>(response.payload.data()),
                     response.payload.size());
      kind = static_cast<ErrorKind>(er.u8());
      message = std::string(er.bytes(UINT32_MAX, "message"));
    } else {
      continue;  // a late reply
    }
    if (id == 0) {
      // The server is closing this connection and says why.
      if (!broken_) broken_ = message;
    } else if (deferred_.empty()) {
      deferred_kind_ = kind;
      deferred_ = message;
    }
  }
  if (!failure.empty() && !broken_) broken_ = failure;
  reader_active_ = false;
  changed_.notify_all();
}

}  // namespace gradwire::c10d::store_client

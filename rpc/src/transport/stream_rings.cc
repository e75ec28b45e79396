#include "transport/stream_connection.h"

#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

// The shared-memory rings of a "local" connection (stream_connection.h).
namespace gradwire::rpc::transport::detail {

void ConnImpl::take_descriptors(msghdr& msg) {
  if ((msg.msg_flags & MSG_CTRUNC) != 0) fd_abuse_ = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (received_fd_ < 0 && !fd_abuse_) {
        received_fd_ = fd;
      } else {
        ::close(fd);
        fd_abuse_ = true;
      }
    }
  }
}

void ConnImpl::send_wake(int fd) {
  const char byte = 'w';
  ssize_t n = -1;
  do {
    n = ::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
}

ssize_t ConnImpl::send_with_segment() {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{handshake_out_.data(), handshake_out_.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pending_fd_, sizeof(int));
  const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    // Passed with the first byte: the mapping stays, our descriptor is no longer needed.
    ::close(pending_fd_);
    pending_fd_ = -1;
  }
  return n;
}

bool ConnImpl::drain_wake_socket() {
  char sink[256];
  for (;;) {
    const ssize_t n = ::recv(fd_, sink, sizeof(sink), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    const std::string why = n == 0 ? std::string("closed by the peer") : errno_text(errno);
    // What the peer wrote before it went is delivered first.
    pump_reads();
    if (state_ == State::kClosed) return true;
    if (opening()) {
      refuse_or_fail("the peer closed the connection during the handshake");
    } else {
      fail(make_error("the connection with " + peer_ + " was " + (n == 0 ? why : "lost: " + why)));
    }
    return true;
  }
}

bool ConnImpl::attach_rings() {
  std::string error;
  const size_t capacity =
      RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(setup_.data()), &error);
  if (capacity == 0) {
    refuse_or_fail(error);
    return false;
  }
  if (received_fd_ < 0) {
    refuse_or_fail("its ring setup came without a shared-memory segment");
    return false;
  }
  const int fd = received_fd_;
  received_fd_ = -1;
  segment_ = RingSegment::attach(fd, capacity, &error);
  if (segment_ == nullptr) {
    refuse_or_fail(error);
    return false;
  }
  enter_ring_mode(/*read_ring=*/0, /*write_ring=*/1);
  return true;
}

void ConnImpl::enter_ring_mode(int read_ring, int write_ring) {
  const size_t capacity = segment_->capacity();
  in_ = RingReader(segment_->control(read_ring), segment_->data(read_ring), capacity);
  {
    MutexLock lock(write_mutex_);
    out_ = RingWriter(segment_->control(write_ring), segment_->data(write_ring), capacity);
  }
  ring_mode_ = true;
  // Bytes still staged came over the socket after the handshake: wake-ups, not frames.
  staged_begin_ = staged_end_ = 0;
  std::weak_ptr<ConnImpl> weak = weak_from_this();
  poller_ = core_->reactor.add_poller([weak](bool arm) {
    auto self = weak.lock();
    return self != nullptr && self->poll_ring(arm);
  });
}

bool ConnImpl::poll_ring(bool arm) {
  if (state_ == State::kClosed || !ring_mode_) return false;
  bool corrupt = false;
  bool found = false;
  if (arm) {
    found = in_.arm(&corrupt) && !reading_paused_;
  } else {
    in_.disarm();
    if (!reading_paused_ && in_.readable(&corrupt) && !corrupt) {
      const uint64_t before = in_.position();
      pump_reads();
      if (state_ == State::kClosed) return true;
      found = in_.position() != before;
    }
  }
  if (!corrupt && want_space_.load(std::memory_order_relaxed)) {
    bool space = false;
    {
      MutexLock lock(write_mutex_);
      space = out_.writable(&corrupt);
    }
    if (space && !corrupt) {
      if (arm) return true;
      pump_writes();
      found = true;
    }
  }
  if (corrupt) {
    bad_frame("the peer corrupted the positions of the shared-memory ring");
    return true;
  }
  return found;
}

}  // namespace gradwire::rpc::transport::detail

#include "transport/stream_connection.h"

#include <sys/epoll.h>

#include <tensorpipe/transport/error.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

// Reading and writing a connection's frames (stream_connection.h).
namespace gradwire::rpc::transport::detail {

void ConnImpl::read(Connection::read_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::kUnsized;
  op.rfn = std::move(fn);
  submit_read(std::move(op));
}

void ConnImpl::read(void* ptr, size_t length, Connection::read_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::kSized;
  op.ptr = static_cast<char*>(ptr);
  op.expected = length;
  op.rfn = std::move(fn);
  submit_read(std::move(op));
}

void ConnImpl::read(tp::AbstractNopHolder& object, Connection::read_nop_callback_fn fn) {
  ReadOp op;
  op.kind = ReadOp::kNop;
  op.nop = &object;
  op.nfn = std::move(fn);
  submit_read(std::move(op));
}

void ConnImpl::write(const void* ptr, size_t length, Connection::write_callback_fn fn) {
  WriteOp op;
  op.header = length;
  op.ptr = static_cast<const char*>(ptr);
  op.length = length;
  op.fn = std::move(fn);
  if (!try_direct(op)) submit_write(std::move(op));
}

void ConnImpl::write(const tp::AbstractNopHolder& object, Connection::write_callback_fn fn) {
  // Encoded now, on the caller's thread: the object need not outlive this call.
  if (writes_observed_.load(std::memory_order_relaxed) < kObservedFrames &&
      writes_observed_.fetch_add(1, std::memory_order_relaxed) < kObservedFrames) {
    observe_written(object);
  }
  WriteOp op;
  op.length = object.getSize();
  op.header = op.length;
  op.owned.reset(new char[op.length == 0 ? 1 : op.length]);
  tp::NopWriter writer(reinterpret_cast<uint8_t*>(op.owned.get()), op.length);
  nop::Status<void> status = object.write(writer);
  if (status.has_error()) {
    // Our own encoder failing is a bug; report it on the callback, not by throwing.
    fn(make_error(std::string("encoding a TensorPipe control frame failed: ") +
                  status.GetErrorMessage()));
    return;
  }
  op.ptr = op.owned.get();
  op.fn = std::move(fn);
  if (!try_direct(op)) submit_write(std::move(op));
}

void ConnImpl::close() {
  auto self = shared_from_this();
  core_->run_on_loop([self] { self->fail(closed_error()); });
}

void ConnImpl::submit_read(ReadOp op) {
  auto self = shared_from_this();
  auto holder = std::make_shared<ReadOp>(std::move(op));
  if (!core_->run_on_loop([self, holder] { self->start_read(std::move(*holder)); })) {
    fail_op(*holder, tp::Error(std::make_shared<tp::transport::ContextClosedError>(),
                               "gradwire transport", 0));
  }
}

void ConnImpl::submit_write(WriteOp op) {
  auto self = shared_from_this();
  auto holder = std::make_shared<WriteOp>(std::move(op));
  {
    MutexLock lock(write_mutex_);
    ++submitted_;
  }
  if (!core_->run_on_loop([self, holder] { self->start_write(std::move(*holder)); })) {
    {
      MutexLock lock(write_mutex_);
      --submitted_;
    }
    holder->fn(
        tp::Error(std::make_shared<tp::transport::ContextClosedError>(), "gradwire transport", 0));
  }
}

bool ConnImpl::try_direct(WriteOp& op) {
  bool queued = false;
  {
    MutexLock lock(write_mutex_);
    if (direct_fd_ < 0 || submitted_ > 0 || !writes_.empty()) return false;
    iovec iov[2] = {{&op.header, sizeof(op.header)}, {const_cast<char*>(op.ptr), op.length}};
    const ssize_t n = write_some_locked(direct_fd_, iov, op.length > 0 ? 2 : 1);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;  // the loop reports it
    const size_t sent = n < 0 ? 0 : static_cast<size_t>(n);
    if (sent < sizeof(op.header) + op.length) {
      op.done = sent;
      writes_.push_back(std::move(op));
      queued = true;
    }
  }
  if (queued) {
    auto self = shared_from_this();
    core_->run_on_loop([self] { self->pump_writes(); });
    return true;
  }
  op.fn(tp::Error::kSuccess);
  return true;
}

void ConnImpl::fail_op(ReadOp& op, const tp::Error& error) {
  if (op.kind == ReadOp::kNop) {
    op.nfn(error);
  } else if (op.rfn) {
    op.rfn(error, nullptr, 0);
  }
}

void ConnImpl::start_read(ReadOp op) {
  // TensorPipe's first read of an accepted connection is its hello, already here whole.
  if (prefetched_) {
    std::string frame = std::move(*prefetched_);
    prefetched_.reset();
    deliver_prefetched(std::move(op), frame);
    return;
  }
  if (state_ == State::kClosed) {
    fail_op(op, error_);
    return;
  }
  reads_.push_back(std::move(op));
  if (state_ == State::kOpen) {
    pump_reads();
  }
}

void ConnImpl::start_write(WriteOp op) {
  {
    MutexLock lock(write_mutex_);
    --submitted_;
    if (state_ != State::kClosed) writes_.push_back(std::move(op));
  }
  if (state_ == State::kClosed) {
    op.fn(error_);
    return;
  }
  if (state_ == State::kOpen) pump_writes();
}

void ConnImpl::on_events(uint32_t ev) {
  if (state_ == State::kClosed) return;
  if (state_ == State::kConnecting) {
    if ((ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      fail(make_error("connecting to " + peer_ + " failed: " + errno_text(err)));
      return;
    }
    // Whoever listens under a local name: the same user only (a name is anyone's to take).
    if (const std::string why = core_->check_peer_user(fd_); !why.empty()) {
      refuse_or_fail(why);
      return;
    }
    state_ = State::kHandshake;
    send_handshake_output();
    if (state_ == State::kClosed) return;
  }
  if (ring_mode_) {
    // The socket carries wake-ups only; its end tells us the peer has gone.
    if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0 && drain_wake_socket()) {
      return;
    }
    pump_reads();
    if (state_ == State::kClosed) return;
    pump_writes();
    if (state_ != State::kClosed) update_interest();
    return;
  }
  if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) pump_reads();
  if (state_ == State::kClosed) return;
  if ((ev & EPOLLOUT) != 0) pump_writes();
  if (state_ != State::kClosed) update_interest();
}

void ConnImpl::consume_staging() {
  while (staged() > 0 && state_ != State::kClosed) {
    if (state_ == State::kHandshake) {
      const size_t used = handshake_.feed(
          reinterpret_cast<const uint8_t*>(staging_.get() + staged_begin_), staged());
      staged_begin_ += used;
      if (handshake_.has_output()) send_handshake_output();
      if (state_ == State::kClosed) return;
      if (handshake_.state() == Handshake::State::kFailed) {
        refuse_or_fail(handshake_.error());
        return;
      }
      if (handshake_.state() == Handshake::State::kDone) {
        on_handshake_done();
        continue;
      }
      return;  // needs more bytes
    }
    if (state_ == State::kRingSetup) {
      const size_t take = std::min(kRingSetupBytes - setup_.size(), staged());
      setup_.append(staging_.get() + staged_begin_, take);
      staged_begin_ += take;
      if (setup_.size() < kRingSetupBytes) return;
      if (!attach_rings()) return;
      begin_prefetch();
      return;
    }
    if (state_ != State::kOpen && state_ != State::kPrefetch) return;
    if (reads_.empty()) return;
    ReadOp& op = reads_.front();
    if (op.header_got < sizeof(op.header)) {
      const size_t take = std::min(sizeof(op.header) - op.header_got, staged());
      std::memcpy(op.header + op.header_got, staging_.get() + staged_begin_, take);
      op.header_got += take;
      staged_begin_ += take;
      if (op.header_got < sizeof(op.header)) return;
      if (!begin_payload(op)) return;
    }
    if (op.got < op.length) {
      const size_t take = std::min<size_t>(op.length - op.got, staged());
      std::memcpy(op.dest + op.got, staging_.get() + staged_begin_, take);
      op.got += take;
      staged_begin_ += take;
    }
    if (op.got == op.length) complete_front();
  }
}

bool ConnImpl::begin_payload(ReadOp& op) {
  std::memcpy(&op.length, op.header, sizeof(op.length));
  if (op.kind == ReadOp::kSized) {
    if (op.length != op.expected) {
      bad_frame("the peer sent a frame of " + std::to_string(op.length) + " bytes where one of " +
                std::to_string(op.expected) + " was expected");
      return false;
    }
    op.dest = op.ptr;
    return true;
  }
  const size_t limit =
      op.kind == ReadOp::kPrefetch ? kMaxHelloFrameBytes : core_->options.max_frame_bytes;
  if (op.length > limit) {
    bad_frame("the peer sent a frame of " + std::to_string(op.length) +
              " bytes, over the limit of " + std::to_string(limit));
    return false;
  }
  op.owned.reset(new char[op.length == 0 ? 1 : op.length]);
  op.dest = op.owned.get();
  return true;
}

void ConnImpl::bad_frame(const std::string& why) {
  if (state_ == State::kPrefetch) {
    refuse_or_fail(why);
    return;
  }
  core_->options.stats->bad_frames.fetch_add(1, std::memory_order_relaxed);
  fail(make_error("connection with " + peer_ + " closed: " + why));
}

void ConnImpl::complete_front() {
  ReadOp op = std::move(reads_.front());
  reads_.pop_front();
  switch (op.kind) {
    case ReadOp::kSized:
      op.rfn(tp::Error::kSuccess, op.ptr, op.length);
      return;
    case ReadOp::kUnsized:
      op.rfn(tp::Error::kSuccess, op.dest, op.length);
      return;
    case ReadOp::kNop: {
      std::string why = decode_nop(*op.nop, op.dest, op.length, core_->options.max_frame_values);
      if (why.empty() && reads_observed_ < kObservedFrames) {
        ++reads_observed_;
        why = observe_read(*op.nop);
      }
      if (!why.empty()) {
        const tp::Error error =
            make_error("connection with " + peer_ +
                       " closed: a TensorPipe control frame does not decode (" + why + ")");
        core_->options.stats->bad_frames.fetch_add(1, std::memory_order_relaxed);
        op.nfn(error);
        fail(error);
        return;
      }
      op.nfn(tp::Error::kSuccess);
      return;
    }
    case ReadOp::kPrefetch: {
      if (const std::string why = check_first_frame(op.dest, op.length); !why.empty()) {
        refuse_or_fail(why);
        return;
      }
      prefetched_ = std::string(op.dest, op.length);
      begin_verify();
      return;
    }
  }
}

void ConnImpl::pump_reads() {
  for (;;) {
    consume_staging();
    if (state_ == State::kClosed) return;
    if (staged() == 0) staged_begin_ = staged_end_ = 0;
    char* into = nullptr;
    size_t room = 0;
    bool direct = false;
    const bool reading = state_ == State::kOpen || state_ == State::kPrefetch;
    if (reading && !reads_.empty() && staged() == 0) {
      ReadOp& op = reads_.front();
      if (op.header_got == sizeof(op.header) && op.length - op.got >= kDirectReadBytes) {
        into = op.dest + op.got;
        room = op.length - op.got;
        direct = true;
      }
    }
    if (!direct) {
      if (staged_end_ == kStagingBytes && staged_begin_ > 0) {
        std::memmove(staging_.get(), staging_.get() + staged_begin_, staged());
        staged_end_ -= staged_begin_;
        staged_begin_ = 0;
      }
      if (staged_end_ == kStagingBytes) {
        // Full and nobody reading: stop reading until a read is posted.
        reading_paused_ = true;
        update_interest();
        return;
      }
      into = staging_.get() + staged_end_;
      room = kStagingBytes - staged_end_;
    }
    const ssize_t n = read_some(into, room);
    if (fd_abuse_) {
      refuse_or_fail("it passed file descriptors where none, or one ring segment, belong");
      return;
    }
    if (n < 0 && ring_corrupt_.load(std::memory_order_relaxed)) {
      bad_frame("the peer corrupted the positions of the shared-memory ring");
      return;
    }
    if (n > 0) {
      if (direct) {
        ReadOp& op = reads_.front();
        op.got += static_cast<size_t>(n);
        if (op.got == op.length) complete_front();
      } else {
        staged_end_ += static_cast<size_t>(n);
      }
      continue;
    }
    if (n == 0) {
      if (opening()) {
        refuse_or_fail("the peer closed the connection during the handshake");
      } else {
        fail(make_error("the connection with " + peer_ + " was closed by the peer"));
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    const int err = errno;
    if (opening()) {
      refuse_or_fail("reading failed: " + errno_text(err));
    } else {
      fail(make_error("connection with " + peer_ + " lost: " + errno_text(err)));
    }
    return;
  }
  reading_paused_ = false;
  update_interest();
}

void ConnImpl::pump_writes() {
  while (!handshake_out_.empty()) {
    const ssize_t n = pending_fd_ >= 0
                          ? send_with_segment()
                          : ::send(fd_, handshake_out_.data(), handshake_out_.size(), MSG_NOSIGNAL);
    if (n > 0) {
      handshake_out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      update_interest();
      return;
    }
    refuse_or_fail("writing the handshake failed: " + errno_text(errno));
    return;
  }
  if (state_ != State::kOpen) {
    update_interest();
    return;
  }
  std::vector<Connection::write_callback_fn> done;
  int lost = 0;
  {
    MutexLock lock(write_mutex_);
    lost = send_queued_locked(done);
  }
  if (lost != 0) {
    for (auto& fn : done)
      fn(tp::Error::kSuccess);
    if (ring_corrupt_.load(std::memory_order_relaxed)) {
      bad_frame("the peer corrupted the positions of the shared-memory ring");
    } else {
      fail(make_error("connection with " + peer_ + " lost: " + errno_text(lost)));
    }
    return;
  }
  update_interest();
  for (auto& fn : done)
    fn(tp::Error::kSuccess);
}

int ConnImpl::send_queued_locked(std::vector<Connection::write_callback_fn>& done) {
  while (!writes_.empty()) {
    iovec iov[kMaxIov];
    int count = 0;
    for (auto it = writes_.begin(); it != writes_.end() && count + 2 <= kMaxIov; ++it) {
      if (it->done < sizeof(it->header)) {
        iov[count++] = {reinterpret_cast<char*>(&it->header) + it->done,
                        sizeof(it->header) - it->done};
        if (it->length > 0) iov[count++] = {const_cast<char*>(it->ptr), it->length};
      } else {
        const size_t off = it->done - sizeof(it->header);
        iov[count++] = {const_cast<char*>(it->ptr) + off, it->length - off};
      }
    }
    const ssize_t n = write_some_locked(fd_, iov, count);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return errno;
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      WriteOp& op = writes_.front();
      const size_t need = sizeof(op.header) + op.length - op.done;
      const size_t take = std::min(need, left);
      op.done += take;
      left -= take;
      if (op.done == sizeof(op.header) + op.length) {
        done.push_back(std::move(op.fn));
        writes_.pop_front();
      }
    }
    // A zero-length frame is complete once its header is out.
    while (!writes_.empty() &&
           writes_.front().done == sizeof(writes_.front().header) + writes_.front().length) {
      done.push_back(std::move(writes_.front().fn));
      writes_.pop_front();
    }
  }
  return 0;
}

void ConnImpl::update_interest() {
  if (state_ == State::kClosed) return;
  uint32_t want = 0;
  if (!reading_paused_ || ring_mode_) want |= EPOLLIN;
  bool queued = false;
  {
    MutexLock lock(write_mutex_);
    queued = !writes_.empty();
  }
  if (state_ == State::kConnecting || !handshake_out_.empty() ||
      (state_ == State::kOpen && queued && !ring_mode_)) {
    want |= EPOLLOUT;
  }
  if (want != events_) {
    events_ = want;
    core_->reactor.modify(fd_, events_);
  }
}

ssize_t ConnImpl::read_some(char* into, size_t room) {
  if (ring_mode_) {
    bool corrupt = false;
    const size_t n = in_.read(into, room, &corrupt);
    if (corrupt) {
      ring_corrupt_.store(true, std::memory_order_relaxed);
      errno = EPROTO;
      return -1;
    }
    if (n == 0) {
      errno = EAGAIN;
      return -1;
    }
    if (in_.producer_wants_wake()) send_wake(fd_);
    return static_cast<ssize_t>(n);
  }
  // A "local" server may receive its ring segment's descriptor (only) before the rings are
  // set up; anything else passed is refused.
  const bool may_pass_fd = core_->options.family == StreamOptions::Family::kLocal &&
                           role_ == Role::kServer &&
                           (state_ == State::kHandshake || state_ == State::kRingSetup);
  for (;;) {
    ssize_t n = -1;
    if (may_pass_fd) {
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      iovec iov{into, room};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
      if (n >= 0) take_descriptors(msg);
    } else {
      n = ::recv(fd_, into, room, 0);
    }
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

ssize_t ConnImpl::write_some_locked(int fd, const iovec* iov, int count) {
  if (ring_writing_) {
    for (;;) {
      bool corrupt = false;
      const size_t n = out_.write(iov, count, &corrupt);
      if (!corrupt && n > 0) {
        want_space_.store(false, std::memory_order_relaxed);
        if (out_.consumer_wants_wake()) send_wake(fd);
        return static_cast<ssize_t>(n);
      }
      if (!corrupt && out_.wait_for_space(&corrupt)) continue;
      if (corrupt) {
        ring_corrupt_.store(true, std::memory_order_relaxed);
        errno = EPROTO;
        return -1;
      }
      want_space_.store(true, std::memory_order_relaxed);
      errno = EAGAIN;
      return -1;
    }
  }
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

}  // namespace gradwire::rpc::transport::detail

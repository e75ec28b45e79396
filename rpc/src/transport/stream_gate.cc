#include "transport/stream_connection.h"

#include <sys/epoll.h>

#include <tensorpipe/channel/mpt/nop_types.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/error.h>

#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"

// The handshake gate of a connection (stream_connection.h).
namespace gradwire::rpc::transport::detail {

void ConnImpl::start(bool connecting, int connect_error, ReadyFn on_ready,
                     const std::string& bad_address) {
  on_ready_ = std::move(on_ready);
  if (trace::enabled()) trace_start_ns_ = trace::now_ns();
  if (core_->closed) {
    fail(tp::Error(std::make_shared<tp::transport::ContextClosedError>(), "gradwire transport", 0));
    return;
  }
  core_->conns.insert(shared_from_this());
  if (!bad_address.empty()) {
    fail(make_error("cannot connect to " + peer_ + ": " + bad_address));
    return;
  }
  if (connect_error != 0 || fd_ < 0) {
    fail(make_error("connecting to " + peer_ + " failed: " + errno_text(connect_error)));
    return;
  }
  std::weak_ptr<ConnImpl> weak = weak_from_this();
  state_ = connecting ? State::kConnecting : State::kHandshake;
  events_ = EPOLLIN | EPOLLOUT;
  core_->reactor.add(fd_, events_, [weak](uint32_t ev) {
    if (auto self = weak.lock()) self->on_events(ev);
  });
  deadline_ =
      core_->reactor.add_timer(Reactor::Clock::now() + core_->options.handshake_timeout, [weak] {
        if (auto self = weak.lock()) self->on_deadline();
      });
  if (!connecting) send_handshake_output();
}

void ConnImpl::deliver_prefetched(ReadOp op, const std::string& frame) {
  if (op.kind == ReadOp::kSized) {
    if (op.expected != frame.size()) {
      fail_op(op, make_error("frame size mismatch on the first frame"));
      return;
    }
    std::memcpy(op.ptr, frame.data(), frame.size());
    op.rfn(tp::Error::kSuccess, op.ptr, frame.size());
    return;
  }
  if (op.kind == ReadOp::kNop) {
    const std::string why =
        decode_nop(*op.nop, frame.data(), frame.size(), core_->options.max_frame_values);
    op.nfn(why.empty() ? tp::Error() : make_error("the first frame does not decode: " + why));
    return;
  }
  op.rfn(tp::Error::kSuccess, frame.data(), frame.size());
}

void ConnImpl::on_deadline() {
  deadline_ = 0;
  if (state_ == State::kOpen || state_ == State::kClosed) return;
  refuse_or_fail("did not complete the handshake within " +
                 std::to_string(core_->options.handshake_timeout.count()) + " ms");
}

void ConnImpl::refuse_or_fail(const std::string& why) {
  if (role_ == Role::kServer) {
    const PeerIdentity& claim = handshake_.peer();
    core_->note_refused(claim.name.empty() ? peer_
                                           : peer_ + " (claiming worker '" + printable(claim.name) +
                                                 "', rank " + std::to_string(claim.rank) + ")",
                        why);
    fail(make_error("refused: " + why));
  } else {
    fail(make_error("connection to " + peer_ + ": " + why));
  }
}

void ConnImpl::send_handshake_output() {
  if (handshake_.has_output()) handshake_out_ += handshake_.take_output();
  pump_writes();
}

void ConnImpl::on_handshake_done() {
  if (trace_start_ns_ != 0) trace_handshake_ns_ = trace::now_ns();
  const bool rings = core_->options.family == StreamOptions::Family::kLocal;
  if (role_ == Role::kClient) {
    if (rings) {
      std::string error;
      segment_ = RingSegment::create(core_->options.ring_bytes, &error);
      if (segment_ == nullptr) {
        fail(
            make_error("connection to " + peer_ + ": cannot set up shared-memory rings: " + error));
        return;
      }
      handshake_out_ += segment_->setup_message();
      pending_fd_ = segment_->release_fd();
      enter_ring_mode(/*read_ring=*/1, /*write_ring=*/0);
      send_handshake_output();
      if (state_ == State::kClosed) return;
    }
    finish_opening();
    return;
  }
  if (rings) {
    state_ = State::kRingSetup;
    return;
  }
  begin_prefetch();
}

void ConnImpl::begin_prefetch() {
  state_ = State::kPrefetch;
  ReadOp op;
  op.kind = ReadOp::kPrefetch;
  reads_.push_front(std::move(op));
}

void ConnImpl::trace_setup(const char* outcome) {
  if (trace_start_ns_ == 0) return;
  const int64_t start = trace_start_ns_;
  trace_start_ns_ = 0;
  const char* family = core_->options.family == StreamOptions::Family::kLocal  ? "local"
                       : core_->options.family == StreamOptions::Family::kUnix ? "unix"
                                                                               : "tcp";
  // The client names the address it dialled; the server, the worker the peer claimed in its
  // handshake (its address when it claimed none).
  const PeerIdentity& claim = handshake_.peer();
  const trace::Text peer{"peer",
                         role_ == Role::kServer && !claim.name.empty() ? claim.name : peer_};
  const int64_t handshake_us = trace_handshake_ns_ == 0 ? -1 : (trace_handshake_ns_ - start) / 1000;
  trace::complete(role_ == Role::kClient ? "rpc.connect" : "rpc.accept", "rpc", start,
                  trace::now_ns(),
                  {trace::Arg("transport", family), trace::Arg("outcome", outcome),
                   trace::Arg("handshake_us", handshake_us),
                   trace::Arg("secret", core_->options.secret.empty() ? 0 : 1)},
                  &peer);
}

void ConnImpl::finish_opening() {
  state_ = State::kOpen;
  trace_setup("open");
  {
    MutexLock lock(write_mutex_);
    direct_fd_ = fd_;
    ring_writing_ = ring_mode_;
  }
  if (deadline_ != 0) {
    core_->reactor.cancel_timer(deadline_);
    deadline_ = 0;
  }
  if (role_ == Role::kServer) {
    core_->options.stats->accepted.fetch_add(1, std::memory_order_relaxed);
    if (process_) core_->options.book->admitted(serial_, claim_, *process_);
    if (on_ready_) {
      ReadyFn ready = std::move(on_ready_);
      on_ready_ = nullptr;
      ready(shared_from_this(), true);
    }
  }
  pump_writes();
}

std::string ConnImpl::check_first_frame(const char* data, size_t size) {
  claim_ = handshake_.peer();
  if (core_->options.first_frame == StreamOptions::FirstFrame::kMptLaneHello) {
    // The mpt channel dereferences the ClientHello it expects without checking for it.
    tp::NopHolder<tp::channel::mpt::Packet> hello;
    if (!decode_nop(hello, data, size, kMaxHelloValues).empty() ||
        !hello.getObject().is<tp::channel::mpt::ClientHello>()) {
      return "its first frame is not an mpt lane hello";
    }
    // A lane of an existing mpt channel: only the peer of that channel's pipe may open it.
    return core_->options.book->take(
        listener_address_, hello.getObject().get<tp::channel::mpt::ClientHello>()->registrationId,
        handshake_.peer());
  }
  tp::NopHolder<tp::Packet> hello;
  if (!decode_nop(hello, data, size, kMaxHelloValues).empty()) {
    return "its first frame is not a TensorPipe hello";
  }
  if (hello.getObject().is<tp::RequestedConnection>()) {
    // A connection of an existing pipe: only the peer that pipe was opened with may make it.
    return core_->options.book->take(
        PeerBook::kPipeListener, hello.getObject().get<tp::RequestedConnection>()->registrationId,
        handshake_.peer());
  }
  if (!hello.getObject().is<tp::SpontaneousConnection>()) {
    return "its first frame is not a TensorPipe hello";
  }
  // The pipe TensorPipe opens for it is known by this name: it must be the one the
  // handshake claimed (and verify_peer admits), or a peer could speak for another. A
  // handshake that claimed nobody leaves the hello's name to verify_peer, with no rank.
  const std::string& named = hello.getObject().get<tp::SpontaneousConnection>()->contextName;
  if (claim_.name.empty()) claim_.name = named;
  if (named == claim_.name) return "";
  return "its TensorPipe hello names worker '" + printable(named) +
         "', but its handshake claimed '" + printable(claim_.name) + "'";
}

void ConnImpl::begin_verify() {
  if (!core_->options.verify_peer) {
    finish_opening();
    return;
  }
  state_ = State::kVerifying;
  std::weak_ptr<ConnImpl> weak = weak_from_this();
  std::shared_ptr<Core> core = core_;
  core_->options.verify_peer(claim_, [weak, core](std::string why) {
    core->run_on_loop([weak, why = std::move(why)] {
      auto self = weak.lock();
      if (self == nullptr || self->state_ != State::kVerifying) return;
      if (!why.empty()) {
        self->refuse_or_fail(why);
        return;
      }
      self->finish_opening();
    });
  });
}

void ConnImpl::fail(tp::Error error) {
  if (state_ == State::kClosed) return;
  core_->options.book->forget(serial_);
  if (state_ != State::kOpen) trace_setup(role_ == Role::kServer ? "refused" : "failed");
  state_ = State::kClosed;
  error_ = error;
  if (deadline_ != 0) {
    core_->reactor.cancel_timer(deadline_);
    deadline_ = 0;
  }
  std::deque<WriteOp> writes;
  {
    // No caller's thread writes to the descriptor once this returns.
    MutexLock lock(write_mutex_);
    direct_fd_ = -1;
    ring_writing_ = false;
    writes.swap(writes_);
  }
  if (poller_ != 0) {
    core_->reactor.remove_poller(poller_);
    poller_ = 0;
  }
  ring_mode_ = false;
  if (fd_ >= 0) {
    core_->reactor.remove(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  auto self = shared_from_this();
  core_->conns.erase(self);
  std::deque<ReadOp> reads;
  reads.swap(reads_);
  if (on_ready_) {
    ReadyFn ready = std::move(on_ready_);
    on_ready_ = nullptr;
    ready(self, false);
  }
  for (auto& op : reads) {
    if (op.kind != ReadOp::kPrefetch) fail_op(op, error);
  }
  for (auto& op : writes)
    op.fn(error);
}

uint64_t ConnImpl::next_serial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::optional<PeerProcess> ConnImpl::peer_process_of(StreamOptions::Family family, int fd) {
  if (!unix_socket(family) || fd < 0) return std::nullopt;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) {
    return std::nullopt;
  }
  return PeerProcess{cred.pid, cred.uid};
}

namespace {

std::vector<uint64_t> registration_ids(const tp::BrochureAnswer& answer) {
  std::vector<uint64_t> ids;
  for (const auto& [connection, id] : answer.transportRegistrationIds)
    ids.push_back(id);
  for (const auto& [channel, list] : answer.channelRegistrationIds)
    ids.insert(ids.end(), list.begin(), list.end());
  return ids;
}

}  // namespace

void ConnImpl::observe_written(const tp::AbstractNopHolder& object) {
  PeerBook& book = *core_->options.book;
  if (role_ == Role::kServer) {
    if (const auto* answer = dynamic_cast<const tp::NopHolder<tp::BrochureAnswer>*>(&object)) {
      book.offer(PeerBook::kPipeListener, registration_ids(answer->getObject()), handshake_.peer());
    } else if (const auto* packet =
                   dynamic_cast<const tp::NopHolder<tp::channel::mpt::Packet>*>(&object)) {
      if (packet->getObject().is<tp::channel::mpt::ServerHello>()) {
        for (const auto& lane :
             packet->getObject().get<tp::channel::mpt::ServerHello>()->laneAdvertisements)
          book.offer(lane.address, {lane.registrationId}, handshake_.peer());
      }
    }
    return;
  }
  if (!process_) return;
  if (const auto* packet = dynamic_cast<const tp::NopHolder<tp::Packet>*>(&object)) {
    if (packet->getObject().is<tp::RequestedConnection>()) {
      book.reached(serial_, peer_,
                   packet->getObject().get<tp::RequestedConnection>()->registrationId, *process_);
    }
  }
}

std::string ConnImpl::observe_read(tp::AbstractNopHolder& object) {
  if (role_ == Role::kServer) {
    if (auto* brochure = dynamic_cast<tp::NopHolder<tp::Brochure>*>(&object)) {
      if (core_->options.check_brochure) {
        if (std::string why = core_->options.check_brochure(brochure->getObject()); !why.empty()) {
          return "its Brochure is refused: " + why;
        }
      }
    }
    return "";
  }
  if (auto* answer = dynamic_cast<tp::NopHolder<tp::BrochureAnswer>*>(&object)) {
    if (core_->options.check_answer) {
      if (std::string why = core_->options.check_answer(answer->getObject()); !why.empty()) {
        return "its BrochureAnswer is refused: " + why;
      }
    }
    core_->options.book->expect(peer_, answer->getObject().address,
                                registration_ids(answer->getObject()));
    return "";
  }
  if (auto* packet = dynamic_cast<tp::NopHolder<tp::channel::mpt::Packet>*>(&object)) {
    const auto& p = packet->getObject();
    if (!p.is<tp::channel::mpt::ServerHello>()) {
      return "the mpt channel's peer sent something else than its ServerHello";
    }
    const size_t lanes = p.get<tp::channel::mpt::ServerHello>()->laneAdvertisements.size();
    if (core_->options.mpt_lanes != 0 && lanes != core_->options.mpt_lanes) {
      return "the mpt channel's peer advertises " + std::to_string(lanes) + " lanes where " +
             std::to_string(core_->options.mpt_lanes) + " were agreed";
    }
  }
  return "";
}

}  // namespace gradwire::rpc::transport::detail

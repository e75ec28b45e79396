// The TensorPipe agent: connections to and from peers, their loss, and peers that rejoin.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "text.h"

namespace gradwire::rpc::detail {

void TensorPipeAgent::refuse_locked(const std::string& what) const {
  if (failure_) std::rethrow_exception(failure_);
  if (state_ == State::kStarting) {
    throw Error("rpc agent " + self_.describe() + " has not been started; cannot " + what);
  }
  throw Error("rpc agent " + self_.describe() + " is shut down; cannot " + what);
}

std::shared_ptr<TensorPipeAgent::Connection> TensorPipeAgent::connection_to(
    const WorkerInfo& target, const Request& request) {
  std::atomic<std::shared_ptr<Connection>>& slot = clients_[static_cast<size_t>(target.id)];
  // The common case takes no lock: a running agent with a connection to the peer.
  if (running_.load(std::memory_order_acquire)) {
    if (std::shared_ptr<Connection> conn = slot.load(std::memory_order_acquire)) return conn;
  }
  uint64_t serial = 0;
  {
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      refuse_locked("send " + describe_call(request.handler, request.function) + " to worker " +
                    target.describe());
    }
    if (std::shared_ptr<Connection> conn = slot.load(std::memory_order_acquire)) return conn;
    serial = next_serial_++;
  }
  // connect() is called with no lock held: TensorPipe may run other connections' callbacks
  // on this thread meanwhile, and those take mutex_ (holding it here would deadlock a
  // worker whose first sends to several peers meet their first messages). The pipe is set before
  // any other sender can see the connection; a sender that lost the race uses the winner's.
  auto made = std::make_shared<Connection>();
  made->serial = serial;
  made->peer = target;
  made->outgoing = true;
  // A peer lost earlier may be back at another address.
  if (lost_peers_[static_cast<size_t>(target.id)].load(std::memory_order_acquire))
    check_rejoined(target.id);
  {
    const SendingMark sending;
    const std::string url = group_.url(target.id);
    made->dialed = url.substr(url.find("://") == std::string::npos ? 0 : url.find("://") + 3);
    made->pipe = context_->connect(url, tp::PipeOptions().remoteName(target.name));
  }
  std::shared_ptr<Connection> existing;
  if (!slot.compare_exchange_strong(existing, made, std::memory_order_acq_rel)) {
    // The losing pipe is kept open until the context closes: closing it now can reach the
    // peer before its listener has read the pipe's first packet, and TensorPipe's listener
    // takes such an error as its own and stops accepting for good.
    MutexLock lock(mutex_);
    spare_pipes_.push_back(std::move(made->pipe));
    return existing;
  }
  bool closing = false;
  {
    // A close that began meanwhile has cleared the slots already or is about to.
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      std::shared_ptr<Connection> mine = made;
      slot.compare_exchange_strong(mine, nullptr);
      closing = true;
    }
  }
  if (closing) {
    close_pipe(made->pipe);  // outside mutex_
    MutexLock lock(mutex_);
    refuse_locked("send " + describe_call(request.handler, request.function) + " to worker " +
                  target.describe());
  }
  read_next(made);
  return made;
}

void TensorPipeAgent::accept_next() {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  listener_->accept([weak](const tp::Error& error, std::shared_ptr<tp::Pipe> pipe) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      if (!self->is_shut_down()) {
        GRADWIRE_LOG(kWarning) << "rpc worker " << self->self_.describe()
                               << " stopped accepting connections: " << error.what();
      }
      return;
    }
    auto conn = std::make_shared<Connection>();
    conn->pipe = std::move(pipe);
    const std::string& remote = conn->pipe->getRemoteName();
    const int id = self->group_.id_of(remote);
    conn->peer = id < 0 ? WorkerInfo{printable(remote), -1} : self->group_.worker(id);
    // Told before any of the new process's messages is read.
    if (id >= 0 && self->lost_peers_[static_cast<size_t>(id)].load(std::memory_order_acquire))
      self->check_rejoined(id);
    {
      MutexLock lock(self->mutex_);
      if (self->state_ == State::kClosed) return;
      conn->serial = self->next_serial_++;
      self->servers_.emplace(conn->serial, conn);
    }
    self->read_next(conn);
    self->accept_next();
  });
}

void TensorPipeAgent::close_pipe(const std::shared_ptr<tp::Pipe>& pipe) {
  const SendingMark entering;
  pipe->close();
}

void TensorPipeAgent::on_connection_error(const std::shared_ptr<Connection>& conn,
                                          const std::string& error) {
  const std::string what =
      conn->cut.load(std::memory_order_acquire) ? "cut by a fault rule" : error;
  // Loans made over this connection end with it: no release can come back on it.
  if (loans_) loans_->release_connection(conn->serial);
  bool closing = false;
  {
    MutexLock lock(mutex_);
    closing = state_ != State::kRunning;
    if (conn->outgoing) {
      // Only this connection's slot: a newer connection to the peer stays.
      std::shared_ptr<Connection> expected = conn;
      clients_[static_cast<size_t>(conn->peer.id)].compare_exchange_strong(expected, nullptr);
    } else {
      servers_.erase(conn->serial);
    }
  }
  // In a graceful shutdown's last phase, peers close their connections as they leave; so
  // does a worker that left an elastic group.
  closing = closing || departing_.load(std::memory_order_acquire);
  const bool left = group_.presence(conn->peer.id) == Presence::kLeft;
  const std::string why = left ? "it left the group" : what;
  std::vector<PendingCall> lost;
  if (conn->outgoing) lost = calls_.take_connection(conn->serial);
  if (!closing && !left && conn->outgoing) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": connection to "
                        << conn->peer.describe() << " lost: " << what;
  }
  // A peer of the group that went away while this agent runs: the modules above release
  // what it held (a connection from outside the group has id -1). They are told once per
  // loss, whichever of its connections goes first, until a replacement rejoins.
  if (!closing && !left && conn->peer.id >= 0 && conn->peer.id < group_.slots() &&
      conn->peer.id != self_.id &&
      !lost_peers_[static_cast<size_t>(conn->peer.id)].exchange(true, std::memory_order_acq_rel)) {
    group_.apply(conn->peer.id, PresenceEvent::kLose);
    notify_worker_lost(conn->peer, what);
    // In an elastic group a lost worker stops counting in the shutdown barriers; the store
    // is written on the pool, off this transport thread.
    if (group_.elastic()) {
      try {
        pool_->execute([weak = weak_from_this(), id = conn->peer.id] {
          if (auto self = weak.lock()) self->group_.mark_lost(id);
        });
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " could not mark "
                            << conn->peer.describe() << " lost in the store: " << e.what();
      }
    }
  }
  for (PendingCall& call : lost) {
    calls_.finish(call, Value(),
                  std::make_exception_ptr(
                      NetworkError("rpc: " + call.what() + " to worker " + call.to.describe() +
                                   " failed: the connection to it was lost (" + why + ")")),
                  CallOutcome::kConnectionLost);
  }
}

void TensorPipeAgent::check_rejoined(int id) {
  const int incarnation =
      group_.refresh(id, std::min(options_.rpc_timeout, std::chrono::milliseconds(5'000)));
  std::atomic<int>& told = rejoined_[static_cast<size_t>(id)];
  int before = told.load(std::memory_order_acquire);
  while (incarnation > before) {
    if (told.compare_exchange_weak(before, incarnation, std::memory_order_acq_rel)) {
      lost_peers_[static_cast<size_t>(id)].store(false, std::memory_order_release);
      group_.apply(id, PresenceEvent::kRejoin);
      GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": worker "
                          << group_.worker(id).describe() << " rejoined as incarnation "
                          << incarnation;
      notify_worker_rejoined(group_.worker(id), incarnation);
      return;
    }
  }
}

}  // namespace gradwire::rpc::detail

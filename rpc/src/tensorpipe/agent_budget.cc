// The TensorPipe agent: the in-flight budget (AgentOptions::max_inflight_bytes*,
// max_queued_requests*) that received messages hold until they are done with.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/core/logging.h"
#include "text.h"

namespace gradwire::rpc::detail {

std::string TensorPipeAgent::reserve_inflight(Connection& conn, const Held& held) {
  MutexLock lock(mutex_);
  const auto past = [](const char* name, size_t limit, size_t now, size_t more, const char* unit) {
    return std::string(name) + " (" + std::to_string(limit) + unit +
           ") would be passed: " + std::to_string(now) + unit + " held, " + std::to_string(more) +
           unit + " more";
  };
  if (conn.inflight_bytes + held.bytes > options_.max_inflight_bytes_per_peer) {
    return past("max_inflight_bytes_per_peer", options_.max_inflight_bytes_per_peer,
                conn.inflight_bytes, held.bytes, " bytes");
  }
  if (inflight_bytes_ + held.bytes > options_.max_inflight_bytes) {
    return past("max_inflight_bytes", options_.max_inflight_bytes, inflight_bytes_, held.bytes,
                " bytes");
  }
  if (held.request) {
    if (conn.queued_requests + 1 > options_.max_queued_requests_per_peer) {
      return past("max_queued_requests_per_peer", options_.max_queued_requests_per_peer,
                  conn.queued_requests, 1, " requests");
    }
    if (queued_requests_ + 1 > options_.max_queued_requests) {
      return past("max_queued_requests", options_.max_queued_requests, queued_requests_, 1,
                  " requests");
    }
    ++conn.queued_requests;
    ++queued_requests_;
  }
  conn.inflight_bytes += held.bytes;
  inflight_bytes_ += held.bytes;
  return std::string();
}

void TensorPipeAgent::release_inflight(Connection& conn, const Held& held) {
  MutexLock lock(mutex_);
  release_inflight_locked(conn, held);
}

void TensorPipeAgent::release_inflight_locked(Connection& conn, const Held& held) {
  conn.inflight_bytes -= std::min(conn.inflight_bytes, held.bytes);
  inflight_bytes_ -= std::min(inflight_bytes_, held.bytes);
  if (held.request) {
    conn.queued_requests -= std::min<size_t>(conn.queued_requests, 1);
    queued_requests_ -= std::min<size_t>(queued_requests_, 1);
  }
}

void TensorPipeAgent::refuse_busy(const std::shared_ptr<Connection>& conn, uint64_t request_id,
                                  const std::string& why, bool close_after) {
  busy_refusals_.fetch_add(1, std::memory_order_relaxed);
  GRADWIRE_LOG(kDebug) << "rpc worker " << self_.describe() << ": refused request " << request_id
                       << " from " << conn->peer.describe() << ": " << why;
  Response reply;
  reply.id = request_id;
  reply.result = ErrorReply{ErrorKind::kBusy, why, self_.name, /*rejected=*/true};
  std::shared_ptr<tp::Pipe> pipe = conn->pipe;
  write(conn, encode(Envelope{std::move(reply)}), [pipe, close_after](const std::string&) {
    if (close_after) close_pipe(pipe);
  });
  if (close_after) return;
  // The message had no separate tensor data: complete its (empty) read and go on.
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;
  conn->pipe->read(tp::Allocation{}, [weak, conn](const tp::Error& error) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      self->on_connection_error(conn, error.what());
      return;
    }
    self->read_next(conn);
  });
}

void TensorPipeAgent::request_done(const Link& link, size_t held_bytes) {
  MutexLock lock(mutex_);
  // Every Link this agent serves from is one of its Connections.
  release_inflight_locked(const_cast<Connection&>(static_cast<const Connection&>(link)),
                          Held{held_bytes, /*request=*/true});
  --active_handlers_;
  idle_cv_.notify_all();
}

}  // namespace gradwire::rpc::detail

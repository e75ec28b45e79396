// TCPStoreServer's connections: accept and refusal, reads and framing, replies and their
// flush, back-pressure, the turn budget, handshake and slow-client deadlines, and drops.
#include "tcp_store_server_impl.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "gradwire/core/logging.h"

namespace gradwire::c10d {

using store_server::kFrameHeader;
using store_server::kRequestWork;
using store_server::kTurnWork;
using store_server::uv_message;

namespace {

std::string format_address(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port,
              sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = addr.ss_family == AF_INET6;
  return (v6 ? "[" : "") + std::string(host) + (v6 ? "]:" : ":") + port;
}

}  // namespace

void TCPStoreServer::Impl::on_connection(uv_stream_t* listener, int status) {
  Impl* self = static_cast<Impl*>(listener->data);
  if (status < 0) {
    GRADWIRE_LOG(kWarning) << self->tag() << "accept failed: " << uv_message(status);
    return;
  }
  self->accept_one();
}

void TCPStoreServer::Impl::accept_one() {
  auto* c = new Connection();
  c->server = this;
  c->serial = next_serial_++;
  uv_tcp_init(&loop_, &c->handle);
  c->handle.data = c;
  const int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                           reinterpret_cast<uv_stream_t*>(&c->handle));
  if (rc != 0) {
    GRADWIRE_LOG(kWarning) << tag() << "accept failed: " << uv_message(rc);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
             [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
    return;
  }
  uv_tcp_nodelay(&c->handle, 1);
  sockaddr_storage addr{};
  int len = sizeof(addr);
  if (uv_tcp_getpeername(&c->handle, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    c->peer = format_address(addr);
  } else {
    c->peer = "?";
  }
  if (connections_.size() >= options_.max_connections) {
    refuse_connection(c);
    return;
  }
  connections_.insert(c);
  num_clients_.fetch_add(1, std::memory_order_relaxed);
  c->accepted_ms = uv_now(&loop_);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&handshake_timer_)) == 0) {
    // Checked a few times per timeout; the deadline is never early, at most a period late.
    const uint64_t period =
        std::max<uint64_t>(static_cast<uint64_t>(options_.handshake_timeout.count()) / 4, 1);
    uv_timer_start(&handshake_timer_, &Impl::on_handshake_timer, period, period);
  }
  GRADWIRE_LOG(kDebug) << tag() << "client " << c->serial << " (" << c->peer << ") connected";
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
}

void TCPStoreServer::Impl::refuse_connection(Connection* c) {
  num_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string why = "refused client " + std::to_string(c->serial) + " (" + c->peer +
                          "): " + std::to_string(connections_.size()) +
                          " connections are open, the limit (max_connections)";
  if (drops_.note(why)) {
    log_.log(LogLevel::kWarning, tag() + why + " (further drops are summarised every 10 s)");
  }
  // What the client sent so far is read and dropped, so that closing sends an orderly end
  // of stream rather than a reset that could overtake the reply.
  uv_os_fd_t fd = -1;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c->handle), &fd) == 0) {
    char scratch[256];
    for (int i = 0; i < 16 && ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; ++i) {
    }
  }
  std::string frame;
  FrameWriter w(frame);
  w.begin(static_cast<uint8_t>(Reply::kLimit), 0);
  w.u8(static_cast<uint8_t>(Limit::kConnections));
  w.u64(options_.max_connections);
  w.str("the store has " + std::to_string(connections_.size()) +
        " connections open, its limit max_connections = " +
        std::to_string(options_.max_connections) + "; try again later");
  w.end();
  uv_buf_t buf = uv_buf_init(frame.data(), static_cast<unsigned>(frame.size()));
  uv_try_write(reinterpret_cast<uv_stream_t*>(&c->handle), &buf, 1);
  c->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
           [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
}

void TCPStoreServer::Impl::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  Impl* self = static_cast<Connection*>(handle->data)->server;
  // One buffer serves every read: reads are handled to completion inside on_read.
  buf->base = self->read_buffer_;
  buf->len = sizeof(self->read_buffer_);
}

void TCPStoreServer::Impl::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  Impl* self = c->server;
  if (c->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF && c->hello_seen && !c->hello_done) {
      self->disconnect(c,
                       "authentication failed: the client left without proving that it "
                       "knows this store's secret",
                       /*refused=*/true);
    } else if (nread == UV_EOF && c->in.empty()) {
      GRADWIRE_LOG(kDebug) << self->tag() << "client " << c->serial << " (" << c->peer
                           << ") disconnected";
      self->close_connection(c);
    } else if (nread == UV_EOF) {
      self->disconnect(c, "connection closed in the middle of a frame (" +
                              std::to_string(c->in.size()) + " bytes received)");
    } else {
      self->disconnect(c, "read failed: " + uv_message(static_cast<int>(nread)));
    }
  } else if (nread > 0) {
    self->consume(c, buf->base, static_cast<size_t>(nread));
  }
  self->flush_dirty();
}

void TCPStoreServer::Impl::consume(Connection* c, const char* data, size_t size) {
  // Frames are parsed straight from the read buffer; only what is left when the loop stops
  // (a partial frame, or the rest of the read when the connection was paused) is copied,
  // into c->in, to be handled by the next read or when the connection resumes.
  const char* p = data;
  size_t avail = size;
  bool carried = !c->in.empty();
  if (carried) {
    if (size > 0) c->in.append(data, size);
    p = c->in.data();
    avail = c->in.size();
  }
  size_t used = 0;
  while (!c->paused && !c->yielded && avail - used >= proto::kLengthBytes) {
    const auto* frame = reinterpret_cast<const uint8_t*>(p + used);
    const uint32_t len = proto::load_u32(frame);
    const uint64_t limit = c->hello_done ? frame_limit_ : proto::kMaxHandshakeFrame;
    if (len < proto::kMinFrame || len > limit) {
      disconnect(c, "frame length " + std::to_string(len) + " outside [" +
                        std::to_string(proto::kMinFrame) + ", " + std::to_string(limit) + "]" +
                        (c->hello_done ? "" : " before the handshake"));
      return;
    }
    if (avail - used < proto::kLengthBytes + len) break;
    const size_t replied = c->out.size();
    if (!handle_frame(c, frame + proto::kLengthBytes, len) || c->closing) return;
    used += proto::kLengthBytes + len;
    charge(c, kRequestWork + proto::kLengthBytes + len +
                  (c->out.size() > replied ? c->out.size() - replied : 0));
  }
  if (carried) {
    c->in.erase(0, used);
    if (c->in.empty() && c->in.capacity() > (size_t{1} << 20)) c->in.shrink_to_fit();
  } else if (used < avail) {
    c->in.assign(p + used, avail - used);
  }
}

bool TCPStoreServer::Impl::handle_frame(Connection* c, const uint8_t* frame, size_t size) {
  FrameReader r(frame, size);
  const uint8_t op = r.u8();
  const uint32_t id = r.u32();
  try {
    if (!c->hello_done) {
      return c->hello_seen ? handle_auth(c, op, id, r) : handle_hello(c, op, id, r);
    }
    if (request_hook_) request_hook_(op);
    return handle_request(c, op, id, r);
  } catch (const std::bad_alloc&) {
    // Whatever this request had built for its reply goes with the connection.
    disconnect(c, std::string("out of memory while handling ") +
                      (c->hello_done ? "request " + std::to_string(id) : "the handshake"));
  } catch (const std::exception& e) {
    disconnect(c,
               std::string("internal error while handling ") +
                   (c->hello_done ? "request " + std::to_string(id) : "the handshake") + ": " +
                   e.what(),
               /*refused=*/!c->hello_done);
  }
  return false;
}

bool TCPStoreServer::Impl::room_for(Connection* c, uint32_t id, uint64_t payload) {
  if (kFrameHeader + payload - proto::kLengthBytes > frame_limit_) {
    reply_limit(c, id, Limit::kReplyBytes, frame_limit_,
                "the reply would be " + std::to_string(kFrameHeader + payload) +
                    " bytes, over the store's frame limit (max_frame) of " +
                    std::to_string(frame_limit_) +
                    " bytes; ask for fewer or smaller values per request");
    return false;
  }
  if (c->unsent() + kFrameHeader + payload > options_.unsent_high_water_bytes + frame_limit_) {
    disconnect(c,
               "does not read its replies: " + std::to_string(c->unsent()) +
                   " bytes unsent and a reply of " + std::to_string(kFrameHeader + payload) +
                   " more would pass unsent_high_water_bytes (" +
                   std::to_string(options_.unsent_high_water_bytes) + ") plus a frame",
               false, Limit::kUnsentReplies);
    return false;
  }
  return true;
}

proto::FrameWriter TCPStoreServer::Impl::reply(Connection* c, Reply kind, uint32_t id) {
  FrameWriter w(c->out);
  w.begin(static_cast<uint8_t>(kind), id);
  return w;
}

void TCPStoreServer::Impl::end_reply(Connection* c, FrameWriter& w) {
  w.end();
  if (!c->dirty) {
    c->dirty = true;
    dirty_.push_back(c);
  }
  if (!c->paused && c->unsent() > options_.unsent_high_water_bytes) pause(c);
}

void TCPStoreServer::Impl::reply_error(Connection* c, uint32_t id, ErrorKind kind,
                                       const std::string& message) {
  FrameWriter w = reply(c, Reply::kError, id);
  w.u8(static_cast<uint8_t>(kind));
  w.str(message);
  end_reply(c, w);
}

void TCPStoreServer::Impl::reply_limit(Connection* c, uint32_t id, Limit limit, uint64_t value,
                                       const std::string& message) {
  FrameWriter w = reply(c, Reply::kLimit, id);
  w.u8(static_cast<uint8_t>(limit));
  w.u64(value);
  w.str(message);
  end_reply(c, w);
}

void TCPStoreServer::Impl::pause(Connection* c) {
  if (c->paused || c->closing) return;
  c->paused = true;
  c->paused_ms = uv_now(&loop_);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  paused_.insert(c);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&slow_timer_)) == 0 && !stopping_) {
    const uint64_t period =
        std::max<uint64_t>(static_cast<uint64_t>(options_.slow_client_timeout.count()) / 4, 1);
    uv_timer_start(&slow_timer_, &Impl::on_slow_timer, period, period);
  }
}

void TCPStoreServer::Impl::resume(Connection* c) {
  if (!c->paused || c->closing) return;
  c->paused = false;
  paused_.erase(c);
  read_again(c);
}

void TCPStoreServer::Impl::read_again(Connection* c) {
  if (c->paused || c->yielded || c->closing) return;
  // The frames read before the pause or the yield come first; they may hold it again.
  consume(c, nullptr, 0);
  if (!c->paused && !c->yielded && !c->closing) {
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
  }
}

void TCPStoreServer::Impl::charge(Connection* c, uint64_t work) {
  if (c->work_at < turn_) {
    c->work_at = turn_;
    c->work = 0;
  }
  c->work += work;
  if (c->work < kTurnWork || c->yielded || c->closing) return;
  c->yielded = true;
  c->yield_at = turn_;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  yielded_.push_back(c);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&turn_idle_)) == 0 && !stopping_) {
    uv_idle_start(&turn_idle_, [](uv_idle_t*) {});
  }
}

void TCPStoreServer::Impl::on_turn_check(uv_check_t* check) {
  Impl* self = static_cast<Impl*>(check->data);
  if (!self->yielded_.empty()) {
    // Those that yielded before this turn's poll are served again: every connection that
    // was ready in that poll has had its turn since. Those that yielded in it wait for the
    // next poll. A resumed one has a fresh budget, for the rest of this callback and the
    // next turn together.
    std::vector<Connection*> due;
    std::vector<Connection*> later;
    for (Connection* c : self->yielded_)
      (c->yield_at < self->turn_ ? due : later).push_back(c);
    self->yielded_.swap(later);
    for (Connection* c : due) {
      // Closed by another connection's request meanwhile: still allocated (handles are
      // freed in close callbacks, after this one), and done with.
      if (c->closing) continue;
      c->yielded = false;
      c->work_at = self->turn_ + 1;
      c->work = 0;
      self->read_again(c);
    }
    if (self->yielded_.empty()) uv_idle_stop(&self->turn_idle_);
    self->flush_dirty();
  }
  ++self->turn_;
}

void TCPStoreServer::Impl::on_slow_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  const auto limit = static_cast<uint64_t>(self->options_.slow_client_timeout.count());
  std::vector<Connection*> slow;
  for (Connection* c : self->paused_) {
    if (now - c->paused_ms >= limit) slow.push_back(c);
  }
  for (Connection* c : slow) {
    self->disconnect(c,
                     "does not read its replies: they passed unsent_high_water_bytes (" +
                         std::to_string(self->options_.unsent_high_water_bytes) +
                         ") and have not drained below half of it within " + std::to_string(limit) +
                         " ms (slow_client_timeout; " + std::to_string(c->unsent()) +
                         " bytes still unsent)",
                     false, Limit::kUnsentReplies);
  }
  if (self->paused_.empty()) uv_timer_stop(&self->slow_timer_);
  self->flush_dirty();
}

void TCPStoreServer::Impl::flush_dirty() {
  do {
    // The changes of this loop turn reach the journal before any reply about them leaves.
    if (journal_ && journal_->pending()) {
      std::string error;
      if (journal_->flush(live_keys(), &error)) {
        if (journal_failing_) {
          log_.log(LogLevel::kWarning,
                   tag() + "journal '" + options_.journal + "' is written again");
        }
        journal_failing_ = false;
      } else if (!journal_failing_) {
        // Retried on every loop turn; meanwhile writes are refused (refuse_write).
        journal_failing_ = true;
        log_.log(LogLevel::kError, tag() + "writing the journal '" + options_.journal +
                                       "' failed: " + error +
                                       "; writes are refused until it is written again");
      }
    }
    // Connections closed during this callback are still allocated (handles are freed in
    // close callbacks, which run after this one), and flush() skips them.
    std::vector<Connection*> batch;
    batch.swap(dirty_);
    std::vector<Connection*> drained;
    for (Connection* c : batch) {
      c->dirty = false;
      flush(c);
      if (c->paused && !c->closing && c->unsent() <= options_.unsent_high_water_bytes / 2) {
        drained.push_back(c);
      }
    }
    // Resuming handles the frames they hold, which may make more replies (and changes).
    for (Connection* c : drained)
      resume(c);
  } while (!dirty_.empty());
  // A journal that failed is retried on every turn, changes or not, so that writes are
  // accepted again as soon as it can be written.
  if (journal_ && journal_failing_) {
    std::string error;
    if (journal_->flush(live_keys(), &error)) {
      journal_failing_ = false;
      log_.log(LogLevel::kWarning, tag() + "journal '" + options_.journal + "' is written again");
    }
  }
}

void TCPStoreServer::Impl::flush(Connection* c) {
  if (c->closing || c->out.empty()) return;
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  size_t sent = 0;
  // uv_try_write refuses (UV_EAGAIN) while earlier writes are queued, keeping order.
  uv_buf_t buf = uv_buf_init(c->out.data(), static_cast<unsigned>(c->out.size()));
  const int rc = uv_try_write(stream, &buf, 1);
  if (rc > 0) {
    sent = static_cast<size_t>(rc);
  } else if (rc != UV_EAGAIN) {
    c->out.clear();
    disconnect(c, "write failed: " + uv_message(rc));
    return;
  }
  if (sent == c->out.size()) {
    c->out.clear();
    if (c->out.capacity() > (size_t{1} << 20)) c->out.shrink_to_fit();
    return;
  }
  auto* req = new WriteRequest();
  req->data.assign(c->out, sent);
  c->out.clear();
  c->out.shrink_to_fit();
  req->req.data = c;
  c->queued += req->data.size();
  uv_buf_t rest = uv_buf_init(req->data.data(), static_cast<unsigned>(req->data.size()));
  const int wrc = uv_write(&req->req, stream, &rest, 1, &Impl::on_write);
  if (wrc != 0) {
    c->queued -= req->data.size();
    delete req;
    disconnect(c, "write failed: " + uv_message(wrc));
  }
}

void TCPStoreServer::Impl::on_write(uv_write_t* req, int status) {
  auto* wr = reinterpret_cast<WriteRequest*>(req);
  auto* c = static_cast<Connection*>(req->data);
  c->queued -= wr->data.size();
  delete wr;
  if (c->closing) return;
  Impl* self = c->server;
  if (status < 0 && status != UV_ECANCELED) {
    self->disconnect(c, "write failed: " + uv_message(status));
  } else if (c->paused && c->unsent() <= self->options_.unsent_high_water_bytes / 2) {
    self->resume(c);
  }
  self->flush_dirty();
}

void TCPStoreServer::Impl::disconnect(Connection* c, const std::string& why, bool refused,
                                      std::optional<Limit> limit) {
  if (c->closing) return;
  num_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string what = "client " + std::to_string(c->serial) + " (" + c->peer + "): " + why;
  if (drops_.note(what)) {
    log_.log(LogLevel::kWarning,
             tag() + "dropping " + what + " (further drops are summarised every 10 s)");
  } else if (!stopping_ && uv_is_active(reinterpret_cast<uv_handle_t*>(&log_timer_)) == 0) {
    const auto wait =
        std::chrono::ceil<std::chrono::milliseconds>(drops_.due() - EventSummary::Clock::now());
    uv_timer_start(&log_timer_, &Impl::on_log_timer,
                   static_cast<uint64_t>(std::max<int64_t>(wait.count(), 0)), 0);
  }
  // Best effort: tell the client why before closing (ignored if the kernel will not take it).
  std::string frame;
  FrameWriter w(frame);
  if (limit) {
    w.begin(static_cast<uint8_t>(Reply::kLimit), 0);
    w.u8(static_cast<uint8_t>(*limit));
    w.u64(options_.unsent_high_water_bytes);
  } else {
    w.begin(static_cast<uint8_t>(refused ? Reply::kRefused : Reply::kError), 0);
    if (!refused) w.u8(static_cast<uint8_t>(ErrorKind::kStore));
  }
  w.str("server dropped the connection: " + why);
  w.end();
  uv_buf_t buf = uv_buf_init(frame.data(), static_cast<unsigned>(frame.size()));
  uv_try_write(reinterpret_cast<uv_stream_t*>(&c->handle), &buf, 1);
  close_connection(c, /*reset=*/limit == Limit::kUnsentReplies);
}

void TCPStoreServer::Impl::on_handshake_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  const auto limit = static_cast<uint64_t>(self->options_.handshake_timeout.count());
  std::vector<Connection*> late;
  bool waiting = false;
  for (Connection* c : self->connections_) {
    if (c->hello_done || c->closing) continue;
    if (now - c->accepted_ms >= limit) {
      late.push_back(c);
    } else {
      waiting = true;
    }
  }
  for (Connection* c : late) {
    self->disconnect(c, "did not complete the handshake within " + std::to_string(limit) + " ms" +
                            (c->hello_seen ? " (no proof of the secret)" : ""));
  }
  if (!waiting) uv_timer_stop(&self->handshake_timer_);
  self->flush_dirty();
}

void TCPStoreServer::Impl::on_log_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  if (auto line = self->drops_.summarise("connections")) {
    self->log_.log(LogLevel::kWarning, self->tag() + "dropped " + *line);
  }
}

void TCPStoreServer::Impl::close_connection(Connection* c, bool reset) {
  if (c->closing) return;
  c->closing = true;
  while (!c->waiters.empty())
    remove_waiter(*c->waiters.begin());
  paused_.erase(c);
  if (c->yielded) std::erase(yielded_, c);
  connections_.erase(c);
  num_clients_.fetch_sub(1, std::memory_order_relaxed);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  auto on_closed = [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); };
  if (!reset || uv_tcp_close_reset(&c->handle, on_closed) != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), on_closed);
  }
  rearm_timer();
}

}  // namespace gradwire::c10d

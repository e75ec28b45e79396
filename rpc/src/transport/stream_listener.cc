#include "transport/stream_listener.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <tensorpipe/transport/error.h>

#include <cerrno>

#include "transport/stream_connection.h"

namespace gradwire::rpc::transport::detail {

void ListenerImpl::start() {
  if (fd_ < 0) return;
  if (core_->closed) {
    close_now();
    return;
  }
  core_->listeners.insert(shared_from_this());
  std::weak_ptr<ListenerImpl> weak = weak_from_this();
  core_->reactor.add(fd_, EPOLLIN, [weak](uint32_t) {
    if (auto self = weak.lock()) self->on_accept();
  });
}

void ListenerImpl::accept(Listener::accept_callback_fn fn) {
  auto self = shared_from_this();
  auto holder = std::make_shared<Listener::accept_callback_fn>(std::move(fn));
  if (!core_->run_on_loop([self, holder] {
        self->waiters_.push_back(std::move(*holder));
        self->deliver();
      })) {
    (*holder)(
        tp::Error(std::make_shared<tp::transport::ListenerClosedError>(), "gradwire transport", 0),
        nullptr);
  }
}

void ListenerImpl::close() {
  auto self = shared_from_this();
  core_->run_on_loop([self] { self->close_now(); });
}

void ListenerImpl::close_now() {
  if (closed_) return;
  closed_ = true;
  if (fd_ >= 0) {
    core_->reactor.remove(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  core_->listeners.erase(shared_from_this());
  std::deque<std::shared_ptr<ConnImpl>> ready;
  ready.swap(ready_);
  for (auto& c : ready)
    c->fail(closed_error());
  deliver();
}

void ListenerImpl::deliver() {
  while (!waiters_.empty()) {
    if (closed_ || !error_.empty()) {
      Listener::accept_callback_fn fn = std::move(waiters_.front());
      waiters_.pop_front();
      if (!error_.empty()) {
        fn(make_error(error_), nullptr);
      } else {
        fn(tp::Error(std::make_shared<tp::transport::ListenerClosedError>(), "gradwire transport",
                     0),
           nullptr);
      }
      continue;
    }
    if (ready_.empty()) return;
    Listener::accept_callback_fn fn = std::move(waiters_.front());
    waiters_.pop_front();
    std::shared_ptr<ConnImpl> conn = std::move(ready_.front());
    ready_.pop_front();
    fn(tp::Error::kSuccess, std::make_shared<ConnHandle>(std::move(conn)));
  }
}

void ListenerImpl::on_accept() {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const int fd =
        ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: stop accepting for a moment (level-triggered epoll
      // would spin), then go on; the listener itself never fails.
      const int err = errno;
      core_->log.log(LogLevel::kWarning, core_->prefix() + "accepting a connection failed: " +
                                             errno_text(err) + "; retrying in 100 ms");
      core_->reactor.modify(fd_, 0);
      std::weak_ptr<ListenerImpl> weak = weak_from_this();
      core_->reactor.add_timer(Reactor::Clock::now() + std::chrono::milliseconds(100), [weak] {
        auto self = weak.lock();
        if (self && !self->closed_) self->core_->reactor.modify(self->fd_, EPOLLIN);
      });
      return;
    }
    const std::string peer = format_address(core_->options.family, from, from_len);
    if (const std::string why = core_->check_peer_user(fd); !why.empty()) {
      ::close(fd);
      core_->note_refused(peer, why);
      continue;
    }
    if (handshaking_ >= core_->options.max_handshaking) {
      ::close(fd);
      core_->note_refused(
          peer, "too many connections in their handshake (" + std::to_string(handshaking_) + ")");
      continue;
    }
    if (!unix_socket(core_->options.family)) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    auto conn = std::make_shared<ConnImpl>(core_, fd, ConnImpl::Role::kServer, peer);
    conn->set_listener_address(addr_);
    ++handshaking_;
    std::weak_ptr<ListenerImpl> weak = weak_from_this();
    conn->start(false, 0, [weak](const std::shared_ptr<ConnImpl>& c, bool ok) {
      auto self = weak.lock();
      if (self == nullptr) return;
      --self->handshaking_;
      if (!ok) return;
      if (self->closed_) {
        c->fail(closed_error());
        return;
      }
      self->ready_.push_back(c);
      self->deliver();
    });
  }
}

}  // namespace gradwire::rpc::transport::detail

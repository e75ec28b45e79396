// A listener of gradwire's stream transports (ListenerImpl) and the handle TensorPipe holds
// (ListenerHandle). It accepts connections on the loop thread, refuses what must not even
// begin a handshake (too many in their handshake at once; on "local" and "unix", a peer
// process of another user), and hands a connection to TensorPipe's accept callbacks only
// once its handshake gate (stream_connection.h) has let it through.
//
// Thread-safety: state is the loop thread's; accept and close may be called from any thread
// and defer to the loop.
#pragma once

#include <unistd.h>

#include <tensorpipe/transport/listener.h>

#include <deque>
#include <memory>
#include <string>

#include "transport/stream_core.h"

namespace gradwire::rpc::transport::detail {

using tp::transport::Listener;

class ListenerImpl : public std::enable_shared_from_this<ListenerImpl> {
 public:
  ListenerImpl(std::shared_ptr<Core> core, int fd, std::string addr, std::string error)
      : core_(std::move(core)), fd_(fd), addr_(std::move(addr)), error_(std::move(error)) {}
  ~ListenerImpl() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& addr() const { return addr_; }

  // Loop thread.
  void start();

  void accept(Listener::accept_callback_fn fn);

  void close();

  // Loop thread.
  void close_now();

 private:
  void deliver();

  void on_accept();

  std::shared_ptr<Core> core_;
  int fd_;
  const std::string addr_;
  const std::string error_;
  // Loop thread only.
  bool closed_ = false;
  int handshaking_ = 0;
  std::deque<std::shared_ptr<ConnImpl>> ready_;
  std::deque<Listener::accept_callback_fn> waiters_;
};

class ListenerHandle final : public Listener {
 public:
  explicit ListenerHandle(std::shared_ptr<ListenerImpl> impl) : impl_(std::move(impl)) {}
  ~ListenerHandle() override { impl_->close(); }
  void accept(accept_callback_fn fn) override { impl_->accept(std::move(fn)); }
  std::string addr() const override { return impl_->addr(); }
  void setId(std::string /*id*/) override {}
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<ListenerImpl> impl_;
};

}  // namespace gradwire::rpc::transport::detail

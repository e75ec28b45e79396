// TCPStoreServer: its options, and the set-up and stop of the loop that serves the store
// (see tcp_store_server_impl.h for the loop's design and the files that hold its parts).
#include "tcp_store_server_impl.h"

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/auth.h"
#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"

namespace gradwire::c10d {

using store_server::uv_message;

void TCPStoreServerOptions::validate() const {
  GRADWIRE_CHECK_ARG(max_key_bytes >= 1 && max_key_bytes <= (16u << 20))
      << "TCPStoreServerOptions.max_key_bytes = " << max_key_bytes
      << " is invalid: expected 1 .. 16 MiB";
  GRADWIRE_CHECK_ARG(max_value_bytes >= 1 && max_value_bytes <= (1u << 30))
      << "TCPStoreServerOptions.max_value_bytes = " << max_value_bytes
      << " is invalid: expected 1 .. 1 GiB";
  GRADWIRE_CHECK_ARG(max_keys_per_request >= 1)
      << "TCPStoreServerOptions.max_keys_per_request must be at least 1";
  GRADWIRE_CHECK_ARG(max_pending_waits_per_client >= 1)
      << "TCPStoreServerOptions.max_pending_waits_per_client must be at least 1";
  GRADWIRE_CHECK_ARG(listen_backlog >= 1)
      << "TCPStoreServerOptions.listen_backlog = " << listen_backlog << " must be positive";
  GRADWIRE_CHECK_ARG(handshake_timeout.count() > 0)
      << "TCPStoreServerOptions.handshake_timeout = " << handshake_timeout.count()
      << " ms must be positive";
  GRADWIRE_CHECK_ARG(max_parked_waits >= 1)
      << "TCPStoreServerOptions.max_parked_waits must be at least 1";
  GRADWIRE_CHECK_ARG(max_parked_bytes >= 1)
      << "TCPStoreServerOptions.max_parked_bytes must be at least 1";
  GRADWIRE_CHECK_ARG(max_connections >= 1)
      << "TCPStoreServerOptions.max_connections must be at least 1";
  GRADWIRE_CHECK_ARG(max_keys >= 1) << "TCPStoreServerOptions.max_keys must be at least 1";
  GRADWIRE_CHECK_ARG(max_total_bytes >= 1)
      << "TCPStoreServerOptions.max_total_bytes must be at least 1";
  GRADWIRE_CHECK_ARG(unsent_high_water_bytes >= 2)
      << "TCPStoreServerOptions.unsent_high_water_bytes = " << unsent_high_water_bytes
      << " must be at least 2";
  GRADWIRE_CHECK_ARG(slow_client_timeout.count() > 0)
      << "TCPStoreServerOptions.slow_client_timeout = " << slow_client_timeout.count()
      << " ms must be positive";
  GRADWIRE_CHECK_ARG(journal_buffer_bytes >= 1)
      << "TCPStoreServerOptions.journal_buffer_bytes must be at least 1";
}

TCPStoreServer::Impl::Impl(TCPStoreServerOptions options)
    : options_(std::move(options)),
      frame_limit_(proto::frame_limit(options_.max_key_bytes, options_.max_value_bytes)) {
  options_.validate();
  secret_ = resolve_secret(options_.secret);
  if (!options_.journal.empty()) open_journal();
  const int rc = uv_loop_init(&loop_);
  if (rc != 0) GRADWIRE_THROW(StoreError) << "TCPStoreServer: uv_loop_init: " << uv_message(rc);
  init_handles();
  const std::string where = listen();
  sockaddr_storage addr{};
  int len = sizeof(addr);
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  GRADWIRE_LOG(kInfo) << tag() << "listening (" << where << ")";
  if (secret_.empty()) {
    GRADWIRE_LOG(kInfo) << tag()
                        << "no secret is set (TCPStoreServerOptions::secret, GRADWIRE_SECRET or "
                           "GRADWIRE_SECRET_FILE): anyone who can reach this port can read and "
                           "write every key";
  }
  start_loop_thread();
}

void TCPStoreServer::Impl::init_handles() {
  uv_tcp_init(&loop_, &listener_);
  listener_.data = this;
  uv_timer_init(&loop_, &timer_);
  timer_.data = this;
  uv_timer_init(&loop_, &log_timer_);
  log_timer_.data = this;
  uv_timer_init(&loop_, &handshake_timer_);
  handshake_timer_.data = this;
  uv_timer_init(&loop_, &slow_timer_);
  slow_timer_.data = this;
  uv_check_init(&loop_, &turn_check_);
  turn_check_.data = this;
  uv_check_start(&turn_check_, &Impl::on_turn_check);
  uv_idle_init(&loop_, &turn_idle_);
  turn_idle_.data = this;
  uv_async_init(&loop_, &stop_, &Impl::on_stop);
  stop_.data = this;
}

void TCPStoreServer::Impl::fail_setup(const std::string& what) {
  uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&log_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&handshake_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&slow_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&turn_check_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&turn_idle_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_), nullptr);
  uv_run(&loop_, UV_RUN_DEFAULT);
  uv_loop_close(&loop_);
  GRADWIRE_THROW(NetworkError) << "TCPStoreServer: " << what;
}

std::string TCPStoreServer::Impl::listen() {
  if (options_.listen_fd >= 0) {
    const std::string where = "listen fd " + std::to_string(options_.listen_fd);
    int rc = uv_tcp_open(&listener_, options_.listen_fd);
    if (rc != 0) fail_setup("cannot adopt " + where + ": " + uv_message(rc));
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), options_.listen_backlog,
                   &Impl::on_connection);
    if (rc != 0) fail_setup("cannot listen on " + where + ": " + uv_message(rc));
    return where;
  }
  const std::string port_text = std::to_string(options_.port);
  std::vector<std::string> hosts;
  if (options_.bind_host.empty()) {
    hosts = {"::", "0.0.0.0"};  // dual-stack where IPv6 exists, IPv4 otherwise
  } else {
    hosts = {options_.bind_host};
  }
  std::string errors;
  const bool bound = bind_first(hosts, port_text, errors);
  const std::string where =
      (options_.bind_host.empty() ? std::string("*") : options_.bind_host) + ":" + port_text;
  if (!bound) fail_setup("cannot listen on " + where + ":" + errors);
  return where;
}

bool TCPStoreServer::Impl::bind_first(const std::vector<std::string>& hosts,
                                      const std::string& port_text, std::string& errors) {
  for (const std::string& host : hosts) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
    if (gai != 0) {
      errors += " " + host + ": " + gai_strerror(gai) + ";";
      continue;
    }
    bool bound = false;
    for (addrinfo* ai = res; ai != nullptr && !bound; ai = ai->ai_next) {
      int rc = uv_tcp_bind(&listener_, ai->ai_addr, 0);
      if (rc == 0) {
        // libuv reports some bind errors only at listen time.
        rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), options_.listen_backlog,
                       &Impl::on_connection);
      }
      if (rc == 0) {
        bound = true;
      } else {
        errors += " " + host + ":" + port_text + ": " + uv_message(rc) + ";";
        // A failed bind leaves the handle unusable for another address family.
        uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
        uv_run(&loop_, UV_RUN_NOWAIT);
        uv_tcp_init(&loop_, &listener_);
        listener_.data = this;
      }
    }
    freeaddrinfo(res);
    if (bound) return true;
  }
  return false;
}

void TCPStoreServer::Impl::start_loop_thread() {
  thread_ = std::thread([this] {
    // libuv writes with write(), which raises SIGPIPE when a client has gone; the default
    // action would kill the whole process. Blocked in this thread only (the disposition
    // is the application's), the signal stays pending here and write() returns EPIPE.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
  });
}

TCPStoreServer::Impl::~Impl() {
  uv_async_send(&stop_);
  thread_.join();
  const int rc = uv_loop_close(&loop_);
  GRADWIRE_CHECK(rc == 0) << "TCPStoreServer: loop still had handles at close: " << uv_message(rc);
}

void TCPStoreServer::Impl::on_stop(uv_async_t* async) {
  Impl* self = static_cast<Impl*>(async->data);
  self->stopping_ = true;
  std::vector<Connection*> conns(self->connections_.begin(), self->connections_.end());
  for (Connection* c : conns)
    self->close_connection(c);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->listener_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->log_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->handshake_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->slow_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->turn_check_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->turn_idle_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr);
  if (auto line = self->drops_.summarise("connections")) {
    self->log_.log(LogLevel::kWarning, self->tag() + "dropped " + *line);
  }
  GRADWIRE_LOG(kInfo) << self->tag() << "stopped; closed " << conns.size() << " connection(s)";
}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TCPStoreServer::~TCPStoreServer() = default;

uint16_t TCPStoreServer::port() const {
  return impl_->port();
}

int64_t TCPStoreServer::num_clients() const {
  return impl_->num_clients();
}

uint64_t TCPStoreServer::num_refused() const {
  return impl_->num_refused();
}

bool TCPStoreServer::authenticated() const {
  return impl_->authenticated();
}

void TCPStoreServerTestPeer::set_request_hook(TCPStoreServer& server,
                                              std::function<void(uint8_t op)> hook) {
  server.impl_->set_request_hook(std::move(hook));
}

}  // namespace gradwire::c10d

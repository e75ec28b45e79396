// The TensorPipe agent: AgentOptions checks and the address it listens on.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include <algorithm>

#include "gradwire/c10d/rendezvous.h"
#include "gradwire/core/logging.h"
#include "text.h"

namespace gradwire::rpc::detail {

namespace {

// AgentOptions' checks, in the order they are made; each throws InvalidArgument prefixed by
// `who`.
void check_timeouts_and_threads(const std::string& who, const AgentOptions& o) {
  if (o.rpc_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::rpc_timeout must be > 0, got " +
                          ms_text(o.rpc_timeout));
  }
  if (o.join_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::join_timeout must be > 0, got " +
                          ms_text(o.join_timeout));
  }
  if (o.num_worker_threads < 1 || o.num_worker_threads > 1024) {
    throw InvalidArgument(who + "AgentOptions::num_worker_threads must be in [1, 1024], got " +
                          std::to_string(o.num_worker_threads));
  }
  if (o.mpt_lanes < 1 || o.mpt_lanes > 64) {
    throw InvalidArgument(who + "AgentOptions::mpt_lanes must be in [1, 64], got " +
                          std::to_string(o.mpt_lanes));
  }
  if (o.direct_copy_threads < 0 || o.direct_copy_threads > 64) {
    throw InvalidArgument(who + "AgentOptions::direct_copy_threads must be in [0, 64], got " +
                          std::to_string(o.direct_copy_threads));
  }
}

void check_transports_and_channels(const std::string& who, const AgentOptions& o) {
  for (const std::string& t : o.transports) {
    if (t != "tcp" && t != "local" && t != "unix" && t != "shm" && t != "uv") {
      throw InvalidArgument(who + "unknown transport '" + t +
                            "' (known: tcp, local, unix, shm, uv)");
    }
  }
  for (const std::string& c : o.channels) {
    if (c != "xth" && c != "ring" && c != "cma" && c != "mpt" && c != "mpt_uv" && c != "basic") {
      throw InvalidArgument(who + "unknown channel '" + c +
                            "' (known: xth, ring, cma, mpt, mpt_uv, basic)");
    }
  }
  if (std::find(o.transports.begin(), o.transports.end(), "tcp") == o.transports.end() &&
      std::find(o.transports.begin(), o.transports.end(), "uv") == o.transports.end()) {
    throw InvalidArgument(who +
                          "AgentOptions::transports needs \"tcp\" (or TensorPipe's \"uv\"): it "
                          "carries the first connection to every peer");
  }
  // A pipe's later connections (over local or unix) are admitted only for the peer that its
  // first connection's handshake proved, which gradwire's tcp carries and TensorPipe's uv
  // does not.
  const auto wanted = [&](const char* t) {
    return std::find(o.transports.begin(), o.transports.end(), t) != o.transports.end();
  };
  if ((wanted("local") || wanted("unix")) && !wanted("tcp")) {
    throw InvalidArgument(who +
                          "AgentOptions::transports has \"local\" or \"unix\" without "
                          "\"tcp\": their connections are admitted only for the peer that the "
                          "first connection's handshake proved, which \"uv\" does not carry");
  }
}

void check_spin_and_limits(const std::string& who, const AgentOptions& o) {
  if (o.transport_spin.count() < 0 || o.transport_spin > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin must be in [0, 1 s], got " +
                          std::to_string(o.transport_spin.count()) + " us");
  }
  if (o.transport_spin_backoff.count() < 0 || o.transport_spin_backoff > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin_backoff must be in [0, 1 s], got " +
                          std::to_string(o.transport_spin_backoff.count()) + " us");
  }
  if (o.transport_spin_awaiting.count() < 0 ||
      o.transport_spin_awaiting > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin_awaiting must be in [0, 1 s], got " +
                          std::to_string(o.transport_spin_awaiting.count()) + " us");
  }
  if (o.handshake_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::handshake_timeout must be > 0, got " +
                          ms_text(o.handshake_timeout));
  }
  if (o.channels.empty()) {
    throw InvalidArgument(who + "AgentOptions::channels is empty: tensors need a channel");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, size_t>{"max_inflight_bytes_per_peer",
                                       o.max_inflight_bytes_per_peer},
        {"max_inflight_bytes", o.max_inflight_bytes},
        {"max_queued_requests_per_peer", o.max_queued_requests_per_peer},
        {"max_queued_requests", o.max_queued_requests}}) {
    if (value == 0) throw InvalidArgument(who + "AgentOptions::" + name + " must be > 0");
  }
  if (o.close_timeout.count() < 0) {
    throw InvalidArgument(who + "AgentOptions::close_timeout must be >= 0, got " +
                          ms_text(o.close_timeout));
  }
}

// Elastic membership: join_running needs an elastic group and excludes rejoin; the
// capacity holds the group it forms.
void check_membership(const std::string& who, const AgentOptions& o, int world_size) {
  if (o.max_workers < 1 || o.max_workers > 65536) {
    throw InvalidArgument(who + "max_workers must be in [1, 65536], got " +
                          std::to_string(o.max_workers));
  }
  if (o.join_running && !o.elastic) {
    throw InvalidArgument(who + "join_running joins an elastic group: set elastic as well " +
                          "(GRADWIRE_RPC_ELASTIC=1)");
  }
  if (o.join_running && o.rejoin) {
    throw InvalidArgument(who + "join_running (a new worker) and rejoin (a lost worker's " +
                          "replacement) exclude each other");
  }
  if (o.elastic && !o.join_running && world_size > o.max_workers) {
    throw InvalidArgument(who + "an elastic group of world size " + std::to_string(world_size) +
                          " does not fit max_workers = " + std::to_string(o.max_workers));
  }
}

}  // namespace

void TensorPipeAgent::validate_options() const {
  const std::string who = "rpc agent " + self_.describe() + ": ";
  check_timeouts_and_threads(who, options_);
  check_transports_and_channels(who, options_);
  check_spin_and_limits(who, options_);
  GroupDirectory::validate_device_maps(who, options_.device_maps);
  check_membership(who, options_, world_size_);
}

std::string TensorPipeAgent::resolve_host() const {
  if (!options_.host.empty()) return options_.host;
  // GRADWIRE_RPC_HOST, GRADWIRE_SOCKET_IFNAME, else the interface that routes to the
  // rendezvous master (core/net.h).
  const std::string master = c10d::master_host(store_.get());
  try {
    return net::advertised_host(master);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("rpc agent " + self_.describe() +
                          ": cannot choose the address to listen on: " + e.what());
  } catch (const NetworkError& e) {
    throw NetworkError(
        "rpc agent " + self_.describe() +
        ": cannot choose the address to listen on (toward the master '" + master +
        "'; set AgentOptions::host, GRADWIRE_RPC_HOST or GRADWIRE_SOCKET_IFNAME): " + e.what());
  }
}

}  // namespace gradwire::rpc::detail

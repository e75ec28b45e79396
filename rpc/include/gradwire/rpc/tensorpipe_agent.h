// The TensorPipe agent: the RpcAgent that moves requests and replies over TensorPipe.
//
// Start-up: the agent listens on every registered transport (AgentOptions::transports),
// publishes its name, address and CUDA device count under "rpc/<n>/" in the store (n: how
// many groups this rank has started on the store, so a later group never reads an earlier
// one's records), claims its name (names are
// unique) and waits, up to join_timeout, until every one of the world_size workers has
// done the same. It connects to a peer on first use; TensorPipe then moves the connection
// to the fastest transport both ends share (shm on one host) and picks a channel per
// tensor (xth within a process, cma between processes of one host, mpt_uv or basic
// across hosts).
//
// Messages: one TensorPipe message per request or reply. Its metadata is the Protobuf
// envelope (envelope.h), which TensorPipe delivers with the message's descriptor, so the
// receiver checks it against EnvelopeLimits and allocates each tensor with its final
// dtype and shape before any tensor byte arrives; tensors are sent zero-copy from
// contiguous CPU storage and received straight into fresh tensors. CUDA tensors are
// staged through host memory and moved to the device the sender's device map names.
// A message that does not parse gets an error reply when its request id can be read, and
// otherwise closes the connection; neither disturbs other connections.
//
// Thread-safety, errors and shutdown: see RpcAgent (agent.h).
//
// Example:
//   auto store = std::make_shared<c10d::TCPStore>(...);
//   auto agent = rpc::make_tensorpipe_agent("worker0", 0, 2, store, {.rpc_timeout = 10s});
#pragma once

#include <memory>
#include <string>

#include "gradwire/rpc/agent.h"

namespace gradwire::rpc {

// Builds the agent without joining the group: install handlers, interceptors and
// attachments, then call start(), which throws what make_tensorpipe_agent throws below.
// Throws InvalidArgument for a bad name (1 to 128 characters from [A-Za-z0-9_.:-]), rank or
// world size.
std::shared_ptr<RpcAgent> create_tensorpipe_agent(std::string name, int rank, int world_size,
                                                  std::shared_ptr<c10d::Store> store,
                                                  AgentOptions options = {});

// create_tensorpipe_agent, then start(). Throws InvalidArgument for a bad name, rank, world
// size or option, a name another rank has taken, or a device map naming a device either
// end lacks; TimeoutError naming the ranks missing after join_timeout; NetworkError when
// it cannot listen.
std::shared_ptr<RpcAgent> make_tensorpipe_agent(std::string name, int rank, int world_size,
                                                std::shared_ptr<c10d::Store> store,
                                                AgentOptions options = {});

}  // namespace gradwire::rpc
